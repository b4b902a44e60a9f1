"""The error hierarchy shared by the runtime and the public API (re-exported as ``ddlf.errors``)."""

from __future__ import annotations

__all__ = [
    "DDLFError",
    "TaskError",
    "ActorDiedError",
    "WorkerCrashedError",
    "GetTimeoutError",
    "AuthenticationError",
    "TLSConfigError",
    "FrameError",
    "ConnectionLostError",
    "HeadUnreachableError",
    "UnschedulableError",
    "SerializationError",
    "CodeShippingError",
    "VersionMismatchError",
    "ActorExit",
    "ActorNameTakenError",
    "PlacementGroupRemovedError",
    "ActorPlacementGroupRemovedError",
    "TaskPlacementGroupRemovedError",
    "TaskCancelledError",
    "MessageError",
]


class DDLFError(Exception):
    """Base class of every error DDLF raises."""


class AuthenticationError(DDLFError):
    """A peer did not prove it holds the cluster token (or we could not prove it to the peer)."""


class TLSConfigError(DDLFError):
    """The TLS certificate, key or CA given to DDLF cannot be used (the message says which and why)."""


class FrameError(DDLFError):
    """A malformed or oversized frame arrived; the connection that carried it is aborted."""


class ConnectionLostError(DDLFError):
    """A connection closed while a request on it was outstanding."""


class HeadUnreachableError(DDLFError, ConnectionError):
    """No DDLF head answers at the address given to ``ddlf.init`` (nothing listens there,
    the host is unknown or unreachable, or it did not answer in time).

    Also a ``ConnectionError``, so ``except ConnectionError`` (or ``OSError``) written for
    the bare ``ConnectionRefusedError`` of earlier versions still catches it. ``address``
    is the ``host:port`` tried; the message says how to start a head there.
    """

    def __init__(self, message: str, address: str | None = None):
        super().__init__(message)
        self.address = address

    def __reduce__(self):
        return (type(self), (str(self), self.address))


class GetTimeoutError(DDLFError, TimeoutError):
    """``ddlf.get`` timed out before every requested object was ready."""


class UnschedulableError(DDLFError):
    """An actor or task asks for more resources than any node in the cluster has."""


class SerializationError(DDLFError, TypeError):
    """An argument or return value cannot be pickled (the message names which one)."""


class CodeShippingError(DDLFError):
    """Code pickled by reference on the caller could not be imported on the worker."""


class VersionMismatchError(DDLFError):
    """A peer runs a different DDLF or Python version than the head."""


class ActorDiedError(DDLFError):
    """The actor's process died (or was killed) before or while running this call.

    ``cause`` holds the creation error when the actor died in ``__init__``.
    """

    def __init__(self, message: str = "the actor died", cause: BaseException | None = None):
        super().__init__(message)
        self.cause = cause

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.cause))


class WorkerCrashedError(DDLFError):
    """The worker process running a task died before the task finished."""


class TaskCancelledError(DDLFError):
    """The task or actor call was cancelled with ``ddlf.cancel`` before it finished.

    ``ddlf.get`` raises it for a call cancelled while it was queued, or while it ran and
    the cancellation reached it. When the worker itself settles the call as cancelled
    (it was interrupted there), ``get`` raises a ``TaskError`` that is also a
    ``TaskCancelledError``, as Ray's ``RayTaskError(TaskCancelledError)`` is.
    """


class TaskError(DDLFError):
    """An exception raised by remote code, re-raised at ``get``.

    ``remote_traceback`` is the traceback text from the worker; ``cause`` is the original
    exception when it could be pickled. ``as_instanceof_cause()`` returns an instance that is
    also of the cause's class, so ``except ValueError`` catches a remote ``ValueError``.
    """

    def __init__(
        self,
        cause: BaseException | None,
        remote_traceback: str,
        where: str = "",
        cause_type_name: str = "",
    ):
        self.cause = cause
        self.remote_traceback = remote_traceback
        self.where = where
        self.cause_type_name = cause_type_name or (type(cause).__name__ if cause else "Exception")
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"{self.cause_type_name} raised in {self.where or 'remote code'}"
        return f"{head}\n\nRemote traceback:\n{self.remote_traceback.rstrip()}"

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self):
        return (TaskError, (self.cause, self.remote_traceback, self.where, self.cause_type_name))

    def as_instanceof_cause(self) -> TaskError:
        """Return an equivalent error that is also an instance of the cause's class."""
        cause = self.cause
        if cause is None or isinstance(cause, TaskError):
            return self
        if not isinstance(cause, Exception):
            # SystemExit, KeyboardInterrupt, GeneratorExit: a caller that does not catch
            # them would stop (a remote sys.exit(1) would end the driver with status 0).
            return self
        cls = _dual_class(type(cause))
        if cls is None:
            return self
        err = cls.__new__(cls)
        # BaseException.__new__ doesn't run __init__: set what both bases need.
        err.args = cause.args
        err.cause = cause
        err.remote_traceback = self.remote_traceback
        err.where = self.where
        err.cause_type_name = self.cause_type_name
        try:
            err.__dict__.update({k: v for k, v in vars(cause).items() if k not in err.__dict__})
        except TypeError:
            pass
        return err


_dual_classes: dict[type, type[TaskError] | None] = {}


def _dual_class(cause_cls: type) -> type[TaskError] | None:
    """A class deriving from both TaskError and ``cause_cls``, or None where Python forbids it."""
    if cause_cls in _dual_classes:
        return _dual_classes[cause_cls]
    try:
        cls = type(
            f"TaskError({cause_cls.__name__})",
            (TaskError, cause_cls),
            {
                "__init__": lambda self, *a, **k: None,
                "__str__": TaskError.__str__,
                "__reduce__": TaskError.__reduce__,
                "__module__": __name__,
            },
        )
    except TypeError:  # final classes, or instance layouts that cannot be combined
        cls = None
    _dual_classes[cause_cls] = cls
    return cls


class ActorExit(SystemExit):
    """Raised by ``ddlf.actor.exit_actor()``: the actor ends on purpose and is not restarted.

    Like any ``SystemExit`` raised in an actor method, it ends the actor's process; the
    call that raised it, and calls still queued, fail with ``ActorDiedError``.
    """

    def __init__(self):
        super().__init__(0)


class ActorNameTakenError(DDLFError, ValueError):
    """``name=`` is already held by a live (or just reserved) actor; also a ``ValueError``.

    Raised by the head; it lives here, not in the head's module, so that it reaches the
    driver as this very class (the head runs as ``__main__``).
    """


class PlacementGroupRemovedError(DDLFError):
    """The placement group an actor or task was scheduled in has been removed."""


class ActorPlacementGroupRemovedError(PlacementGroupRemovedError, ActorDiedError):
    """The actor's placement group was removed, which killed the actor (also an
    ``ActorDiedError``, so code that handles dead actors handles this too)."""

    def __init__(self, message: str = "the actor's placement group was removed",
                 cause: BaseException | None = None):
        ActorDiedError.__init__(self, message, cause)


class TaskPlacementGroupRemovedError(PlacementGroupRemovedError):
    """The task's placement group was removed before the task could run."""


class MessageError(DDLFError):
    """A peer sent a control message that is malformed (a field missing or of the wrong
    type). The request it came with fails with this error; the server carries on."""
