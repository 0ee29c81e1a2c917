"""kiln's statuses as Python exceptions: every failing call raises a subclass of kiln.Error that
carries the status (its number and kiln_status_str text) and kiln's message (kiln_ctx_error or
kiln_graph_error). Must not swallow or reword kiln's message: it names what is wrong."""
from __future__ import annotations

from . import _capi


class Error(Exception):
    """A kiln call failed. `status` is the kiln_status number, `status_name` its short name
    ("shape", "parse", ...), `message` kiln's detail (names the node, file:line or driver log)."""

    def __init__(self, status: int, message: str, call: str = ""):
        self.status = int(status)
        self.status_name = _capi.STATUS_NAMES[status] if 0 <= status < len(_capi.STATUS_NAMES) else "?"
        self.message = message
        self.call = call
        text = _capi.lib.kiln_status_str(status).decode()
        super().__init__(f"{call + ': ' if call else ''}{text}: {message}" if message else f"{call}: {text}")


class InvalidArgError(Error, ValueError):
    """KILN_ERR_INVALID_ARG: a bad handle, enum or option."""


class ShapeError(Error, ValueError):
    """KILN_ERR_SHAPE: operand shapes do not agree, or a size overflows."""


class DtypeError(Error, TypeError):
    """KILN_ERR_DTYPE: a dtype the op does not take."""


class NodeError(Error, ValueError):
    """KILN_ERR_NODE: an unknown node, or one of another graph."""


class NamingError(Error, KeyError):
    """KILN_ERR_NAME: a name that is missing, unknown, or used twice."""

    def __str__(self):  # KeyError would quote the text
        return Exception.__str__(self)


class SymbolError(Error, ValueError):
    """KILN_ERR_SYMBOL: a symbol unbound at run, or bound over its maximum."""


class BindingError(Error, ValueError):
    """KILN_ERR_BINDING: a run binding whose size or kind does not fit its tensor."""


class ParseError(Error, ValueError):
    """KILN_ERR_PARSE: a .kg text or profile file with an error (file:line:col in the message)."""


class FileError(Error, OSError):
    """KILN_ERR_IO: a file could not be read or written."""


class NoMemoryError(Error, MemoryError):
    """KILN_ERR_NOMEM: an allocation failed."""


class UnsupportedError(Error):
    """KILN_ERR_UNSUPPORTED: a backend or op/dtype combination that is not available."""


class BackendError(Error, RuntimeError):
    """KILN_ERR_BACKEND: a backend failed at run time (the driver's text in the message)."""


class InternalError(Error, RuntimeError):
    """KILN_ERR_INTERNAL: a broken invariant inside kiln; please report it."""


class NonFiniteError(Error, ArithmeticError):
    """KILN_ERR_NONFINITE: check_finite found a NaN or infinity (the message names the node)."""


class BusyError(Error):
    """KILN_ERR_BUSY: the device queue holds as many unwaited async steps as kiln keeps."""


_BY_STATUS = [None, InvalidArgError, ShapeError, DtypeError, NodeError, NamingError, SymbolError, BindingError,
              ParseError, FileError, NoMemoryError, UnsupportedError, BackendError, InternalError, NonFiniteError,
              BusyError]


def error(status: int, message: str, call: str = "") -> Error:
    cls = _BY_STATUS[status] if 0 < status < len(_BY_STATUS) else Error
    return cls(status, message, call)
