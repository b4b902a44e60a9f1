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
]
