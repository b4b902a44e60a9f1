"""DDLF's exceptions (defined in the runtime, re-exported here under their public names)."""

from ddlf_actors.runtime.errors import (
    ActorDiedError,
    AuthenticationError,
    CodeShippingError,
    DDLFError,
    FrameError,
    GetTimeoutError,
    SerializationError,
    TaskError,
    TLSConfigError,
    UnschedulableError,
    VersionMismatchError,
    WorkerCrashedError,
)

__all__ = [
    "DDLFError",
    "TaskError",
    "ActorDiedError",
    "WorkerCrashedError",
    "GetTimeoutError",
    "AuthenticationError",
    "TLSConfigError",
    "FrameError",
    "UnschedulableError",
    "SerializationError",
    "CodeShippingError",
    "VersionMismatchError",
    "ActorNameTakenError",
    "AlreadyInitializedError",
]


class AlreadyInitializedError(DDLFError, RuntimeError):
    """``ddlf.init`` was called twice; also a ``RuntimeError``, as Ray's is.

    Only the driver API raises it, so it lives here rather than in the runtime.
    """


class ActorNameTakenError(DDLFError, ValueError):
    """``name=`` is already held by a live (or just reserved) actor; also a ``ValueError``.

    The head raises its own class of this name; run as ``python -m``, its class lives in
    the head's ``__main__`` and reaches the driver as an unrelated class. ``ddlf`` turns it
    into this one, so ``except ddlf.errors.ActorNameTakenError`` works.
    """


def _is_name_taken(exc: BaseException) -> bool:
    return isinstance(exc, ValueError) and type(exc).__name__ == "ActorNameTakenError"
