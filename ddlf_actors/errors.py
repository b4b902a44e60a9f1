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
    "FrameError",
    "UnschedulableError",
    "SerializationError",
    "CodeShippingError",
    "VersionMismatchError",
]
