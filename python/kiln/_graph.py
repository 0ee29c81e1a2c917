"""kiln.Graph: the graph builder of kiln.h (kiln_graph_*, kiln_sym, leaves, ops), one method per C
call, with the same names, operands and rules. A builder error raises at once (kiln keeps it in
the graph, so later calls on that graph raise too). Must not compile or run anything.
"""
from __future__ import annotations

import ctypes as C
import re
from typing import Iterable, Sequence, Union

import numpy as np

from . import _arrays, _capi
from ._errors import error

lib = _capi.lib


def dtype_id(t) -> int:
    """kiln dtype number of a name ("f32", "q4_k"), a numpy dtype (float32, float16, int32) or a number."""
    if isinstance(t, int) and 0 <= t < _capi.DTYPE_COUNT:
        return t
    if isinstance(t, str) and t.lower() in _capi.DTYPES:
        return _capi.DTYPES.index(t.lower())
    try:
        name = _arrays.KILN_OF.get(np.dtype(t))
    except TypeError:
        name = None
    if name is None:
        raise ValueError(f"kiln: unknown dtype {t!r} (kiln dtypes: {', '.join(_capi.DTYPES)})")
    return _capi.DTYPES.index(name)


class Sym(int):
    """A symbolic dimension (kiln_sym): an int (negative, as kiln encodes it) usable in dims, with
    its `name` and upper bound `max`. Its value is bound at each run."""

    def __new__(cls, value: int, name: str, max: int):  # noqa: A002 - mirrors the C parameter
        obj = super().__new__(cls, value)
        obj.name, obj.max = name, max
        return obj

    def __repr__(self):
        return f"Sym({self.name!r}, max={self.max})"


Dim = Union[int, Sym]


