"""The ctypes mirrors of kiln.h's structs (python/kiln/_capi.py) name the C fields in the C order:
a field added to kiln.h without its mirror makes kiln read past (or misread) the struct Python
passes (kiln_compile read past CodegenOptions and segfaulted once; gemm_persist, gemm_splitk and
paged_mixed were missing while later fields were added). Parsed from the header beside the tests."""
import re
from pathlib import Path

import pytest

from kiln import _capi

HEADER = Path(__file__).resolve().parents[2] / "include" / "kiln" / "kiln.h"

MIRRORS = {"CtxOptions": "kiln_ctx_options", "BackendInfo": "kiln_backend_info", "CodegenOptions": "kiln_codegen_options",
           "CompileOptions": "kiln_compile_options", "Binding": "kiln_binding", "TensorInfo": "kiln_tensor_info",
           "DeviceProfile": "kiln_device_profile", "RegionInfo": "kiln_region_info", "PresetOptions": "kiln_preset_options",
           "CheckOptions": "kiln_check_options", "ModelInfo": "kiln_model_info", "ModelOptions": "kiln_model_options"}


def c_fields(text, name):
    """Field names of `typedef struct NAME { ... } NAME;` in declaration order."""
    m = re.search(r"typedef struct %s \{(.*?)\n\} %s;" % (name, name), text, re.S)
    assert m, f"{name} not found in {HEADER}"
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    names = []
    for decl in (d.strip() for d in body.split(";")):
        if not decl:
            continue
        fp = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)  # a function pointer: void (*on_result)(...)
        if fp:
            names.append(fp.group(1))
            continue
        decl = re.sub(r"\[[^\]]*\]", "", decl)  # arrays
        rest = re.match(r"(?:const\s+)?(?:struct\s+|enum\s+)?\w+[\s*]+(.*)$", decl, re.S).group(1)
        names += [n.strip().lstrip("*").strip() for n in rest.split(",")]
    return names


@pytest.mark.parametrize("py,c", sorted(MIRRORS.items()))
def test_mirror_names_every_c_field_in_order(py, c):
    got = [f[0] for f in getattr(_capi, py)._fields_]
    assert got == c_fields(HEADER.read_text(), c), f"_capi.{py} does not mirror {c}"
