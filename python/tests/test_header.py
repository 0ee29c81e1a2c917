"""The ctypes mirrors of kiln.h's structs (python/kiln/_capi.py) list the header's fields, in its
order: a field added to a struct in C without the binding following would shift every later field
(or let kiln write past the end of the Python-side struct). Parses include/kiln/kiln.h itself."""
import re

from conftest import ROOT

from kiln import _capi

MIRRORS = {"kiln_ctx_options": _capi.CtxOptions, "kiln_backend_info": _capi.BackendInfo,
           "kiln_codegen_options": _capi.CodegenOptions, "kiln_compile_options": _capi.CompileOptions,
           "kiln_binding": _capi.Binding, "kiln_tensor_info": _capi.TensorInfo,
           "kiln_device_profile": _capi.DeviceProfile, "kiln_region_info": _capi.RegionInfo,
           "kiln_preset_options": _capi.PresetOptions, "kiln_check_options": _capi.CheckOptions,
           "kiln_model_info": _capi.ModelInfo, "kiln_model_options": _capi.ModelOptions,
           "kiln_vk_sync": _capi.VkSync}


def header_structs() -> dict:
    h = re.sub(r"/\*.*?\*/", "", (ROOT / "include" / "kiln" / "kiln.h").read_text(), flags=re.S)
    out = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} (\w+);", h, re.S):
        names = []
        for decl in filter(None, (d.strip() for d in m.group(2).split(";"))):
            fn = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
            names.append(fn.group(1) if fn else re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", decl).group(1))
        out[m.group(1)] = names
    return out


def test_struct_mirrors_follow_the_header():
    structs = header_structs()
    for name, cls in MIRRORS.items():
        assert name in structs, f"{name} is gone from kiln.h"
        assert [f[0] for f in cls._fields_] == structs[name], f"{name}: {structs[name]}"


def test_dtype_names_come_from_the_library():
    assert _capi.DTYPES[:4] == ["f32", "f16", "bf16", "i32"] and "q4_k" in _capi.DTYPES
    assert len(_capi.DeviceProfile().peak_flops) == _capi.DTYPE_COUNT
