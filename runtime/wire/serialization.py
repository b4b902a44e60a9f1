"""Turning Python objects into frame segments and back.

``dumps`` returns ``[payload, *buffers]``: a pickle (protocol 5) plus the out-of-band
buffers of large arrays, which travel as their own segments without being copied.
Plain pickle is used when every value is a builtin scalar or a numeric array (it is
several times faster); anything else goes through cloudpickle, which ships code
defined in ``__main__`` or in notebooks by value.
"""

from __future__ import annotations

import collections
import io
import pickle
import sys
import types

import cloudpickle

from ..errors import CodeShippingError, SerializationError

__all__ = ["dumps", "loads", "snapshot", "find_unpicklable", "explain_import_error"]

# Buffers smaller than this stay in-band: a separate segment costs more than a copy.
_OOB_MIN = 64 * 1024
_SCALARS = frozenset({int, float, str, bytes, bool, type(None), complex})
# Small runtime types that plain pickle handles by reference (importable everywhere).
PLAIN_TYPES: set = set()


def _is_plain(obj, depth: int = 0) -> bool:
    """True when ``obj`` pickles identically with plain pickle (no code, no __main__ classes)."""
    t = type(obj)
    if t in _SCALARS or t in PLAIN_TYPES:
        return True
    if depth > 2:
        return False
    if t is tuple or t is list:
        return len(obj) <= 64 and all(_is_plain(x, depth + 1) for x in obj)
    if t is dict:
        return len(obj) <= 64 and all(
            type(k) in _SCALARS and _is_plain(v, depth + 1) for k, v in obj.items()
        )
    np = sys.modules.get("numpy")
    if np is not None and t is np.ndarray:
        return obj.dtype.hasobject is False
    return False


def dumps(obj) -> list:
    """Serialize ``obj`` to ``[payload, *out_of_band_buffers]``.

    Raises :class:`SerializationError` naming the part of ``obj`` that cannot be pickled.
    """
    buffers: list = []

    def keep(pb: pickle.PickleBuffer):
        try:
            raw = pb.raw()
        except BufferError:  # not contiguous: let pickle copy it in-band
            return True
        if raw.nbytes < _OOB_MIN:
            return True
        buffers.append(raw)
        return False

    try:
        if _is_plain(obj):
            payload: bytes | memoryview = pickle.dumps(obj, protocol=5, buffer_callback=keep)
        else:
            f = io.BytesIO()
            _CodePickler(f, protocol=5, buffer_callback=keep).dump(obj)
            # getvalue(), not getbuffer(): it does not copy either (CPython hands over the
            # BytesIO's own bytes: 0.03 ms for 200 MB), and it leaves no export behind. A
            # getbuffer() view kept the BytesIO exported; when the garbage collector
            # finalized the two in one cycle, IOBase's finalizer called close() first,
            # which refused ("BufferError: Existing exports of data"), and Python 3.13
            # printed it as an ignored exception (issue 31). Never a use after free (close
            # refused), but noise that hid real warnings.
            payload = f.getvalue()
    except Exception as e:
        raise SerializationError(describe_pickle_failure(obj, e)) from e
    return [payload, *buffers]


def _code_reduce_keeping_filename(code):
    """cloudpickle's code reducer, but the code keeps its real ``co_filename``.

    cloudpickle 3.1.3 replaces every shipped function's file name with
    ``"<dynamic-code>"`` to make its payloads deterministic. A remote traceback then
    shows no file and no source line, only ``File "<dynamic-code>", line 40``. Ray keeps
    the file name; so do we: a worker on the driver's host (or with the same path)
    shows the failing line, as ``linecache`` finds the file there.
    """
    func, args = _CLOUDPICKLE_CODE_REDUCE(code)
    if "<dynamic-code>" in args:
        args = tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)
    return func, args


_CLOUDPICKLE_CODE_REDUCE = cloudpickle.Pickler.dispatch_table.get(types.CodeType)


class _CodePickler(cloudpickle.Pickler):
    """``cloudpickle.Pickler`` whose shipped code keeps its file name (see above)."""

    if _CLOUDPICKLE_CODE_REDUCE is not None:
        dispatch_table = collections.ChainMap({types.CodeType: _code_reduce_keeping_filename},
                                              cloudpickle.Pickler.dispatch_table)


def snapshot(segments: list) -> list:
    """Copy segments so later changes to the caller's arrays cannot leak into them.

    Large buffers are copied into numpy allocations, which Linux backs with huge
    pages: about 4x faster than ``bytes()`` for 100 MB (14 ms against 57 ms here),
    almost all of it page faults. The copies are read-only, as Ray's ``put`` values are.
    """
    out: list = []
    for seg in segments:
        mv = memoryview(seg).cast("B")
        if mv.nbytes >= _OOB_MIN:
            import numpy as np

            buf = np.empty(mv.nbytes, dtype=np.uint8)
            np.copyto(buf, np.frombuffer(mv, dtype=np.uint8))
            out.append(buf.data.toreadonly())
        else:
            out.append(bytes(mv))
    return out


def loads(segments):
    """Inverse of :func:`dumps`. Raises :class:`CodeShippingError` for a module missing here."""
    try:
        return pickle.loads(segments[0], buffers=segments[1:])
    except ModuleNotFoundError as e:
        raise CodeShippingError(explain_import_error(e)) from None


def explain_import_error(e: ModuleNotFoundError) -> str:
    mod = e.name or str(e)
    return (
        f"module {mod!r} could not be imported in this process (pid {_pid()}), so the code "
        f"pickled by reference could not be loaded. Fix: install {mod!r} on every node "
        "(or put it on a path listed in the driver's sys.path), or ship it by value from "
        f"the driver with: import cloudpickle, {mod.split('.')[0]}; "
        f"cloudpickle.register_pickle_by_value({mod.split('.')[0]})"
    )


def _pid() -> int:
    import os

    return os.getpid()


def _pickles(obj) -> bool:
    try:
        cloudpickle.dumps(obj, protocol=5)
        return True
    except Exception:
        return False


def find_unpicklable(obj, path: str = "value", depth: int = 0) -> tuple[str, object]:
    """Walk into ``obj`` and return ``(path, part)`` for the innermost part that fails to pickle."""
    if depth >= 4:
        return path, obj
    children: list = []
    if isinstance(obj, (list, tuple)):
        children = [(f"{path}[{i}]", x) for i, x in enumerate(obj)]
    elif isinstance(obj, dict):
        children = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    else:
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            children = [(f"{path}.{k}", v) for k, v in attrs.items()]
    for sub_path, child in children:
        if not _pickles(child):
            return find_unpicklable(child, sub_path, depth + 1)
    return path, obj


def describe_pickle_failure(obj, exc: BaseException) -> str:
    try:
        path, part = find_unpicklable(obj)
        shown = repr(part)
    except Exception:  # a value too deep to walk or repr (RecursionError): say less
        path, part = "value", obj
        shown = f"<{type(obj).__qualname__} object>"
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return (
        f"{path} cannot be pickled: {type(exc).__name__}: {exc}. The offending object is "
        f"{shown} (type {type(part).__qualname__}). Pass something picklable instead, e.g. "
        "create the resource inside the actor or task rather than passing it in."
    )
