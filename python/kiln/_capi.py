"""ctypes declarations of include/kiln/kiln.h and the loading of libkiln.so.

Only mirrors the C header (structs, prototypes, enums); the Pythonic layer is in _core.py.
Must not hold any kiln object: handles live in the classes that free them.
Where the library comes from, first found wins: $KILN_LIB (a path to libkiln.so), the copy
installed inside this package by `pip install`, then the system's (ldconfig) libkiln.so.0.
"""
from __future__ import annotations

import ctypes as C
import ctypes.util
import os
from pathlib import Path

# ---------------------------------------------------------------- enums (as numbered in kiln.h)
STATUS_NAMES = ["ok", "invalid_arg", "shape", "dtype", "node", "name", "symbol", "binding", "parse",
                "io", "nomem", "unsupported", "backend", "internal", "nonfinite", "busy"]
# DTYPES (kiln_dtype names by number) and DTYPE_COUNT are read from the library below: the enum
# grows with new GGUF formats, and kiln_device_profile's peak_flops array is sized by it.
ROPE_MODES = {"normal": 0, "neox": 1}
WEIGHT_COPY, WEIGHT_BORROW = 0, 1
MAX_RANK = 4
MAX_BACKENDS = 8
NODE_NONE = 0

# ---------------------------------------------------------------- structs
# Field by field as in kiln.h (python/tests/test_header.py compares the names and order with it).


class CtxOptions(C.Structure):
    _fields_ = [("n_threads", C.c_int), ("cache_dir", C.c_char_p), ("quiet", C.c_bool)]


class BackendInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("available", C.c_bool), ("detail", C.c_char_p)]


class CodegenOptions(C.Structure):
    _fields_ = [("gemm", C.c_int32), ("gemm_rows", C.c_int32), ("grid_cap", C.c_int32), ("vk_disable", C.c_int32),
                ("wgmma", C.c_int32), ("pdl", C.c_int32), ("precision", C.c_int32), ("flash", C.c_int32),
                ("flash_wg", C.c_int32), ("gemm_cluster", C.c_int32), ("gemv_pair", C.c_int32),
                ("gemm_epilogue", C.c_int32),
                ("gemv_prefetch", C.c_int32), ("gemv_fence", C.c_int32), ("attn_cluster", C.c_int32),
                ("flash_rows", C.c_int32), ("flash_split", C.c_int32),
                ("gemm_cols", C.c_int32), ("paged_decode", C.c_int32),
                ("decode_kernels", C.c_int32),
                ("gemv_reduce", C.c_int32), ("gemv_preload", C.c_int32),
                ("paged_mixed", C.c_int32), ("gemv_pipeline", C.c_int32),
                ("gemm_persist", C.c_int32), ("gemm_splitk", C.c_int32), ("gemv_xload", C.c_int32),
                ("gemm_pairs", C.c_int32)]


class CompileOptions(C.Structure):
    _fields_ = [("backend", C.c_char_p), ("no_fuse", C.c_bool), ("what_if", C.c_bool),
                ("check_finite", C.c_bool), ("codegen", CodegenOptions), ("no_record", C.c_bool),
                ("devices", C.c_char_p)]


class Binding(C.Structure):
    _fields_ = [("name", C.c_char_p), ("data", C.c_void_p), ("bytes", C.c_size_t),
                ("value", C.c_int64), ("device", C.c_bool)]


VK_SYNC_MAGIC = 0x6B766B31  # KILN_VK_SYNC_MAGIC
VK_SYNC_MAX_WAIT = 8


class VkSync(C.Structure):
    _fields_ = [("magic", C.c_uint32), ("n_wait", C.c_uint32), ("wait", C.POINTER(C.c_uint64)),
                ("wait_value", C.POINTER(C.c_uint64)), ("signal", C.c_uint64), ("signal_value", C.c_uint64)]


