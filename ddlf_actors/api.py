"""Starting, stopping and talking to a cluster: ``init``, ``get``, ``wait``, ``put`` ..."""

from __future__ import annotations

from ddlf_actors.runtime import context
from ddlf_actors.runtime.client.generators import ObjectRefGenerator
from ddlf_actors.runtime.client.object_ref import ObjectRef

from .actor import ActorClass, ActorHandle
from .autoinit import ClusterInfo, init, is_initialized, shutdown
from .autoinit import core as _core
from .remote_function import RemoteFunction

__all__ = [
    "init", "shutdown", "is_initialized", "remote", "get", "wait", "put", "kill", "cancel",
    "get_actor", "nodes", "cluster_resources", "available_resources", "get_gpu_ids",
    "ClusterInfo",
]

def remote(*args, **options):
    """Make a class an actor class, or a function a remote function.

    Use bare (``@ddlf.remote``) or with options (``@ddlf.remote(num_cpus=1, ...)``).
    """
    if len(args) == 1 and not options and callable(args[0]):
        return _make_remote(args[0], {})
    if args:
        raise TypeError("use @ddlf.remote or @ddlf.remote(option=value, ...)")
    return lambda obj: _make_remote(obj, options)


def _make_remote(obj, options):
    if isinstance(obj, type):
        return ActorClass(obj, options)
    if callable(obj):
        return RemoteFunction(obj, options)
    raise TypeError(f"@ddlf.remote applies to classes and functions, not {type(obj).__name__}")


def get(refs, *, timeout: float | None = None):
    """Block until the value(s) are ready and return them (a list keeps its order).

    Raises the remote error (a ``TaskError``, also an instance of the remote exception's
    class), ``ActorDiedError``, or ``GetTimeoutError`` after ``timeout`` seconds.
    """
    core = _core()
    if isinstance(refs, ObjectRef):
        return core.get([refs], timeout)[0]
    if isinstance(refs, (list, tuple)):
        return core.get(list(refs), timeout)
    raise TypeError(f"ddlf.get expects an ObjectRef or a list of them, got {type(refs).__name__}")


def wait(refs, *, num_returns: int = 1, timeout: float | None = None):
    """Return ``(ready, not_ready)`` once ``num_returns`` refs are ready or ``timeout`` passes.

    Both lists keep the order of ``refs``.
    """
    if isinstance(refs, ObjectRef) or not isinstance(refs, (list, tuple)):
        raise TypeError("ddlf.wait expects a list of ObjectRefs")
    refs = list(refs)
    if len(set(refs)) != len(refs):
        raise ValueError("ddlf.wait got the same ObjectRef more than once")
    if not 0 <= num_returns <= len(refs):
        raise ValueError(f"num_returns must be between 0 and len(refs)={len(refs)}, got {num_returns}")
    return _core().wait(refs, num_returns, timeout)


def put(value) -> ObjectRef:
    """Store ``value`` once; the ref can be passed to many calls (shipped once per worker)."""
    return _core().put(value)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kill an actor's process now. Its pending and later calls raise ``ActorDiedError``."""
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"ddlf.kill expects an ActorHandle, got {type(actor).__name__}")
    _core().kill_actor(actor._actor_id, no_restart)


def cancel(ref: ObjectRef | ObjectRefGenerator, *, force: bool = False,
           recursive: bool = True) -> None:
    """Cancel the task or actor call whose result ``ref`` is; returns at once.

    * Not started yet (queued here, waiting for its arguments, or queued on its worker):
      it never runs, and ``get(ref)`` raises ``TaskCancelledError``.
    * A running task: ``KeyboardInterrupt`` is raised in it (a thread blocked in a C call
      such as ``time.sleep`` sees it when that call returns); if it lets it propagate,
      ``get`` raises ``TaskCancelledError``, and if it catches it and returns, that value
      stands. ``force=True`` ends its worker process instead (``get`` raises
      ``TaskCancelledError``; other tasks queued on that worker run elsewhere).
    * A running async task or async actor method: its asyncio task is cancelled, and
      ``get`` raises ``TaskCancelledError`` even if it caught the ``CancelledError``.
    * A running sync actor method runs on; ``get_runtime_context().is_canceled()`` turns
      True in it, and ``get`` raises ``TaskCancelledError`` whatever it returns.
    * Finished already: nothing happens.

    A cancelled call is never retried. ``recursive=True`` also cancels the tasks and
    actor calls the cancelled call submitted whose results its process still holds
    (force applies to child tasks only). ``force=True`` on an actor call raises
    ``ValueError``: use ``ddlf.kill``. As in Ray, cancelling is best effort: a call that
    finishes before the cancel reaches its worker keeps its result. A generator call
    (an ``ObjectRefGenerator``) is cancelled only while it has not reached its worker.
    """
    if isinstance(ref, ObjectRefGenerator):
        ref = ref._generator_ref
    if not isinstance(ref, ObjectRef):
        raise TypeError(f"ddlf.cancel expects an ObjectRef, got {type(ref).__name__}; to end "
                        "an actor, use ddlf.kill(actor)")
    _core().cancel(ref, force, recursive)


def get_actor(name: str) -> ActorHandle:
    """Return a handle to the live actor created with ``name=``; ``ValueError`` if none."""
    view = _core().head_call("get_actor", name)
    if view is None:
        raise ValueError(f"no live actor named {name!r} in this cluster")
    return ActorHandle(view["actor_id"], view["class_name"], view["methods"] or {})


def get_gpu_ids() -> list:
    """The GPU ids assigned to the task or actor this runs in (what its
    ``CUDA_VISIBLE_DEVICES`` lists): ints, or strings when the node's GPUs came from
    ``CUDA_VISIBLE_DEVICES``. Empty in the driver and in work that asked for no GPUs,
    as in Ray."""
    ctx = context.current
    return list(ctx.gpu_ids) if ctx is not None else []


def nodes() -> list[dict]:
    """One dict per node: ``node_id``, ``address``, ``alive``, ``resources`` (and more)."""
    return _core(auto_init=False).head_call("nodes")


def cluster_resources() -> dict:
    """Total resources of the alive nodes, e.g. ``{"CPU": 2.0}``."""
    return _core(auto_init=False).head_call("cluster_resources")


def available_resources() -> dict:
    """Resources not reserved by actors or running tasks, e.g. ``{"CPU": 1.0}``."""
    return _core(auto_init=False).head_call("available_resources")


# Silence "imported but unused" for names re-exported by the package.
_ = (RemoteFunction,)
