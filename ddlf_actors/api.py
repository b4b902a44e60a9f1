"""Starting, stopping and talking to a cluster: ``init``, ``get``, ``wait``, ``put`` ..."""

from __future__ import annotations

import atexit
import os
import threading

from ddlf_actors.runtime import config, context
from ddlf_actors.runtime import runtime_env as _runtime_env
from ddlf_actors.runtime.client.core import Core, get_core, set_core
from ddlf_actors.runtime.client.generators import ObjectRefGenerator
from ddlf_actors.runtime.client.object_ref import ObjectRef
from ddlf_actors.runtime.errors import DDLFError, HeadUnreachableError
from ddlf_actors.runtime.local_cluster import LocalCluster
from ddlf_actors.runtime.session import find_token, head_record, read_config
from ddlf_actors.runtime.wire.address import split_address

from .actor import ActorClass, ActorHandle
from .errors import AlreadyInitializedError
from .options import check_gpus, check_memory
from .remote_function import RemoteFunction

__all__ = [
    "init", "shutdown", "is_initialized", "remote", "get", "wait", "put", "kill", "cancel",
    "get_actor", "nodes", "cluster_resources", "available_resources", "get_gpu_ids",
    "ClusterInfo",
]

_lock = threading.RLock()
_info: ClusterInfo | None = None

# Set DDLF_AUTO_INIT=0 to make a missing ddlf.init() an error instead of starting a local
# cluster (Ray's RAY_ENABLE_AUTO_CONNECT=0), e.g. where a driver must join a real cluster.
_AUTO_INIT_ENV = "DDLF_AUTO_INIT"


class ClusterInfo:
    """What ``ddlf.init`` returns: where the head is, and the token to join it."""

    def __init__(self, address: str, token: str, embedded: bool):
        self.address = address
        self.token = token
        self.embedded = embedded

    def __repr__(self):
        kind = "embedded" if self.embedded else "connected"
        return f"ClusterInfo(address={self.address!r}, {kind})"


def init(address: str | None = None, *, num_cpus: float | None = None, token: str | None = None,
         resources: dict | None = None, ignore_reinit_error: bool = False,
         num_gpus: int | None = None, memory: float | None = None,
         runtime_env: dict | None = None) -> ClusterInfo:
    """Start an embedded local cluster (no ``address``) or connect to ``"host:port"``.

    The embedded cluster is a head and one node as child processes with ``num_cpus`` CPUs
    (default ``os.cpu_count()``), ``num_gpus`` GPUs (default: found from
    ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi``) and ``memory`` bytes (default: all); it
    stops at :func:`shutdown` or at interpreter exit. Calling ``init`` is optional: the
    first ``.remote()``, ``get``, ``put`` or ``wait`` starts an embedded cluster with the
    defaults.

    ``runtime_env`` (``env_vars``, ``working_dir``, ``py_modules``, ``excludes``) is the
    job's: every task and actor runs in it, merged under its own as in Ray. It is checked
    (and its directories packed) here: ``ValueError`` for a missing path,
    ``NotImplementedError`` for fields DDLF lacks such as ``pip``.

    A second call returns the current ``ClusterInfo`` when ``ignore_reinit_error=True``
    (its arguments are then ignored) and raises ``AlreadyInitializedError`` (a
    ``DDLFError`` and ``RuntimeError``) otherwise. ``AuthenticationError`` for a wrong token;
    ``HeadUnreachableError`` (also a ``ConnectionError``) when no head answers at
    ``address`` (or ``"auto"`` finds none on this host), naming how to start one.
    """
    global _info
    with _lock:
        if get_core(auto=False) is not None:
            if ignore_reinit_error:
                return _info
            raise AlreadyInitializedError(
                "ddlf.init() was already called in this process (perhaps implicitly, by a "
                "first .remote(), get, put or wait); pass ignore_reinit_error=True to "
                "ignore a second call, or call ddlf.shutdown() first to start or join "
                "another cluster")
        env_spec = _runtime_env.validate(runtime_env, "init(runtime_env=...)")
        if env_spec:
            _runtime_env.packed(env_spec)   # a folder over the size cap fails before any start
        if num_gpus is not None:
            check_gpus(num_gpus)
            if float(num_gpus) != int(num_gpus):
                raise ValueError(f"num_gpus={num_gpus!r}: a node has a whole number of GPUs")
        if memory is not None:
            check_memory(memory)
        # A driver holds a connection per actor it calls: do not stop at a soft limit of 1024.
        config.raise_open_file_limit()
        cluster = None
        if address is None:
            cluster = LocalCluster(num_cpus=num_cpus, token=token, resources=resources,
                                   num_gpus=num_gpus, memory=memory)
            address, token = cluster.address, cluster.token
        else:
            address, token = _resolve_address(address, token)
            if num_cpus is not None or resources or num_gpus is not None or memory is not None:
                raise ValueError("num_cpus, num_gpus, memory and resources describe an embedded "
                                 "cluster; give them to `ddlf-node start` on each host instead")
        core = Core(address, token, is_driver=True, cluster=cluster)
        try:
            core.connect()
            if env_spec:
                core.runtime_env = _runtime_env.for_call(core, env_spec)
        except BaseException:
            core.close()
            if cluster is not None:
                cluster.stop()
            raise
        set_core(core)
        _info = ClusterInfo(address, token, cluster is not None)
        return _info