class TensorInfo(C.Structure):
    _fields_ = [("t", C.c_int), ("rank", C.c_int), ("dims", C.c_int64 * MAX_RANK), ("bytes", C.c_size_t)]


class DeviceProfile(C.Structure):
    """kiln_device_profile; its fields are set once the library says how many dtypes it has."""


class RegionInfo(C.Structure):
    _fields_ = [("kind", C.c_char_p), ("backend", C.c_char_p), ("ops", C.c_char * 256), ("anchor", C.c_char * 64),
                ("flops", C.c_double), ("bytes", C.c_double), ("predicted_s", C.c_double * MAX_BACKENDS),
                ("transfer_s", C.c_double), ("compute_bound", C.c_bool), ("measured_s", C.c_double),
                ("n_measured", C.c_int)]


class PresetOptions(C.Structure):
    _fields_ = [("wdtype", C.c_int), ("n_layers", C.c_int), ("max_ctx", C.c_int64), ("max_tok", C.c_int64),
                ("seed", C.c_uint64)]


class CheckOptions(C.Structure):
    _fields_ = [("backend", C.c_char_p), ("op", C.c_char_p), ("quick", C.c_bool), ("seed", C.c_uint64),
                ("on_result", C.c_void_p), ("user", C.c_void_p)]


class ModelInfo(C.Structure):
    _fields_ = [("arch", C.c_char * 32), ("n_layer", C.c_int), ("hidden", C.c_int64), ("n_head", C.c_int64),
                ("n_kv_head", C.c_int64), ("head_dim", C.c_int64), ("ffn", C.c_int64), ("n_vocab", C.c_int64),
                ("n_ctx_train", C.c_int64), ("theta", C.c_float), ("eps", C.c_float), ("rope", C.c_int),
                ("qkv_bias", C.c_bool), ("tied_output", C.c_bool), ("weight_bytes", C.c_size_t),
                ("out_bias", C.c_bool), ("ffn_bias", C.c_bool), ("qk_norm", C.c_bool),
                ("rope_scale", C.c_float), ("rope_freqs", C.c_bool), ("sliding_window", C.c_int64),
                ("attn_softcap", C.c_float), ("final_softcap", C.c_float), ("swa_pattern", C.c_int),
                ("swa_theta", C.c_float), ("attn_scale", C.c_float), ("embd_scale", C.c_bool),
                ("post_norms", C.c_bool), ("gelu_gate", C.c_bool), ("fused_qkv", C.c_bool),
                ("n_rot", C.c_int64), ("longrope", C.c_bool), ("n_ctx_orig", C.c_int64),
                ("rope_attn_factor", C.c_float), ("yarn", C.c_bool), ("yarn_beta_fast", C.c_float),
                ("yarn_beta_slow", C.c_float), ("n_expert", C.c_int64), ("n_expert_used", C.c_int64),
                ("ffn_exp", C.c_int64), ("ffn_shexp", C.c_int64), ("expert_norm", C.c_bool)]


class ModelOptions(C.Structure):
    _fields_ = [("max_ctx", C.c_int64), ("max_tok", C.c_int64), ("kv_dtype", C.c_int), ("n_layers", C.c_int),
                ("logits", C.c_bool), ("last_only", C.c_bool), ("moe_dense", C.c_bool)]


# ---------------------------------------------------------------- prototypes
P, I, D, S, SZ = C.c_void_p, C.c_int, C.c_double, C.c_char_p, C.c_size_t
I64, U64, U32, F, B = C.c_int64, C.c_uint64, C.c_uint32, C.c_float, C.c_bool
PP = C.POINTER(C.c_void_p)
DIMS = C.POINTER(C.c_int64)

