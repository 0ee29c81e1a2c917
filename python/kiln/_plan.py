"""kiln.Context and kiln.Plan: contexts (backends, device profiles, check), compile, run with
zero-copy bindings, reads of outputs and states, and the plan's explanation and per-kernel costs.
A Plan keeps its Context and the memory it borrows alive. Must not hold process-wide state
beyond the lazily made default context.
"""
from __future__ import annotations

import ctypes as C
import json
import threading
import weakref
from typing import Mapping, Sequence

import numpy as np

from . import _arrays, _capi
from ._errors import UnsupportedError, error
from ._graph import Graph, dtype_id

lib = _capi.lib


def _profile_to_dict(p: _capi.DeviceProfile) -> dict:
    return {"peak_flops": {_capi.DTYPES[i]: p.peak_flops[i] for i in range(_capi.DTYPE_COUNT)},
            "mem_bw": p.mem_bw, "launch_s": p.launch_s, "h2d_bw": p.h2d_bw, "d2h_bw": p.d2h_bw,
            "xfer_latency_s": p.xfer_latency_s, "link_bw": p.link_bw, "link_latency_s": p.link_latency_s}


class Context:
    """A kiln context (kiln_ctx): the backends found at start, device profiles, the kernel cache.
    Plans keep their context alive. `backends` lists every backend kiln knows, present or not."""

    def __init__(self, n_threads: int = 0, cache_dir: str | None = None, quiet: bool = True):
        o = _capi.CtxOptions(n_threads, cache_dir.encode() if cache_dir else None, quiet)
        h = C.c_void_p()
        s = lib.kiln_ctx_new(C.byref(o), C.byref(h))
        if s:
            raise error(s, "", "kiln_ctx_new")
        self._h = h.value
        self._plans = weakref.WeakSet()  # closed before the context: kiln wants plans freed first

    def close(self):
        """Frees the context, after every plan made from it (they become unusable)."""
        if getattr(self, "_h", None):
            for p in list(self._plans):
                p.close()
            lib.kiln_ctx_free(self._h)
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
            raise ValueError("kiln: the context was closed")
        return self._h

    @property
    def last_error(self) -> str:
        """kiln_ctx_error: this thread's last failure on this context ("" if none)."""
        return (lib.kiln_ctx_error(self.handle) or b"").decode()

    def _check(self, s: int, call: str):
        if s:
            raise error(s, self.last_error, call)

    # ------------------------------------------------------------ backends and profiles
    @property
    def backends(self) -> list[dict]:
        """Every backend: {"name", "available", "detail"} (device/ISA, or why it is absent)."""
        out = []
        for i in range(lib.kiln_backend_count(self.handle)):
            bi = _capi.BackendInfo()
            self._check(lib.kiln_backend_get(self.handle, i, C.byref(bi)), "kiln_backend_get")
            out.append({"name": bi.name.decode(), "available": bool(bi.available),
                        "detail": (bi.detail or b"").decode()})
        return out

    @property
    def cpu_isa(self) -> str:
        """The CPU ISA path in use ("avx512", "avx2", "scalar")."""
        return lib.kiln_cpu_isa(self.handle).decode()

    def profile(self, backend: str) -> dict:
        """kiln_ctx_profile: what placement assumes of a backend (s, bytes/s, FLOP/s; 0 unknown)."""
        p = _capi.DeviceProfile()
        self._check(lib.kiln_ctx_profile(self.handle, backend.encode(), C.byref(p)), "kiln_ctx_profile")
        return _profile_to_dict(p)

    def set_profile(self, backend: str, profile: Mapping | None = None, **fields) -> dict:
        """kiln_ctx_set_profile: overrides the fields given (the rest stay as they are), e.g.
        ctx.set_profile("cuda", mem_bw=3e12, peak_flops={"f16": 4e14}). Returns the new profile."""
        try:
            cur = self.profile(backend)
        except UnsupportedError:  # no profile yet (a what-if device): every field starts unknown (0)
            cur = _profile_to_dict(_capi.DeviceProfile())
        for k, v in {**(profile or {}), **fields}.items():
            if k == "peak_flops":
                if not isinstance(v, Mapping):
                    v = {t: v for t in _capi.DTYPES}
                for t, f in v.items():
                    cur["peak_flops"][_capi.DTYPES[dtype_id(t)]] = float(f)
            elif k in cur:
                cur[k] = float(v)
            else:
                raise KeyError(f"kiln: profile has no field {k!r} (fields: {', '.join(cur)})")
        p = _capi.DeviceProfile()
        for i, t in enumerate(_capi.DTYPES):
            p.peak_flops[i] = cur["peak_flops"][t]
        for k in ("mem_bw", "launch_s", "h2d_bw", "d2h_bw", "xfer_latency_s", "link_bw", "link_latency_s"):
            setattr(p, k, cur[k])
        self._check(lib.kiln_ctx_set_profile(self.handle, backend.encode(), C.byref(p)), "kiln_ctx_set_profile")
        return cur

    def load_profile(self, path: str):
        """kiln_ctx_load_profile: overrides profile fields from a JSON file."""
        self._check(lib.kiln_ctx_load_profile(self.handle, str(path).encode()), "kiln_ctx_load_profile")

    def calibrate(self, save: bool = False):
        """kiln_calibrate: measures the present backends' profiles (saved to the cache dir if save)."""
        self._check(lib.kiln_calibrate(self.handle, bool(save)), "kiln_calibrate")

    def check(self, backend: str | None = None, op: str | None = None, quick: bool = True, seed: int = 0) -> dict:
        """kiln_check: ops, fused patterns and presets against kiln's f64 reference. Returns the JSON
        report as a dict ({"ok": bool, "results": [...]})."""
        o = _capi.CheckOptions(backend.encode() if backend else None, op.encode() if op else None, quick, seed, None, None)
        rep = C.c_void_p()
        self._check(lib.kiln_check(self.handle, C.byref(o), C.byref(rep)), "kiln_check")
        try:
            js = C.c_void_p()
            self._check(lib.kiln_check_report_json(rep, C.byref(js)), "kiln_check_report_json")
            return json.loads(_capi.take_string(js))
        finally:
            lib.kiln_check_report_free(rep)

    # ------------------------------------------------------------ graphs from text and presets
    def parse(self, text: str, file: str | None = None) -> Graph:
        """kiln_kg_parse: a graph from .kg text (errors: ParseError with file:line:col)."""
        h = C.c_void_p()
        self._check(lib.kiln_kg_parse(self.handle, text.encode(), file.encode() if file else None, C.byref(h)),
                    "kiln_kg_parse")
        return Graph(h.value, text)

    def load(self, path: str) -> Graph:
        """kiln_kg_load: a graph from a .kg file."""
        h = C.c_void_p()
        self._check(lib.kiln_kg_load(self.handle, str(path).encode(), C.byref(h)), "kiln_kg_load")
        with open(path, encoding="utf-8", errors="replace") as f:
            return Graph(h.value, f.read())

    def preset(self, name: str, wdtype="f32", n_layers: int = 1, max_ctx: int = 1024, max_tok: int = 1,
               seed: int = 1) -> Graph:
        """kiln_preset_graph: a llama-style decoder stack of a known model ("qwen2-0.5b", ...) with
        random weights. Interface: symbols n_tok, n_kv; inputs x f32 [n_tok, hidden], pos i32
        [n_tok]; states k<L>, v<L>; output y f32 [n_tok, hidden]."""
        o = _capi.PresetOptions(dtype_id(wdtype), n_layers, max_ctx, max_tok, seed)
        h = C.c_void_p()
        self._check(lib.kiln_preset_graph(self.handle, name.encode(), C.byref(o), C.byref(h)), "kiln_preset_graph")
        g = Graph(h.value)
        g.inputs, g.outputs = ["x", "pos"], ["y"]
        g.states = [f"{kv}{layer}" for layer in range(n_layers) for kv in "kv"]
        return g

    # ------------------------------------------------------------ compile
    def compile(self, graph: Graph, backend: str | None = None, fuse: bool = True, what_if: bool = False,
                check_finite: bool = False, devices: str | None = None) -> "Plan":
        """kiln_compile: fuses, places and compiles the graph into a Plan. backend None ("auto")
        lets placement pick per kernel; what_if places as if every profiled backend were present
        (explain only, not run); check_finite makes runs raise NonFiniteError at the first NaN/inf;
        devices ("cpu:0,1", "cuda:0,1", "2") splits the graph over devices (tensor parallelism)."""
        o = _capi.CompileOptions(backend.encode() if backend else None, not fuse, what_if, check_finite)
        o.devices = devices.encode() if devices else None
        h = C.c_void_p()
        self._check(lib.kiln_compile(self.handle, graph.handle, C.byref(o), C.byref(h)), "kiln_compile")
        plan = Plan(self, h.value, graph)
        self._plans.add(plan)
        return plan


