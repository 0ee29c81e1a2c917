"""kiln.Model: a tiny random GGUF model written by the build's gen_model ($KILN_GEN_MODEL), its
metadata, and greedy generation streaming ids, checked against an independent path: the whole
sequence recomputed on the ref backend each step, next id = numpy argmax of the f32 logits."""
import os
import subprocess

import numpy as np
import pytest

import kiln

GEN = os.environ.get("KILN_GEN_MODEL")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    if not GEN or not os.access(GEN, os.X_OK):
        pytest.skip("KILN_GEN_MODEL (the build's gen_model) not set: ctest sets it")
    path = tmp_path_factory.mktemp("m") / "tiny.gguf"
    subprocess.run([GEN, "--arch", "llama", "--shape", "tiny", "--layers", "2", "--wtype", "q8_0", "--seed", "3",
                    str(path)], check=True, capture_output=True)
    return str(path)


def test_info_and_errors(ctx, model_path, tmp_path):
    with kiln.Model.load(model_path, ctx) as m:
        assert m.info["arch"] == "llama" and m.info["n_layer"] == 2 and m.info["hidden"] == 256
        assert m.info["n_vocab"] == 64 and m.info["head_dim"] == 64
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00\x01\x00\x00\x00")
    with pytest.raises(kiln.ParseError, match="byte"):
        kiln.Model.load(str(bad), ctx)
    with pytest.raises(kiln.FileError):
        kiln.Model.load(str(tmp_path / "none.gguf"), ctx)


def test_generate_streams_the_greedy_ids(ctx, model_path, backend):
    m = kiln.Model.load(model_path, ctx)
    prompt, n = [1, 2, 3], 6
    got = []
    for tok in m.generate(prompt, n, backend=backend):
        got.append(tok)  # ids arrive one at a time
    assert len(got) == n
    seq = list(prompt)
    g = m.graph(max_ctx=16, max_tok=16, logits=True)
    plan = ctx.compile(g, backend="ref")
    for _ in range(n):  # independent: every step rewrites the cache rows it reads; argmax in numpy
        k = len(seq)
        out = plan.run({"ids": np.array(seq, np.int32), "pos": np.arange(k, dtype=np.int32)}, {"n_tok": k, "n_kv": k})
        seq.append(int(np.argmax(out["logits"][-1].astype(np.float64))))
    assert got == seq[len(prompt):], (got, seq[len(prompt):])