_PROTOS = {
    "kiln_status_str": (S, [I]),
    "kiln_dtype_name": (S, [I]),
    "kiln_dtype_block": (I64, [I]),
    "kiln_dtype_block_bytes": (SZ, [I]),
    "kiln_row_bytes": (SZ, [I, I64]),
    "kiln_quantize": (I, [I, P, P, I64]),
    "kiln_dequantize": (I, [I, P, P, I64]),
    "kiln_ctx_new": (I, [C.POINTER(CtxOptions), PP]),
    "kiln_ctx_free": (None, [P]),
    "kiln_ctx_error": (S, [P]),
    "kiln_backend_count": (I, [P]),
    "kiln_backend_get": (I, [P, I, C.POINTER(BackendInfo)]),
    "kiln_cpu_isa": (S, [P]),
    "kiln_multi_gpu": (I, [P, C.POINTER(C.c_int), C.c_char_p, SZ]),
    "kiln_graph_new": (I, [PP]),
    "kiln_graph_free": (None, [P]),
    "kiln_graph_status": (I, [P]),
    "kiln_graph_error": (S, [P]),
    "kiln_graph_size": (U32, [P]),
    "kiln_sym": (I64, [P, S, I64]),
    "kiln_input": (U64, [P, S, I, I, DIMS]),
    "kiln_weight": (U64, [P, S, I, I, DIMS, P, I]),
    "kiln_weight_random": (U64, [P, S, I, I, DIMS, U64, F]),
    "kiln_state": (U64, [P, S, I, I, DIMS]),
    "kiln_output": (I, [P, U64, S]),
    "kiln_name": (I, [P, U64, S]),
    "kiln_matmul": (U64, [P, U64, U64]),
    "kiln_add": (U64, [P, U64, U64]),
    "kiln_mul": (U64, [P, U64, U64]),
    "kiln_scale": (U64, [P, U64, F]),
    "kiln_silu": (U64, [P, U64]),
    "kiln_gelu": (U64, [P, U64]),
    "kiln_tanh": (U64, [P, U64]),
    "kiln_swiglu": (U64, [P, U64, U64]),
    "kiln_rms_norm": (U64, [P, U64, U64, F]),
    "kiln_layer_norm": (U64, [P, U64, U64, U64, F]),
    "kiln_softmax": (U64, [P, U64]),
    "kiln_rope": (U64, [P, U64, U64, I, F]),
    "kiln_attention": (U64, [P, U64, U64, U64, I64, F]),
    "kiln_paged_attention": (U64, [P, U64, U64, U64, U64, U64, U64, I, F]),
    "kiln_paged_attention_tree": (U64, [P, U64, U64, U64, U64, U64, U64, U64, I, F]),
    "kiln_attention_ext": (U64, [P, U64, U64, U64, I64, F, F, I64]),
    "kiln_kv_scatter": (U64, [P, U64, U64, U64]),
    "kiln_get_rows": (U64, [P, U64, U64]),
    "kiln_argmax": (U64, [P, U64]),
    "kiln_moe_route": (U64, [P, U64, C.c_int, C.c_bool]),
    "kiln_scale_rows": (U64, [P, U64, U64, C.c_int]),
    "kiln_moe_matmul": (U64, [P, U64, U64, U64, C.c_int, C.c_bool]),
    "kiln_all_reduce": (U64, [P, U64]),
    "kiln_all_gather": (U64, [P, U64]),
    "kiln_cast": (U64, [P, U64, I]),
    "kiln_reshape": (U64, [P, U64, I, DIMS]),
    "kiln_view": (U64, [P, U64, I, DIMS, I64]),
    "kiln_transpose": (U64, [P, U64, I, I]),
    "kiln_concat": (U64, [P, U64, U64, I]),
    "kiln_graph_hash": (I, [P, C.c_char_p]),
    "kiln_kg_parse": (I, [P, S, S, PP]),
    "kiln_kg_load": (I, [P, S, PP]),
    "kiln_kg_print": (I, [P, PP]),
    "kiln_compile": (I, [P, P, C.POINTER(CompileOptions), PP]),
    "kiln_plan_free": (None, [P]),
    "kiln_run": (I, [P, C.POINTER(Binding), SZ]),
    "kiln_run_async": (I, [P, C.POINTER(Binding), SZ, P]),
    "kiln_plan_wait": (I, [P]),
    "kiln_plan_tensor": (I, [P, S, C.POINTER(TensorInfo)]),
    "kiln_plan_read": (I, [P, S, P, SZ]),
    "kiln_plan_state_read": (I, [P, S, P, SZ]),
    "kiln_plan_state_write": (I, [P, S, P, SZ]),
    "kiln_plan_backend": (S, [P]),
    "kiln_plan_kernel_count": (I, [P]),
    "kiln_check": (I, [P, C.POINTER(CheckOptions), PP]),
    "kiln_check_report_free": (None, [P]),
    "kiln_check_report_json": (I, [P, PP]),
    "kiln_ctx_profile": (I, [P, S, C.POINTER(DeviceProfile)]),
    "kiln_ctx_set_profile": (I, [P, S, C.POINTER(DeviceProfile)]),
    "kiln_ctx_load_profile": (I, [P, S]),
    "kiln_calibrate": (I, [P, B]),
    "kiln_pin": (I, [P, U64, S]),
    "kiln_plan_region": (I, [P, I, C.POINTER(RegionInfo)]),
    "kiln_plan_profile": (I, [P, B]),
    "kiln_plan_explain": (I, [P, S, PP]),
    "kiln_plan_compile_ms": (D, [P]),
    "kiln_plan_cache": (S, [P]),
    "kiln_plan_peak_bytes": (SZ, [P]),
    "kiln_preset_name": (S, [I]),
    "kiln_preset_graph": (I, [P, S, C.POINTER(PresetOptions), PP]),
    "kiln_gguf_open": (I, [P, S, PP]),
    "kiln_gguf_close": (None, [P]),
    "kiln_model_info_get": (I, [P, C.POINTER(ModelInfo)]),
    "kiln_model_build": (I, [P, C.POINTER(ModelOptions), PP]),
}


