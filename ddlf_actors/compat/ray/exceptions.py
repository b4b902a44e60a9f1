"""``ray.exceptions`` over DDLF's error classes.

Where DDLF raises an equivalent error, the Ray name is an alias of DDLF's class, so
``except ray.exceptions.RayActorError`` catches DDLF's ``ActorDiedError``. Ray errors
with no DDLF counterpart are defined here with Ray's hierarchy (``RayError`` is
``DDLFError``); DDLF never raises them, but code that catches them still runs.
"""

from __future__ import annotations

from ddlf_actors.errors import (
    ActorDiedError,
    ActorNameTakenError,
    ActorPlacementGroupRemovedError,
    AuthenticationError,
    DDLFError,
    GetTimeoutError,
    TaskCancelledError,
    TaskError,
    TaskPlacementGroupRemovedError,
    UnschedulableError,
    WorkerCrashedError,
)

from ._missing import missing

# -- the same thing in both ----------------------------------------------------------------
RayError = DDLFError
RayTaskError = TaskError
# DDLF has one error for a dead actor; Ray's base class and its "died" subclass are both it.
RayActorError = ActorDiedError
ActorDiedError = ActorDiedError
GetTimeoutError = GetTimeoutError
WorkerCrashedError = WorkerCrashedError
AuthenticationError = AuthenticationError
TaskCancelledError = TaskCancelledError
ActorAlreadyExistsError = ActorNameTakenError
ActorPlacementGroupRemoved = ActorPlacementGroupRemovedError
TaskPlacementGroupRemoved = TaskPlacementGroupRemovedError
# DDLF raises one UnschedulableError for tasks and actors alike.
TaskUnschedulableError = UnschedulableError
ActorUnschedulableError = UnschedulableError


# -- Ray errors DDLF never raises (kept so that code catching them runs) -------------------
class RaySystemError(DDLFError):
    """An internal failure of the system (DDLF raises its own, more specific errors)."""

    def __init__(self, client_exc=None, traceback_str=None):
        super().__init__(client_exc)
        self.client_exc = client_exc
        self.traceback_str = traceback_str


class ActorUnavailableError(ActorDiedError):
    """Ray: the actor is temporarily unreachable. DDLF reports a lost actor as died."""


class ObjectLostError(DDLFError):
    """Ray: an object's value was lost. DDLF keeps values with their owner."""


class OwnerDiedError(ObjectLostError):
    pass


class ObjectFetchTimedOutError(ObjectLostError):
    pass


class ObjectFreedError(ObjectLostError):
    pass


class ObjectReconstructionFailedError(ObjectLostError):
    pass


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    pass


class ObjectStoreFullError(DDLFError):
    pass


class OutOfMemoryError(DDLFError):
    pass


class OutOfDiskError(DDLFError):
    pass


class NodeDiedError(DDLFError):
    pass


class LocalRayletDiedError(DDLFError):
    pass


class PendingCallsLimitExceeded(DDLFError):
    pass


class RuntimeEnvSetupError(DDLFError):
    pass


class CrossLanguageError(DDLFError):
    pass


class AsyncioActorExit(DDLFError):
    pass


class ActorHandleNotFoundError(DDLFError, ValueError):
    pass


class ObjectRefStreamEndOfStreamError(DDLFError):
    pass


class OufOfBandObjectRefSerializationException(DDLFError):
    pass


class PlasmaObjectNotAvailable(DDLFError):
    pass


class RpcError(DDLFError):
    pass


class UnserializableException(DDLFError):
    pass


class UserCodeException(DDLFError):
    pass


class RayChannelError(RaySystemError):
    pass


class RayChannelTimeoutError(RayChannelError, TimeoutError):
    pass


class RayCgraphCapacityExceeded(RaySystemError):
    pass


class RayDirectTransportError(RaySystemError):
    pass


class StreamingGeneratorReplayInconsistentError(RaySystemError):
    pass


__all__ = [
    "RayError", "RayTaskError", "RayActorError", "ActorDiedError", "ActorUnavailableError",
    "GetTimeoutError", "WorkerCrashedError", "AuthenticationError", "ActorAlreadyExistsError",
    "TaskUnschedulableError", "ActorUnschedulableError", "RaySystemError",
    "TaskCancelledError", "ObjectLostError", "OwnerDiedError", "ObjectFetchTimedOutError",
    "ObjectFreedError", "ObjectReconstructionFailedError", "ReferenceCountingAssertionError",
    "ObjectStoreFullError", "OutOfMemoryError", "OutOfDiskError", "NodeDiedError",
    "LocalRayletDiedError", "PendingCallsLimitExceeded", "RuntimeEnvSetupError",
    "CrossLanguageError", "AsyncioActorExit", "ActorPlacementGroupRemoved",
    "TaskPlacementGroupRemoved", "ActorHandleNotFoundError", "ObjectRefStreamEndOfStreamError",
    "OufOfBandObjectRefSerializationException", "PlasmaObjectNotAvailable", "RpcError",
    "UnserializableException", "UserCodeException", "RayChannelError",
    "RayChannelTimeoutError", "RayCgraphCapacityExceeded", "RayDirectTransportError",
    "StreamingGeneratorReplayInconsistentError",
]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"exceptions.{name}")
