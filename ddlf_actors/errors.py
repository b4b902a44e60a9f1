"""DDLF's exceptions (defined in the runtime, re-exported here under their public names)."""

from ddlf_actors.runtime.errors import (
    ActorDiedError,
    ActorNameTakenError,
    ActorPlacementGroupRemovedError,
    AuthenticationError,
    CodeShippingError,
    DDLFError,
    FrameError,
    GetTimeoutError,
    HeadUnreachableError,
    PlacementGroupRemovedError,
    SerializationError,
    TaskCancelledError,
    TaskError,
    TaskPlacementGroupRemovedError,
    TLSConfigError,
    UnschedulableError,
    VersionMismatchError,
    WorkerCrashedError,
)

__all__ = [
    "DDLFError",
    "TaskError",
    "TaskCancelledError",
    "ActorDiedError",
    "WorkerCrashedError",
    "GetTimeoutError",
    "HeadUnreachableError",
    "AuthenticationError",
    "TLSConfigError",
    "FrameError",
    "UnschedulableError",
    "SerializationError",
    "CodeShippingError",
    "VersionMismatchError",
    "ActorNameTakenError",
    "PlacementGroupRemovedError",
    "ActorPlacementGroupRemovedError",
    "TaskPlacementGroupRemovedError",
    "AlreadyInitializedError",
]


class AlreadyInitializedError(DDLFError, RuntimeError):
    """``ddlf.init`` was called twice; also a ``RuntimeError``, as Ray's is.

    Only the driver API raises it, so it lives here rather than in the runtime.
    """