def _candidates():
    env = os.environ.get("KILN_LIB")
    if env:
        yield Path(env)
        return
    here = Path(__file__).resolve().parent
    yield here / "libkiln.so"
    found = ctypes.util.find_library("kiln")
    if found:
        yield Path(found)
    yield Path("libkiln.so.0")


def _load():
    errors = []
    for path in _candidates():
        if path.is_absolute() and not path.exists():
            errors.append(f"{path}: not found")
            continue
        try:
            lib = C.CDLL(str(path))
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, (res, args) in _PROTOS.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        lib.path = str(path)
        return lib
    raise ImportError("kiln: cannot load libkiln.so (set KILN_LIB to its path, or `pip install .` "
                      "from kiln's checkout): " + "; ".join(errors))


lib = _load()


def _dtypes() -> list:
    names = []
    while len(names) < 256:
        n = lib.kiln_dtype_name(len(names)).decode()
        if n == "?":
            return names
        names.append(n)
    raise ImportError("kiln: kiln_dtype_name never answered '?'")


DTYPES = _dtypes()
DTYPE_COUNT = len(DTYPES)
DeviceProfile._fields_ = [("peak_flops", C.c_double * DTYPE_COUNT), ("mem_bw", C.c_double), ("launch_s", C.c_double),
                          ("h2d_bw", C.c_double), ("d2h_bw", C.c_double), ("xfer_latency_s", C.c_double),
                          ("link_bw", C.c_double), ("link_latency_s", C.c_double)]
# malloc'ed strings returned through out-parameters are freed with the C library's free().
libc = C.CDLL(None)
libc.free.argtypes = [C.c_void_p]
libc.free.restype = None


def take_string(ptr: C.c_void_p) -> str:
    """Copies a malloc'ed C string handed over by kiln and frees it."""
    try:
        return C.string_at(ptr.value).decode()
    finally:
        libc.free(ptr.value)