_default = None
_default_lock = threading.Lock()


class VkSync:
    """The stream of run_async for a plan on vulkan (kiln_vk_sync): the step is queued on kiln's
    Vulkan queue and run_async returns without waiting; Plan.wait() waits for it and writes its
    outputs. wait: VkSemaphore handles (ints) of kiln's device the step waits for, with wait_values
    (timeline values, 0 for a binary semaphore; None: all binary); signal: a VkSemaphore signalled
    when the step is done (signal_value: a timeline value, 0: binary). With no semaphores it only
    queues the step."""

    def __init__(self, wait: Sequence[int] = (), wait_values: Sequence[int] | None = None, signal: int = 0,
                 signal_value: int = 0):
        n = len(wait)
        if wait_values is not None and len(wait_values) != n:
            raise ValueError(f"kiln: {n} wait semaphores but {len(wait_values)} wait values")
        self._wait = (C.c_uint64 * max(1, n))(*wait)
        self._values = (C.c_uint64 * max(1, n))(*wait_values) if wait_values is not None else None
        self._c = _capi.VkSync(_capi.VK_SYNC_MAGIC, n, self._wait if n else None, self._values if n else None,
                               int(signal), int(signal_value))

    @property
    def address(self) -> int:
        return C.addressof(self._c)


def _stream_handle(stream) -> int | None:
    """The CUstream of stream: an int, __cuda_stream__ (version, handle), torch's cuda_stream or
    CuPy's ptr; None is the legacy default stream."""
    if stream is None or isinstance(stream, int):
        return stream or None
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1]) or None
    for attr in ("cuda_stream", "ptr", "handle"):
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h or None
    raise TypeError(f"kiln: cannot take a CUDA stream handle from {type(stream).__name__} "
                    "(give an int, a torch.cuda.Stream or an object with __cuda_stream__)")


