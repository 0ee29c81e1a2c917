"""Graph.paged_attention (kiln_paged_attention, and with parents kiln_paged_attention_tree) on the
backend under test: a ragged batch over a pool of shuffled blocks written through kv_scatter's slots,
against numpy float64 computing each sequence alone (a tree step: each draft's path decoded one token
at a time), outputs poisoned and every element compared; bad metadata and bad trees refused naming
what is wrong, the plan usable after."""
import numpy as np
import pytest
from conftest import assert_close

import kiln

T_MAX, S_MAX, BLOCK = 64, 6, 16


def make_step(rng, new, prior, tree, hkv=2, hd=16, nb_spare=3):
    """Metadata, new rows and pools of one step; keys[s] = that sequence's keys by key index."""
    n_tok, mb = sum(new), max((p + n + BLOCK - 1) // BLOCK for p, n in zip(prior, new))
    nb = sum((p + n + BLOCK - 1) // BLOCK for p, n in zip(prior, new)) + nb_spare
    perm = rng.permutation(nb).astype(np.int32)
    st = {"pos": np.zeros(n_tok, np.int32), "slots": np.zeros(n_tok, np.int32), "parents": np.zeros(n_tok, np.int32),
          "seqs": np.zeros((len(new), 2), np.int32), "blocks": np.full((len(new), mb), -7, np.int32),
          "kr": rng.uniform(-1.5, 1.5, (n_tok, hkv, hd)).astype(np.float32),
          "vr": rng.uniform(-1, 2, (n_tok, hkv, hd)).astype(np.float32),
          "kpool": rng.uniform(-2, 2, (hkv, nb * BLOCK, hd)).astype(np.float32),
          "vpool": rng.uniform(-2, 2, (hkv, nb * BLOCK, hd)).astype(np.float32), "mb": mb}
    t0, nxt = 0, 0
    for s, (n, p) in enumerate(zip(new, prior)):
        k = (p + n + BLOCK - 1) // BLOCK
        st["blocks"][s, :k] = perm[nxt:nxt + k]
        nxt += k
        st["seqs"][s] = (t0, p + n)
        depth = []
        for i in range(n):
            par = (rng.integers(-1, i) if i else -1) if tree else i - 1  # a forest of drafts, or a chain
            depth.append(depth[par] + 1 if par >= 0 else 0)
            st["parents"][t0 + i] = par
            st["pos"][t0 + i] = p + depth[i]
            key = p + i  # storage order: the drafts' rows
            st["slots"][t0 + i] = st["blocks"][s, key // BLOCK] * BLOCK + key % BLOCK
        t0 += n
    return st


def reference(st, q, new, prior):
    """f64: each draft over its sequence's cached keys and its path's (ancestors', its own)."""
    kp, vp = st["kpool"].astype(np.float64), st["vpool"].astype(np.float64)
    kp[:, st["slots"]], vp[:, st["slots"]] = st["kr"].transpose(1, 0, 2), st["vr"].transpose(1, 0, 2)
    n_tok, H, hd = q.shape
    grp = H // kp.shape[0]
    y = np.zeros((n_tok, H, hd))
    for s, (n, p) in enumerate(zip(new, prior)):
        t0, bt = st["seqs"][s, 0], st["blocks"][s]
        for i in range(n):
            path, a = [], i
            while a >= 0:
                path.append(p + a)
                a = st["parents"][t0 + a]
            keys = list(range(p)) + path[::-1]
            slots = [bt[j // BLOCK] * BLOCK + j % BLOCK for j in keys]
            for h in range(H):
                K, V = kp[h // grp, slots], vp[h // grp, slots]
                sc = K @ q[t0 + i, h].astype(np.float64) / np.sqrt(hd)
                w = np.exp(sc - sc.max())
                y[t0 + i, h] = (w / w.sum()) @ V
    return y


def build(mb, nslots, tree, H=4, hkv=2, hd=16):
    g = kiln.Graph()
    T, S = g.sym("n_tok", T_MAX), g.sym("n_seq", S_MAX)
    q = g.input("q", "f32", [T, H, hd])
    kr, vr = g.input("kr", "f32", [T, hkv, hd]), g.input("vr", "f32", [T, hkv, hd])
    pos, slots = g.input("pos", "i32", [T]), g.input("slots", "i32", [T])
    seqs, blocks = g.input("seqs", "i32", [S, 2]), g.input("blocks", "i32", [S, mb])
    kp, vp = g.state("kpool", "f32", [hkv, nslots, hd]), g.state("vpool", "f32", [hkv, nslots, hd])
    ks, vs = g.kv_scatter(kp, kr, slots), g.kv_scatter(vp, vr, slots)
    par = g.input("parents", "i32", [T]) if tree else None
    g.output(g.paged_attention(q, ks, vs, pos, seqs, blocks, BLOCK, parents=par), "y")
    return g


def run(plan, st, q, tree):
    ins = {k: st[k] for k in ("kr", "vr", "pos", "slots", "seqs", "blocks")}
    ins["q"] = q
    if tree:
        ins["parents"] = st["parents"]
    y = np.full(q.shape, np.nan, np.float32)  # poisoned: a kernel that skips rows cannot pass
    plan.run(ins, {"n_tok": q.shape[0], "n_seq": st["seqs"].shape[0]}, out={"y": y})
    return y


@pytest.mark.parametrize("tree", [False, True])
def test_ragged_batch_and_draft_trees(ctx, backend, rng, tree):
    new, prior = [1, 17, 5, 9], [70, 0, 33, 130]
    st = make_step(rng, new, prior, tree)
    q = rng.uniform(-1.5, 1.5, (sum(new), 4, 16)).astype(np.float32)
    plan = ctx.compile(build(st["mb"], st["kpool"].shape[1], tree), backend=backend)
    plan.set_state("kpool", st["kpool"])
    plan.set_state("vpool", st["vpool"])
    assert "trees of drafts" in plan.explain() if tree else "trees of drafts" not in plan.explain()
    assert_close(run(plan, st, q, tree), reference(st, q, new, prior), "paged_attention")


def test_bad_trees_refused_plan_usable(ctx, backend, rng):
    new, prior = [6, 3], [20, 5]
    st = make_step(rng, new, prior, True)
    q = rng.uniform(-1.5, 1.5, (sum(new), 4, 16)).astype(np.float32)
    plan = ctx.compile(build(st["mb"], st["kpool"].shape[1], True), backend=backend)
    plan.set_state("kpool", st["kpool"])
    plan.set_state("vpool", st["vpool"])
    before = plan.state("kpool")
    for field, idx, value, words in [("parents", 4, 4, "parents[4] = 4"), ("parents", 2, -3, "parents[2] = -3"),
                                     ("pos", 0, 21, "pos[0]"), ("slots", 7, 10**6, "out of the pool")]:
        keep = st[field][idx]
        st[field][idx] = value
        with pytest.raises(kiln.BindingError, match=words.replace("[", r"\[")):
            run(plan, st, q, True)
        st[field][idx] = keep
        assert np.array_equal(plan.state("kpool"), before), f"{field}: the pool changed although the step was refused"
    assert_close(run(plan, st, q, True), reference(st, q, new, prior), "paged_attention")


def test_tree_builder_and_kg(ctx):
    g = build(4, 96, True)
    text = g.to_kg()
    assert " pos seqs blocks parents block=16 " in text
    with pytest.raises(kiln.DtypeError, match="parents has dtype f32"):
        g2 = kiln.Graph()
        T = g2.sym("n", 8)
        q = g2.input("q", "f32", [T, 2, 16])
        k = g2.state("k", "f16", [1, 64, 16])
        ii = g2.input("pos", "i32", [T])
        g2.paged_attention(q, k, k, ii, g2.input("seqs", "i32", [2, 2]), g2.input("blocks", "i32", [2, 4]), 16,
                           parents=g2.input("parents", "f32", [T]))
