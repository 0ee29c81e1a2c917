"""Zero-copy views of the caller's arrays for kiln runs and weights.

Host memory: anything numpy can view without a copy (numpy arrays, the buffer protocol,
__array_interface__, DLPack on the CPU). Device memory: __cuda_array_interface__ (PyTorch CUDA
tensors, CuPy, Numba) or a DLPack capsule on a CUDA device. Never copies: an array that is not
C-contiguous, or whose dtype does not match, is an error naming the tensor, not a silent copy.
"""
from __future__ import annotations

import ctypes as C
from dataclasses import dataclass

import numpy as np

# numpy dtype of each kiln dtype that has one (bf16 and block formats travel as raw bytes).
NUMPY_OF = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "i32": np.dtype(np.int32)}
KILN_OF = {v: k for k, v in NUMPY_OF.items()}
# typestr of __cuda_array_interface__ / itemsize for DLPack, per kiln dtype.
_TYPESTR = {"f32": ("<f4",), "f16": ("<f2",), "i32": ("<i4",), "bf16": ("<V2", "<u2", "<i2")}


@dataclass
class View:
    """A pointer kiln can read or write: host or device, with its byte size and the owner kept alive."""
    ptr: int
    nbytes: int
    device: bool
    owner: object
    dtype: str | None  # kiln dtype name of the array's dtype; None for raw bytes/words (uint8,
    # uint16, bfloat16: bf16 or block formats), "numpy float64" and such for dtypes kiln lacks
    shape: tuple


def _cuda_view(obj, cai: dict) -> View:
    shape = tuple(int(d) for d in cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    strides = cai.get("strides")
    if strides is not None:
        want, s = [], itemsize
        for d in reversed(shape):
            want.append(s)
            s *= d
        if tuple(strides) != tuple(reversed(want)) and int(np.prod(shape)) > 1:
            raise ValueError("kiln: a device tensor must be C-contiguous (call .contiguous() first)")
    dtype = next((k for k, v in _TYPESTR.items() if typestr in v), None)
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    return View(int(cai["data"][0]), nbytes, True, obj, dtype, shape)


class _DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int)]


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class _DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", _DLDevice), ("ndim", C.c_int), ("dtype", _DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


_DL_CUDA, _DL_CUDA_MANAGED = 2, 13
_capsule_ptr = C.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype, _capsule_ptr.argtypes = C.c_void_p, [C.py_object, C.c_char_p]


def _dlpack_device_view(obj) -> View:
    """A CUDA DLPack tensor without __cuda_array_interface__ (JAX, say): read the capsule in place.
    The capsule is kept (not consumed) with the View, so the producer's memory stays alive."""
    cap = obj.__dlpack__()
    t = _DLTensor.from_address(_capsule_ptr(cap, b"dltensor"))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = t.dtype.bits // 8 * t.dtype.lanes
    if t.strides:
        s = itemsize
        for i in reversed(range(t.ndim)):
            if shape[i] > 1 and t.strides[i] * itemsize != s:
                raise ValueError("kiln: a device tensor must be C-contiguous")
            s *= shape[i]
    code = {(2, 32): "f32", (2, 16): "f16", (0, 32): "i32", (4, 16): "bf16"}.get((t.dtype.code, t.dtype.bits))
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    return View(int(t.data or 0) + int(t.byte_offset), nbytes, True, (obj, cap), code, shape)


def view(obj, name: str, writable: bool = False) -> View:
    """A zero-copy View of obj (host or device); raises TypeError/ValueError naming `name`."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _cuda_view(obj, cai)
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None and not isinstance(obj, np.ndarray):
        kind = int(dev()[0])
        if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
            return _dlpack_device_view(obj)
        if kind == 1:  # kDLCPU: numpy views it in place
            a = np.from_dlpack(obj)
            if writable and not a.flags.writeable:  # a producer that marks it read-only: __array__'s view
                b = np.asarray(obj)
                if np.shares_memory(a, b):
                    a = b
            obj = a
    try:
        a = np.asarray(obj)
    except Exception as e:  # noqa: BLE001 - any failure to view is the caller's type error
        raise TypeError(f"kiln: '{name}': cannot view {type(obj).__name__} as an array ({e})") from e
    if not a.flags.c_contiguous:
        raise ValueError(f"kiln: '{name}' is not C-contiguous (np.ascontiguousarray makes a copy that is)")
    if writable and not a.flags.writeable:
        raise ValueError(f"kiln: '{name}' is read-only but kiln writes it")
    dtype = KILN_OF.get(a.dtype)
    if dtype is None and a.dtype.kind not in "uV" and str(a.dtype) != "bfloat16":
        dtype = f"numpy {a.dtype}"  # kiln has no such dtype: a binding refuses it by name
    return View(a.ctypes.data, a.nbytes, False, a, dtype, a.shape)