class Node:
    """A node of a Graph (kiln_node). `a + b`, `a * b` and `a * 2.0` build add, mul and scale."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: "Graph", nid: int):
        self.graph, self.id = graph, nid

    def __repr__(self):
        return f"Node(#{self.id & 0xFFFFFFFF})"

    def __add__(self, other: "Node") -> "Node":
        return self.graph.add(self, other)

    def __mul__(self, other) -> "Node":
        if isinstance(other, (int, float)):
            return self.graph.scale(self, float(other))
        return self.graph.mul(self, other)

    __rmul__ = __mul__


def _dims(dims: Sequence[Dim]):
    dims = list(dims)
    if len(dims) > _capi.MAX_RANK:
        raise ValueError(f"kiln: rank {len(dims)} is over kiln's {_capi.MAX_RANK}")
    return len(dims), (C.c_int64 * max(1, len(dims)))(*[int(d) for d in dims])


class Graph:
    """A DAG of ops (kiln_graph). Build with the methods below, mark outputs with `output`, then
    `Context.compile` it. Graphs are independent of contexts; one graph must not be built on from
    two threads at once. `inputs`, `outputs`, `states` and `symbols` list the interface's names."""

    def __init__(self, _handle: int | None = None, _interface_text: str | None = None):
        if _handle is None:
            h = C.c_void_p()
            s = lib.kiln_graph_new(C.byref(h))
            if s:
                raise error(s, "", "kiln_graph_new")
            _handle = h.value
        self._h = _handle
        self._keep: list = []  # arrays whose memory kiln borrows (WEIGHT_BORROW)
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.states: list[str] = []
        self.symbols: dict[str, Sym] = {}
        if _interface_text is not None:
            self._read_interface(_interface_text)

    def _read_interface(self, text: str):
        """Interface names of a graph made from .kg text (kiln has no listing call)."""
        for line in text.splitlines():
            m = re.match(r"\s*(sym|input|state|output)\s+(\S+)(?:\s+(\S+))?", line)
            if not m:
                continue
            kind, name, arg = m.groups()
            if kind == "sym":
                self.symbols[name] = Sym(0, name, int(arg) if arg and arg.isdigit() else 0)
            else:
                lst = {"input": self.inputs, "state": self.states, "output": self.outputs}[kind]
                if name not in lst:
                    lst.append(name)

    def close(self):
        """Frees the graph (plans compiled from it stay valid)."""
        if getattr(self, "_h", None):
            lib.kiln_graph_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def handle(self) -> int:
        if not self._h:
            raise ValueError("kiln: the graph was closed")
        return self._h

    # ------------------------------------------------------------ state of the builder
    @property
    def status(self) -> int:
        """The first builder error's kiln_status (0 if none)."""
        return lib.kiln_graph_status(self.handle)

    @property
    def error(self) -> str:
        """The first builder error's message ("" if none)."""
        return (lib.kiln_graph_error(self.handle) or b"").decode()

    def __len__(self) -> int:
        return lib.kiln_graph_size(self.handle)

    def _node(self, nid: int, call: str) -> Node:
        if nid == _capi.NODE_NONE:
            raise error(self.status or 1, self.error, call)
        return Node(self, nid)

    def _nid(self, x) -> int:
        if x is None:
            return _capi.NODE_NONE
        if not isinstance(x, Node):
            raise TypeError(f"kiln: expected a Node, got {type(x).__name__}")
        return x.id

    def hash(self) -> str:
        """kiln_graph_hash: XXH3-128 of the structure (not weights, not names), 32 hex digits."""
        buf = C.create_string_buffer(33)
        s = lib.kiln_graph_hash(self.handle, buf)
        if s:
            raise error(s, self.error, "kiln_graph_hash")
        return buf.value.decode()

    def to_kg(self) -> str:
        """kiln_kg_print: the graph as .kg text (copied weights are written as hex)."""
        out = C.c_void_p()
        s = lib.kiln_kg_print(self.handle, C.byref(out))
        if s:
            raise error(s, self.error, "kiln_kg_print")
        return _capi.take_string(out)

    # ------------------------------------------------------------ symbols and leaves
    def sym(self, name: str, max: int) -> Sym:  # noqa: A002
        """kiln_sym: a symbolic dimension with an upper bound (1 <= max), bound at each run in
        [1, max]. Asking again for the same name with the same max returns the same symbol."""
        v = lib.kiln_sym(self.handle, name.encode(), int(max))
        if v >= 0:
            raise error(self.status or 1, self.error, "kiln_sym")
        s = Sym(v, name, int(max))
        self.symbols[name] = s
        return s

    def input(self, name: str, dtype, shape: Sequence[Dim]) -> Node:
        """kiln_input: a tensor bound at each run. name is unique among leaves and outputs."""
        r, d = _dims(shape)
        n = self._node(lib.kiln_input(self.handle, name.encode(), dtype_id(dtype), r, d), "kiln_input")
        self.inputs.append(name)
        return n

    def weight(self, name: str, data, dtype=None, shape: Sequence[int] | None = None, copy: bool = True) -> Node:
        """kiln_weight: a constant tensor from a host array (numpy, buffer protocol, DLPack on the
        CPU). dtype defaults to the array's (float32, float16, int32); bf16 and the GGUF block
        formats take raw bytes (uint8/uint16 arrays) with dtype and shape given. copy=False borrows
        the memory (no copy): the graph and every plan compiled from it keep the array alive."""
        v = _arrays.view(data, name)
        if v.device:
            raise ValueError(f"kiln: weight '{name}' must be host memory (kiln uploads weights itself)")
        if dtype is None and (v.dtype is None or v.dtype.startswith("numpy")):
            raise ValueError(f"kiln: weight '{name}': kiln has no dtype for this array's "
                             f"({v.dtype or 'raw bytes'}); give dtype= (and shape= for raw bytes)")
        t = dtype_id(dtype if dtype is not None else v.dtype)
        dims = list(shape) if shape is not None else list(v.shape)
        r, d = _dims(dims)
        rows = int(np.prod(dims[:-1], dtype=np.int64)) if len(dims) > 1 else 1
        want = rows * lib.kiln_row_bytes(t, int(dims[-1])) if dims else 0
        if want and v.nbytes != want:
            raise ValueError(f"kiln: weight '{name}': {v.nbytes} bytes given, {_capi.DTYPES[t]} {dims} needs {want}")
        mode = _capi.WEIGHT_COPY if copy else _capi.WEIGHT_BORROW
        n = self._node(lib.kiln_weight(self.handle, name.encode(), t, r, d, v.ptr, mode), "kiln_weight")
        if not copy:
            self._keep.append(v.owner)
        return n

    def weight_random(self, name: str, dtype, shape: Sequence[int], seed: int = 1, scale: float = 1.0) -> Node:
        """kiln_weight_random: reproducible values uniform in [-scale, scale], quantized to dtype."""
        r, d = _dims(shape)
        return self._node(lib.kiln_weight_random(self.handle, name.encode(), dtype_id(dtype), r, d, int(seed),
                                                 float(scale)), "kiln_weight_random")

    def state(self, name: str, dtype, shape: Sequence[int]) -> Node:
        """kiln_state: a persistent tensor owned by each plan (zero at compile), e.g. a KV cache
        [n_kv_heads, max_ctx, head_dim]; f32, f16, bf16 or i32."""
        r, d = _dims(shape)
        n = self._node(lib.kiln_state(self.handle, name.encode(), dtype_id(dtype), r, d), "kiln_state")
        self.states.append(name)
        return n

    def output(self, x: Node, name: str) -> Node:
        """kiln_output: marks x as an output bound (or read) by name at run. Returns x."""
        s = lib.kiln_output(self.handle, self._nid(x), name.encode())
        if s:
            raise error(s, self.error, "kiln_output")
        self.outputs.append(name)
        return x

    def name(self, x: Node, name: str) -> Node:
        """kiln_name: a name for messages and plans (not part of the hash). Returns x."""
        s = lib.kiln_name(self.handle, self._nid(x), name.encode())
        if s:
            raise error(s, self.error, "kiln_name")
        return x

    def pin(self, x: Node, backend: str | None) -> Node:
        """kiln_pin: places x's kernel on a backend ("cpu", ...); None clears. Returns x."""
        s = lib.kiln_pin(self.handle, self._nid(x), backend.encode() if backend else None)
        if s:
            raise error(s, self.error, "kiln_pin")
        return x

    # ------------------------------------------------------------ ops (docstrings from kiln.h)
    def matmul(self, x: Node, w: Node) -> Node:
        """y[.., n] = sum_k x[.., k] * w[n, k]. x f32/f16/bf16 [..., K]; w [N, K] of any float or
        block dtype (K a multiple of the block). y is f32 [..., N]."""
        return self._node(lib.kiln_matmul(self.handle, self._nid(x), self._nid(w)), "kiln_matmul")

    def add(self, a: Node, b: Node) -> Node:
        """a + b; b's dims equal a's trailing dims (b broadcast over a's leading dims)."""
        return self._node(lib.kiln_add(self.handle, self._nid(a), self._nid(b)), "kiln_add")

    def mul(self, a: Node, b: Node) -> Node:
        """a * b; b's dims equal a's trailing dims (b broadcast over a's leading dims)."""
        return self._node(lib.kiln_mul(self.handle, self._nid(a), self._nid(b)), "kiln_mul")

    def scale(self, x: Node, s: float) -> Node:
        """x * s."""
        return self._node(lib.kiln_scale(self.handle, self._nid(x), float(s)), "kiln_scale")

    def silu(self, x: Node) -> Node:
        """x * sigmoid(x)."""
        return self._node(lib.kiln_silu(self.handle, self._nid(x)), "kiln_silu")

    def gelu(self, x: Node) -> Node:
        """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
        return self._node(lib.kiln_gelu(self.handle, self._nid(x)), "kiln_gelu")

    def tanh(self, x: Node) -> Node:
        """Hyperbolic tangent (gemma's final-logit soft-capping: cap * tanh(logits / cap))."""
        return self._node(lib.kiln_tanh(self.handle, self._nid(x)), "kiln_tanh")

    def swiglu(self, gate: Node, up: Node) -> Node:
        """silu(gate) * up; equal shapes."""
        return self._node(lib.kiln_swiglu(self.handle, self._nid(gate), self._nid(up)), "kiln_swiglu")

    def rms_norm(self, x: Node, w: Node | None = None, eps: float = 1e-6) -> Node:
        """x / sqrt(mean(x^2 over the last dim) + eps) * w; w [D] or None."""
        return self._node(lib.kiln_rms_norm(self.handle, self._nid(x), self._nid(w), float(eps)), "kiln_rms_norm")

    def layer_norm(self, x: Node, w: Node | None = None, b: Node | None = None, eps: float = 1e-5) -> Node:
        """(x - mean) / sqrt(var + eps) * w + b over the last dim; w, b [D] or None."""
        return self._node(lib.kiln_layer_norm(self.handle, self._nid(x), self._nid(w), self._nid(b), float(eps)),
                          "kiln_layer_norm")

    def softmax(self, x: Node) -> Node:
        """Softmax over the last dim."""
        return self._node(lib.kiln_softmax(self.handle, self._nid(x)), "kiln_softmax")

    def rope(self, x: Node, pos: Node, mode: str = "normal", theta: float = 10000.0) -> Node:
        """Rotary embedding. x [n_tok, n_head, head_dim] (head_dim even); pos i32 [n_tok] absolute
        positions; angle of pair i = pos * theta^(-2i/head_dim). mode "normal" rotates pairs
        (2i, 2i+1) (GGUF llama files); "neox" rotates (i, i + d/2) (Hugging Face checkpoints, qwen2)."""
        if mode not in _capi.ROPE_MODES:
            raise ValueError(f"kiln: rope mode {mode!r} is not 'normal' or 'neox'")
        return self._node(lib.kiln_rope(self.handle, self._nid(x), self._nid(pos), _capi.ROPE_MODES[mode],
                                        float(theta)), "kiln_rope")

    def attention(self, q: Node, k: Node, v: Node, n_kv: Dim, scale: float = 0.0, softcap: float = 0.0,
                  window: int = 0) -> Node:
        """Causal grouped-query attention over a cache. q [n_tok, n_head, head_dim]; k, v states (or
        kv_scatter results) [n_kv_head, max_ctx, head_dim]; n_kv (a symbol or constant <= max_ctx)
        valid cache rows. The n_tok queries sit at positions n_kv - n_tok .. n_kv - 1. Scores are
        scaled by `scale` (0 = 1/sqrt(head_dim)), then soft-capped to softcap * tanh(s / softcap)
        (0: none); with a window, position p sees keys p - window + 1 .. p only (0: none).
        y is f32 [n_tok, n_head, head_dim]."""
        return self._node(lib.kiln_attention_ext(self.handle, self._nid(q), self._nid(k), self._nid(v), int(n_kv),
                                                 float(scale), float(softcap), int(window)), "kiln_attention_ext")

    def paged_attention(self, q: Node, k: Node, v: Node, pos: Node, seqs: Node, blocks: Node, block: int,
                        scale: float = 0.0, parents: Node | None = None) -> Node:
        """Paged attention over a ragged batch of sequences (kiln_paged_attention): q [n_tok, n_head,
        head_dim] holds the new tokens of all sequences packed as rows; k, v are pools (states or
        kv_scatter results) [n_kv_head, n_blocks * block, head_dim]. Bound per step: pos i32 [n_tok]
        (each token's position), seqs i32 [n_seq, 2] (each sequence's first row and KV length),
        blocks i32 [n_seq, max_blocks] (key j of sequence s at slot blocks[s][j // block] * block +
        j % block). Each token sees its own sequence's keys 0 .. its position. block: a power of two
        in [1, 1024]. With parents i32 [n_tok] it is a speculative tree step
        (kiln_paged_attention_tree): each draft's parent among its sequence's drafts (-1: a root),
        positions = KV length - new tokens + depth, keys (and kv_scatter slots) in row order, and a
        draft sees the cached keys and its ancestors' and its own. kiln_run refuses bad metadata
        (a bad tree included) naming it. y is f32 [n_tok, n_head, head_dim]."""
        if parents is None:
            return self._node(lib.kiln_paged_attention(self.handle, self._nid(q), self._nid(k), self._nid(v), self._nid(pos),
                                                       self._nid(seqs), self._nid(blocks), int(block), float(scale)),
                              "kiln_paged_attention")
        return self._node(lib.kiln_paged_attention_tree(self.handle, self._nid(q), self._nid(k), self._nid(v), self._nid(pos),
                                                        self._nid(seqs), self._nid(blocks), self._nid(parents), int(block),
                                                        float(scale)), "kiln_paged_attention_tree")

    def kv_scatter(self, state: Node, rows: Node, pos: Node) -> Node:
        """Writes rows [n_tok, n_kv_head, head_dim] into a state [n_kv_head, max_ctx, head_dim] at
        positions pos i32 [n_tok]: state[h, pos[t], :] = rows[t, h, :]. Returns the updated state."""
        return self._node(lib.kiln_kv_scatter(self.handle, self._nid(state), self._nid(rows), self._nid(pos)),
                          "kiln_kv_scatter")

    def get_rows(self, table: Node, ids: Node) -> Node:
        """Embedding lookup: table [V, D] of a float or block dtype, ids i32 [n] -> f32 [n, D]."""
        return self._node(lib.kiln_get_rows(self.handle, self._nid(table), self._nid(ids)), "kiln_get_rows")

    def all_reduce(self, x: Node) -> Node:
        """Sum of x (f32) over the devices of a split plan; the identity on one device."""
        return self._node(lib.kiln_all_reduce(self.handle, self._nid(x)), "kiln_all_reduce")

    def all_gather(self, x: Node) -> Node:
        """Slices of x (f32) held by the devices of a split plan joined as [devices, ...]; [1, ...] on one device."""
        return self._node(lib.kiln_all_gather(self.handle, self._nid(x)), "kiln_all_gather")

    def argmax(self, x: Node) -> Node:
        """Index of the largest value over the last dim (first on ties): x [..., N] -> i32 [...]."""
        return self._node(lib.kiln_argmax(self.handle, self._nid(x)), "kiln_argmax")

    def moe_route(self, x: Node, k: int, norm: bool = False) -> Node:
        """Router weights of a mixture of experts: softmax over x's last dim (E experts, f32), the k largest
        kept (over their sum with norm), zeros elsewhere: f32 [..., E]."""
        return self._node(lib.kiln_moe_route(self.handle, self._nid(x), int(k), bool(norm)), "kiln_moe_route")

    def scale_rows(self, x: Node, w: Node, col: int) -> Node:
        """Row r of x (f32 [..., D]) times w[r, col] (w f32 [..., C], the same leading dims)."""
        return self._node(lib.kiln_scale_rows(self.handle, self._nid(x), self._nid(w), int(col)), "kiln_scale_rows")

    def moe_matmul(self, x: Node, w: Node, r: Node, k: int, sum: bool = False) -> Node:
        """x times only the k routed experts of a stack w [E, N, K] (the k largest of r's row, r f32 [T, E]):
        x [T, K] or [T, k, K]; f32 [T, k, N] per slot, or [T, N] summed weighted by r with sum (kiln.h)."""
        return self._node(lib.kiln_moe_matmul(self.handle, self._nid(x), self._nid(w), self._nid(r), int(k), bool(sum)),
                          "kiln_moe_matmul")

    def cast(self, x: Node, dtype) -> Node:
        """Converts among f32, f16, bf16 and i32 (float to i32 rounds to nearest, ties to even)."""
        return self._node(lib.kiln_cast(self.handle, self._nid(x), dtype_id(dtype)), "kiln_cast")

    def reshape(self, x: Node, shape: Sequence[Dim]) -> Node:
        """Same elements, new dims (symbolic dims must appear in both, unchanged)."""
        r, d = _dims(shape)
        return self._node(lib.kiln_reshape(self.handle, self._nid(x), r, d), "kiln_reshape")

    def view(self, x: Node, shape: Sequence[int], offset: int = 0) -> Node:
        """A contiguous slice of x: `shape` elements starting at element `offset` (constant dims)."""
        r, d = _dims(shape)
        return self._node(lib.kiln_view(self.handle, self._nid(x), r, d, int(offset)), "kiln_view")

    def transpose(self, x: Node, d0: int, d1: int) -> Node:
        """Swaps dims d0 and d1."""
        return self._node(lib.kiln_transpose(self.handle, self._nid(x), int(d0), int(d1)), "kiln_transpose")

    def concat(self, a: Node, b: Node, axis: int) -> Node:
        """Joins a and b along `axis` (other dims equal, same dtype)."""
        return self._node(lib.kiln_concat(self.handle, self._nid(a), self._nid(b), int(axis)), "kiln_concat")


def graphs_keep(graphs: Iterable[Graph]) -> list:
    return [a for g in graphs for a in g._keep]
