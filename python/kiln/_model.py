"""kiln.Model: a llama or qwen2 GGUF file (kiln_gguf_open, mmap) and the decoder graphs kiln builds
from it (kiln_model_build), with greedy generation that streams token ids. The file stays mapped
while any graph or plan made from it lives (they borrow its weights). Must not tokenize: ids in,
ids out (the file's token strings are in `token_text`).
"""
from __future__ import annotations

import ctypes as C
from typing import Iterator, Sequence

import numpy as np

from . import _capi
from ._errors import error
from ._graph import Graph, dtype_id
from ._plan import Context, default_context

lib = _capi.lib


class Model:
    """A GGUF model file. Model.load(path) opens it; `info` is what kiln read from its metadata."""

    def __init__(self, ctx: Context, handle: int, path: str):
        self.ctx, self._h, self.path = ctx, handle, path
        mi = _capi.ModelInfo()
        s = lib.kiln_model_info_get(self._h, C.byref(mi))
        if s:
            msg = ctx.last_error
            self.close()
            raise error(s, msg, "kiln_model_info_get")
        self.info = {"arch": mi.arch.decode(), "n_layer": mi.n_layer, "hidden": mi.hidden, "n_head": mi.n_head,
                     "n_kv_head": mi.n_kv_head, "head_dim": mi.head_dim, "ffn": mi.ffn, "n_vocab": mi.n_vocab,
                     "n_ctx_train": mi.n_ctx_train, "theta": mi.theta, "eps": mi.eps,
                     "rope": "neox" if mi.rope == 1 else "normal", "qkv_bias": bool(mi.qkv_bias),
                     "tied_output": bool(mi.tied_output), "weight_bytes": mi.weight_bytes,
                     "out_bias": bool(mi.out_bias), "ffn_bias": bool(mi.ffn_bias), "qk_norm": bool(mi.qk_norm),
                     "rope_scale": mi.rope_scale, "rope_freqs": bool(mi.rope_freqs),
                     "sliding_window": mi.sliding_window, "attn_softcap": mi.attn_softcap,
                     "final_softcap": mi.final_softcap, "swa_pattern": mi.swa_pattern, "swa_theta": mi.swa_theta,
                     "attn_scale": mi.attn_scale, "embd_scale": bool(mi.embd_scale),
                     "post_norms": bool(mi.post_norms), "gelu_gate": bool(mi.gelu_gate),
                     "fused_qkv": bool(mi.fused_qkv), "n_rot": mi.n_rot,
                     "longrope": bool(mi.longrope), "n_ctx_orig": mi.n_ctx_orig,
                     "rope_attn_factor": mi.rope_attn_factor, "yarn": bool(mi.yarn),
                     "n_expert": mi.n_expert, "n_expert_used": mi.n_expert_used, "ffn_exp": mi.ffn_exp,
                     "ffn_shexp": mi.ffn_shexp, "expert_norm": bool(mi.expert_norm)}

    @classmethod
    def load(cls, path: str, ctx: Context | None = None) -> "Model":
        """kiln_gguf_open + kiln_model_info_get: errors name the byte offset, key or tensor."""
        ctx = ctx or default_context()
        h = C.c_void_p()
        s = lib.kiln_gguf_open(ctx.handle, str(path).encode(), C.byref(h))
        if s:
            raise error(s, ctx.last_error, "kiln_gguf_open")
        return cls(ctx, h.value, str(path))

    def close(self):
        if getattr(self, "_h", None):
            lib.kiln_gguf_close(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def graph(self, max_ctx: int = 0, max_tok: int = 0, kv_dtype="f32", n_layers: int = 0, logits: bool = False,
              last_only: bool = False, moe_dense: bool = False) -> Graph:
        """kiln_model_build: the decoder graph. Symbols n_tok, n_kv; inputs ids, pos i32 [n_tok] (and
        last i32 [1] with last_only); states k<L>, v<L>; outputs next i32 (argmax per token) and
        logits f32 with logits=True. 0 sizes take kiln's defaults. moe_dense: mixtures of experts run
        every expert on every token (the A/B form; by default only the routed ones run)."""
        o = _capi.ModelOptions(max_ctx, max_tok, dtype_id(kv_dtype), n_layers, logits, last_only, moe_dense)
        h = C.c_void_p()
        s = lib.kiln_model_build(self._h, C.byref(o), C.byref(h))
        if s:
            raise error(s, self.ctx.last_error, "kiln_model_build")
        g = Graph(h.value)
        g._keep.append(self)  # the weights are the file's mapping
        g.inputs = ["ids", "pos"] + (["last"] if last_only else [])
        g.outputs = ["next"] + (["logits"] if logits else [])
        layers = n_layers or self.info["n_layer"]
        g.states = [f"{kv}{i}" for i in range(layers) for kv in "kv"]
        return g

    def generate(self, ids: Sequence[int], n: int = 16, backend: str | None = None, max_ctx: int = 0) -> Iterator[int]:
        """Greedy generation: prefills `ids` (one run), then decodes one token per run, yielding each
        new id as soon as it is computed (n in all; the first comes from the prefill)."""
        ids = [int(i) for i in ids]
        if not ids or n < 1:
            raise ValueError("kiln: generate needs at least one prompt id and n >= 1")
        need = len(ids) + n - 1
        max_ctx = max_ctx or need
        if need > max_ctx:
            raise ValueError(f"kiln: {len(ids)} prompt ids + {n} tokens need a context of {need}, max_ctx is {max_ctx}")
        g = self.graph(max_ctx=max_ctx, max_tok=len(ids), last_only=True)
        with self.ctx.compile(g, backend=backend) as plan:
            g.close()
            nxt = np.empty(1, np.int32)
            tok = np.asarray(ids, np.int32)
            pos = np.arange(len(ids), dtype=np.int32)
            last = np.array([len(ids) - 1], np.int32)
            for step in range(n):
                plan.run({"ids": tok, "pos": pos, "last": last}, {"n_tok": len(tok), "n_kv": int(pos[-1]) + 1},
                         out={"next": nxt}, read=())
                yield int(nxt[0])
                if step + 1 < n:
                    tok = nxt.copy()
                    pos = np.array([pos[-1] + 1], np.int32)
                    last = np.zeros(1, np.int32)
