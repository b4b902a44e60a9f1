"""How a remote exception travels: encoded by the worker, rebuilt at the caller.

The exception is pickled on its own, inside an envelope of plain strings (its type
name, its traceback text, where it was raised). So an exception that cannot be
rebuilt on the caller's side (a constructor with extra required arguments, a class
the caller cannot import) still arrives as a ``TaskError`` carrying the type name,
the message and the remote traceback, instead of replacing them with the caller's own
unpickling error.
"""

from __future__ import annotations

import pickle
import traceback

import cloudpickle

from ..errors import TaskError
from .serialization import dumps, loads

__all__ = ["encode_error", "decode_error"]


def _cause_bytes(exc: BaseException) -> bytes | None:
    try:
        data = cloudpickle.dumps(exc, protocol=5)
        pickle.loads(data)  # must also rebuild: E(a, b) pickles but cannot unpickle
        return data
    except Exception:
        return None


def encode_error(exc: BaseException, where: str) -> list:
    """Frame segments describing ``exc``; never raises for a strange exception."""
    try:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception as e:  # formatting ran user code (__str__) that failed
        tb = f"{type(exc).__name__} (its message could not be formatted: {e!r})\n"
    return dumps((_cause_bytes(exc), type(exc).__name__, tb, where))


def decode_error(segments) -> TaskError:
    """The ``TaskError`` for segments made by :func:`encode_error`; an instance of the
    remote exception's class too when that class can be rebuilt here."""
    cause_bytes, type_name, tb, where = loads(segments)
    cause = None
    if cause_bytes is not None:
        try:
            cause = pickle.loads(cause_bytes)
        except Exception as e:  # e.g. its module is not importable in this process
            tb = f"{tb.rstrip()}\n(the {type_name} could not be rebuilt here: {e!r})\n"
    return TaskError(cause, tb, where, type_name).as_instanceof_cause()
