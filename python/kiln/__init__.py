"""kiln from Python: build graphs, compile them into fused plans, run them on numpy arrays (or any
host array, PyTorch/CuPy device tensors as device memory) without copies, and explore kiln's cost
model. A thin ctypes layer over libkiln.so; every name mirrors include/kiln/kiln.h.

    import numpy as np, kiln
    ctx = kiln.Context()
    g = kiln.Graph()
    n = g.sym("n", 64)
    x = g.input("x", "f32", [n, 256])
    w = g.weight("w", np.random.rand(512, 256).astype(np.float32))
    g.output(g.silu(g.matmul(x, w)), "y")
    plan = ctx.compile(g)
    y = plan.run({"x": np.random.rand(3, 256).astype(np.float32)}, {"n": 3})["y"]
"""
from ._capi import DTYPES, lib as _lib
from ._errors import (BackendError, BindingError, BusyError, DtypeError, Error, FileError, InternalError, InvalidArgError,
                      NamingError, NodeError, NoMemoryError, NonFiniteError, ParseError, ShapeError, SymbolError,
                      UnsupportedError)
from ._graph import Graph, Node, Sym
from ._plan import Context, Plan, VkSync, default_context, dequantize, presets, quantize
from ._model import Model
from . import cost

__version__ = "0.1.0"
library_path = _lib.path

__all__ = ["Context", "Model", "Graph", "Node", "Sym", "Plan", "VkSync", "default_context", "quantize", "dequantize",
           "presets",
           "DTYPES", "cost", "Error", "InvalidArgError", "ShapeError", "DtypeError", "NodeError", "NamingError",
           "SymbolError", "BindingError", "ParseError", "FileError", "NoMemoryError", "UnsupportedError",
           "BackendError", "InternalError", "NonFiniteError", "BusyError", "library_path", "__version__"]