def default_context() -> Context:
    """A process-wide quiet Context made on first use (for quick experiments)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Context()
        return _default


class Plan:
    """A compiled graph (kiln_plan). run() binds inputs, outputs and symbols by name without copies;
    states persist across runs. One thread at a time per plan."""

    def __init__(self, ctx: Context, handle: int, graph: Graph):
        self.ctx, self._h = ctx, handle
        self._keep = list(graph._keep)  # borrowed weights must outlive the plan
        self.inputs, self.outputs = list(graph.inputs), list(graph.outputs)
        self.states, self.symbols = list(graph.states), dict(graph.symbols)

    def close(self):
        if getattr(self, "_h", None):
            lib.kiln_plan_free(self._h)
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
            raise ValueError("kiln: the plan was closed")
        return self._h

    def _check(self, s: int, call: str):
        if s:
            raise error(s, self.ctx.last_error, call)

    @property
    def backend(self) -> str:
        """The backend the plan runs on ("cpu", or "mixed" placements name each kernel's)."""
        return lib.kiln_plan_backend(self.handle).decode()

    @property
    def kernel_count(self) -> int:
        return lib.kiln_plan_kernel_count(self.handle)

    @property
    def compile_ms(self) -> float:
        return lib.kiln_plan_compile_ms(self.handle)

    @property
    def cache(self) -> str:
        """Where the compiled code came from: "memory", "disk", "partial" or "miss"."""
        return lib.kiln_plan_cache(self.handle).decode()

    @property
    def peak_bytes(self) -> int:
        return lib.kiln_plan_peak_bytes(self.handle)

    def tensor(self, name: str) -> dict:
        """kiln_plan_tensor: {"dtype", "shape", "bytes"} of an input, output or state (dims as of
        the last run, or their bounds before any)."""
        ti = _capi.TensorInfo()
        self._check(lib.kiln_plan_tensor(self.handle, name.encode(), C.byref(ti)), "kiln_plan_tensor")
        return {"dtype": _capi.DTYPES[ti.t], "shape": tuple(ti.dims[i] for i in range(ti.rank)), "bytes": ti.bytes}

    def _empty(self, name: str) -> np.ndarray:
        info = self.tensor(name)
        np_t = _arrays.NUMPY_OF.get(info["dtype"], np.dtype(np.uint16) if info["dtype"] == "bf16" else None)
        if np_t is None:
            return np.empty(info["bytes"], np.uint8)
        return np.empty(info["shape"], np_t)

    def _binding(self, name: str, obj, writable: bool, keep: list) -> _capi.Binding:
        v = _arrays.view(obj, name, writable)
        want = self.tensor(name)["dtype"]
        if v.dtype is not None and v.dtype != want:
            raise error(7, f"'{name}' is {want} but the array given is {v.dtype}", "kiln_run")
        keep.append(v)
        return _capi.Binding(name.encode(), v.ptr, v.nbytes, 0, v.device)

    def run(self, inputs: Mapping | None = None, symbols: Mapping[str, int] | None = None,
            out: Mapping | None = None, read: Sequence[str] | None = None) -> dict:
        """kiln_run. inputs: name -> array (host or device memory, read in place); symbols: name ->
        value; out: name -> array kiln writes in place (host or device). Returns name -> array for
        every output: those of `out` as given, the others (or only those in `read`; read=() for
        none) read into new numpy arrays. States persist; on error the plan stays usable."""
        keep: list = []
        bs = [self._binding(n, a, False, keep) for n, a in (inputs or {}).items()]
        bs += [_capi.Binding(n.encode(), None, 0, int(v), False) for n, v in (symbols or {}).items()]
        bs += [self._binding(n, a, True, keep) for n, a in (out or {}).items()]
        arr = (_capi.Binding * max(1, len(bs)))(*bs)
        self._check(lib.kiln_run(self.handle, arr, len(bs)), "kiln_run")
        result = dict(out or {})
        names = [n for n in self.outputs if n not in result] if read is None else list(read)
        for n in names:
            result[n] = self.read(n)
        return result

    def run_async(self, inputs: Mapping | None = None, symbols: Mapping[str, int] | None = None,
                  out: Mapping | None = None, stream=None) -> dict:
        """kiln_run_async: one step ordered on the caller's CUDA stream, as an engine's decode loop
        runs it. stream: a CUstream handle (int), or an object that has one (torch.cuda.Stream's
        `cuda_stream`, CuPy's `ptr`, or the `__cuda_stream__` protocol); None is the legacy default
        stream. A plan whose kernels all run on cuda is ordered after the work already on stream,
        and stream waits for it (events: with every input and output bound as device memory the
        call returns without waiting). A plan on vulkan takes a kiln.VkSync: the step is queued and
        the call returns at once; its host outputs are written by wait(), and the arrays bound here
        (inputs are copied at the call) must stay alive until then. Any other plan runs as run()
        does. Outputs are what `out`
        binds (read others later with read()); device arrays must stay alive until the stream has
        passed the step (the caller's tensors: kiln keeps no reference after the call)."""
        keep: list = []
        bs = [self._binding(n, a, False, keep) for n, a in (inputs or {}).items()]
        bs += [_capi.Binding(n.encode(), None, 0, int(v), False) for n, v in (symbols or {}).items()]
        bs += [self._binding(n, a, True, keep) for n, a in (out or {}).items()]
        arr = (_capi.Binding * max(1, len(bs)))(*bs)
        vk = self.backend == "vulkan"
        if isinstance(stream, VkSync) != vk and stream is not None:
            raise TypeError("kiln: a plan on vulkan takes a kiln.VkSync (or None) as its stream" if vk else
                            f"kiln: a kiln.VkSync is the stream of a vulkan plan, this one runs on {self.backend}")
        handle = stream.address if isinstance(stream, VkSync) else _stream_handle(stream)
        self._check(lib.kiln_run_async(self.handle, arr, len(bs), handle), "kiln_run_async")
        return dict(out or {})

    def wait(self) -> None:
        """kiln_plan_wait: waits for the steps run_async queued (vulkan) and writes their outputs."""
        self._check(lib.kiln_plan_wait(self.handle), "kiln_plan_wait")

    def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """kiln_plan_read: the last run's value of an output (into `out` when given)."""
        a = self._empty(name) if out is None else out
        v = _arrays.view(a, name, True)
        self._check(lib.kiln_plan_read(self.handle, name.encode(), v.ptr, v.nbytes), "kiln_plan_read")
        return a

    def state(self, name: str) -> np.ndarray:
        """kiln_plan_state_read: a copy of a state."""
        a = self._empty(name)
        v = _arrays.view(a, name, True)
        self._check(lib.kiln_plan_state_read(self.handle, name.encode(), v.ptr, v.nbytes), "kiln_plan_state_read")
        return a

    def set_state(self, name: str, value) -> None:
        """kiln_plan_state_write: replaces a state's contents (same size)."""
        v = _arrays.view(value, name)
        self._check(lib.kiln_plan_state_write(self.handle, name.encode(), v.ptr, v.nbytes), "kiln_plan_state_write")

    # ------------------------------------------------------------ explanation and costs
    def explain(self, format: str = "text") -> str:  # noqa: A002
        """kiln_plan_explain: "text" (a table), "json" or "dot" (Graphviz of the fused graph)."""
        out = C.c_void_p()
        self._check(lib.kiln_plan_explain(self.handle, format.encode(), C.byref(out)), "kiln_plan_explain")
        return _capi.take_string(out)

    def profile(self, on: bool = True) -> None:
        """kiln_plan_profile: times every kernel of later runs (measured_s in regions())."""
        self._check(lib.kiln_plan_profile(self.handle, bool(on)), "kiln_plan_profile")

    def regions(self) -> list[dict]:
        """One row per fused kernel (kiln_plan_region): kind, backend, ops, anchor, flops, bytes,
        predicted_s (on its backend), predicted_by_backend, transfer_s, bound ("compute" or
        "memory"), measured_s and n_measured (after profile(True) and runs), and the achieved
        GB/s and GFLOP/s and predicted/measured when measured."""
        names = [b["name"] for b in self.ctx.backends]
        rows = []
        for i in range(self.kernel_count):
            ri = _capi.RegionInfo()
            self._check(lib.kiln_plan_region(self.handle, i, C.byref(ri)), "kiln_plan_region")
            be = ri.backend.decode()
            by = {n: ri.predicted_s[j] for j, n in enumerate(names) if j < _capi.MAX_BACKENDS and ri.predicted_s[j] >= 0}
            row = {"kernel": i, "kind": ri.kind.decode(), "backend": be, "ops": ri.ops.decode(),
                   "anchor": ri.anchor.decode(), "flops": ri.flops, "bytes": ri.bytes,
                   "predicted_s": by.get(be, float("nan")), "predicted_by_backend": by,
                   "transfer_s": ri.transfer_s, "bound": "compute" if ri.compute_bound else "memory",
                   "measured_s": ri.measured_s if ri.n_measured else None, "n_measured": ri.n_measured}
            if ri.n_measured and ri.measured_s > 0:
                row["achieved_gbs"] = ri.bytes / ri.measured_s / 1e9
                row["achieved_gflops"] = ri.flops / ri.measured_s / 1e9
                row["predicted_over_measured"] = row["predicted_s"] / ri.measured_s
            rows.append(row)
        return rows


def quantize(x, dtype) -> np.ndarray:
    """kiln_quantize: f32 values to dtype's bytes (bit-exact with GGUF's reference quantizers).
    x [..., n] with n a multiple of the block; returns uint8 [..., row_bytes] (f16: float16)."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    t = dtype_id(dtype)
    if a.ndim == 0 or lib.kiln_row_bytes(t, a.shape[-1]) == 0:
        raise ValueError(f"kiln: rows of {a.shape[-1] if a.ndim else 0} values are not whole "
                         f"{_capi.DTYPES[t]} blocks of {lib.kiln_dtype_block(t)}")
    rb = lib.kiln_row_bytes(t, a.shape[-1])
    out = np.empty(a.shape[:-1] + (rb,), np.uint8)
    s = lib.kiln_quantize(t, a.ctypes.data, out.ctypes.data, a.size)
    if s:
        raise error(s, "", "kiln_quantize")
    np_t = _arrays.NUMPY_OF.get(_capi.DTYPES[t])
    return out.view(np_t) if np_t is not None else out


def dequantize(data, dtype, n: int | None = None) -> np.ndarray:
    """kiln_dequantize: dtype's bytes back to f32; n values (default: all the bytes hold)."""
    v = _arrays.view(data, "data")
    t = dtype_id(dtype)
    per = lib.kiln_dtype_block_bytes(t)
    count = n if n is not None else v.nbytes // per * lib.kiln_dtype_block(t)
    out = np.empty(count, np.float32)
    if count * per // lib.kiln_dtype_block(t) > v.nbytes:
        raise ValueError(f"kiln: {v.nbytes} bytes hold fewer than {count} {_capi.DTYPES[t]} values")
    s = lib.kiln_dequantize(t, v.ptr, out.ctypes.data, count)
    if s:
        raise error(s, "", "kiln_dequantize")
    return out


def presets() -> list[str]:
    """Names of the built-in model presets (kiln_preset_name)."""
    out, i = [], 0
    while (n := lib.kiln_preset_name(i)) is not None:
        out.append(n.decode())
        i += 1
    return out