def _resolve_address(address: str, token: str | None) -> tuple[str, str | None]:
    """Turn ``"auto"``, a cluster TOML file, or ``"host:port"`` into a head address + token."""
    if address == "auto":
        rec = head_record()
        if rec is None:
            raise HeadUnreachableError(
                "address='auto' found no DDLF head started on this host; start one with "
                "`ddlf-node start --head`, or pass address='host:port'", "auto")
        address = rec["address"]
    elif address.endswith(".toml") and os.path.isfile(address):
        hosts, ports = read_config(address)
        address = _first_reachable([f"{h}:{p}" for h, p in zip(hosts, ports)])
    if ":" not in address:
        raise ValueError(f"address must be 'host:port', 'auto' or a cluster .toml file, got {address!r}")
    return address, find_token(address, token)


def _first_reachable(addresses: list[str]) -> str:
    import socket

    for addr in addresses:
        try:
            socket.create_connection(split_address(addr), timeout=2).close()
            return addr
        except OSError:
            continue
    raise HeadUnreachableError(
        f"none of the hosts in the cluster file answers: {', '.join(addresses)}; start a head "
        "on one of them with `ddlf-node start --head --host HOST --port PORT`",
        ", ".join(addresses))


def shutdown() -> None:
    """Disconnect; stop the embedded cluster (and every actor it runs) if we started one."""
    global _info
    with _lock:
        core = get_core(auto=False)
        if core is None:
            return
        set_core(None)
        _info = None
        cluster = core.cluster
        if cluster is not None:
            core.stop_cluster(timeout=15)
        core.close()
        if cluster is not None:
            cluster.stop()


atexit.register(shutdown)


def is_initialized() -> bool:
    return get_core(auto=False) is not None


def _core(auto_init: bool = True) -> Core:
    """The process's core; with ``auto_init``, a driver without one starts a local cluster.

    As in Ray, calls that need a cluster to mean anything (``.remote()``, ``get``, ``put``,
    ``wait``, ``kill``, ``get_actor``) start one; questions about the cluster (``nodes``,
    ``cluster_resources``) do not. Inside a worker, ``get_core`` joins the worker's cluster.
    """
    core = get_core()
    if core is not None:
        return core
    if not auto_init:
        raise DDLFError("DDLF is not initialized: call ddlf.init() first")
    if os.environ.get(_AUTO_INIT_ENV, "") == "0":
        raise DDLFError(f"DDLF is not initialized and {_AUTO_INIT_ENV}=0 turns off starting a "
                        "local cluster on first use: call ddlf.init() first")
    with _lock:
        # Another thread may have started it while we waited for the lock.
        if get_core(auto=False) is None:
            init()
    return get_core(auto=False)


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


def cancel(ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
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
