"""The process's cluster session: ``init``, ``shutdown``, and starting one on first use.

A module of its own so that everything that needs the process's core (``api``, ``actor``,
``remote_function``, ``dag``, ``util``) imports it, and none of them imports ``api``:
``api`` builds on ``actor`` and ``remote_function``, which would otherwise import it back.
"""

from __future__ import annotations

import atexit
import json
import os
import threading

from ddlf_actors.runtime import config
from ddlf_actors.runtime import runtime_env as _runtime_env
from ddlf_actors.runtime.client.core import Core
from ddlf_actors.runtime.client.current import get_core, set_core
from ddlf_actors.runtime.errors import DDLFError, HeadUnreachableError
from ddlf_actors.runtime.local_cluster import LocalCluster
from ddlf_actors.runtime.session import find_token, head_record, read_config
from ddlf_actors.runtime.wire.address import split_address

from . import ray_session
from .errors import AlreadyInitializedError
from .options import check_gpus, check_memory

__all__ = ["init", "shutdown", "is_initialized", "ClusterInfo", "core"]

_lock = threading.RLock()
_info: ClusterInfo | None = None

# Set DDLF_AUTO_INIT=0 to make a missing ddlf.init() an error instead of starting a local
# cluster (Ray's RAY_ENABLE_AUTO_CONNECT=0), e.g. where a driver must join a real cluster.
_AUTO_INIT_ENV = "DDLF_AUTO_INIT"
# The cluster an init() without an address joins (Ray's RAY_ADDRESS), and the job's
# runtime_env (JSON) when init() is given none: `ddlf submit` sets both for its jobs, so a
# script that calls ddlf.init() runs on the cluster it was submitted to, with its files.
_ADDRESS_ENV = "DDLF_ADDRESS"
_RUNTIME_ENV_ENV = "DDLF_RUNTIME_ENV"


class ClusterInfo:
    """What ``ddlf.init`` returns: where the head is, the token to join it, and the URL of
    its web dashboard (None when it serves none)."""

    def __init__(self, address: str, token: str, embedded: bool,
                 dashboard_url: str | None = None):
        self.address = address
        self.token = token
        self.embedded = embedded
        self.dashboard_url = dashboard_url

    def __repr__(self):
        kind = "embedded" if self.embedded else "connected"
        dash = f", dashboard_url={self.dashboard_url!r}" if self.dashboard_url else ""
        return f"ClusterInfo(address={self.address!r}, {kind}{dash})"


def init(address: str | None = None, *, num_cpus: float | None = None, token: str | None = None,
         resources: dict | None = None, ignore_reinit_error: bool = False,
         num_gpus: int | None = None, memory: float | None = None,
         runtime_env: dict | None = None, dashboard: bool = False,
         dashboard_port: int = 8265, backend: str = "ddlf") -> ClusterInfo:
    """Start an embedded local cluster (no ``address``) or connect to ``"host:port"``.

    ``backend="ray"`` starts or joins Ray instead (``address`` ``None`` for a local Ray
    instance, ``"auto"``, ``"ray://host:10001"``; see ``ddlf_actors.ray_session``): the
    training apps (``train_sync``, ``train_async``) then run their trainers on Ray actors
    until :func:`shutdown`. DDLF's own calls (``ddlf.remote``, ``get`` ...) are not
    redirected to Ray: they raise ``DDLFError`` meanwhile rather than start a second
    cluster. ``RayNotInstalledError`` (an ``ImportError``) without Ray.

    The embedded cluster is a head and one node as child processes with ``num_cpus`` CPUs
    (default ``os.cpu_count()``), ``num_gpus`` GPUs (default: found from
    ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi``) and ``memory`` bytes (default: all); it
    stops at :func:`shutdown` or at interpreter exit. Calling ``init`` is optional: the
    first ``.remote()``, ``get``, ``put`` or ``wait`` starts an embedded cluster with the
    defaults.

    ``dashboard=True`` makes the embedded cluster's head serve the web dashboard on
    127.0.0.1 at ``dashboard_port`` (any free port if that one is taken) and prints its
    URL; it needs aiohttp (``pip install 'ddlf-actors[dashboard]'``), else ``ImportError``
    naming that command. ``ClusterInfo.dashboard_url`` says where it is (for a cluster
    joined by address, where its head serves one: ``ddlf-node start --head`` does).

    ``runtime_env`` (``env_vars``, ``working_dir``, ``py_modules``, ``excludes``) is the
    job's: every task and actor runs in it, merged under its own as in Ray. It is checked
    (and its directories packed) here: ``ValueError`` for a missing path,
    ``NotImplementedError`` for fields DDLF lacks such as ``pip``.

    A second call returns the current ``ClusterInfo`` when ``ignore_reinit_error=True``
    (its arguments are then ignored) and raises ``AlreadyInitializedError`` (a
    ``DDLFError`` and ``RuntimeError``) otherwise. ``AuthenticationError`` for a wrong token;
    ``HeadUnreachableError`` (also a ``ConnectionError``) when no head answers at
    ``address`` (or ``"auto"`` finds none on this host), naming how to start one.

    ``address`` may also be a cluster file that ``ddlf up`` started (``"cluster.yaml"``):
    the head's address and token are then asked of the head host over SSH, and the token
    stays in this process's memory. Without ``address``, ``DDLF_ADDRESS`` is joined when
    set (``ddlf submit`` sets it for its jobs, as Ray's jobs get ``RAY_ADDRESS``), and
    without ``runtime_env`` the JSON in ``DDLF_RUNTIME_ENV`` is the job's.
    """
    global _info
    if backend not in ("ddlf", "ray"):
        raise ValueError(f"backend must be 'ddlf' or 'ray', got {backend!r}")
    if backend == "ray":
        return _init_ray(address, num_cpus=num_cpus, token=token, resources=resources,
                         num_gpus=num_gpus, memory=memory, runtime_env=runtime_env,
                         ignore_reinit_error=ignore_reinit_error)
    if address is None and os.environ.get(_ADDRESS_ENV):
        address = os.environ[_ADDRESS_ENV]
    if runtime_env is None and os.environ.get(_RUNTIME_ENV_ENV):
        try:
            runtime_env = json.loads(os.environ[_RUNTIME_ENV_ENV])
        except ValueError as e:
            raise ValueError(f"{_RUNTIME_ENV_ENV} must be a JSON runtime_env: {e}") from None
    with _lock:
        if ray_session.chosen():
            raise AlreadyInitializedError(
                "ddlf.init(backend='ray') was called in this process: call ddlf.shutdown() "
                "before ddlf.init() of a DDLF cluster")
        current = get_core(auto=False)
        if current is not None:
            if ignore_reinit_error:
                # No _info in a worker, whose core joined its cluster on first use: describe
                # the cluster that core is connected to.
                return _info if _info is not None else ClusterInfo(
                    current.head_address, current.token, current.cluster is not None)
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
        if dashboard:
            if address is not None:
                raise ValueError("dashboard=True starts a dashboard with the embedded cluster; a "
                                 "head joined by address serves its own (`ddlf-node start "
                                 "--head --dashboard-port 8265`)")
            from ddlf_actors.runtime.head.dashboard import MISSING_MESSAGE, available

            if not available():
                raise ImportError(f"ddlf.init(dashboard=True): {MISSING_MESSAGE}")
            if not isinstance(dashboard_port, int) or not 0 < dashboard_port < 65536:
                raise ValueError(f"dashboard_port must be a port number (1-65535), got "
                                 f"{dashboard_port!r}")
        if address is None:
            cluster = LocalCluster(num_cpus=num_cpus, token=token, resources=resources,
                                   num_gpus=num_gpus, memory=memory,
                                   dashboard_port=dashboard_port if dashboard else 0)
            address, token = cluster.address, cluster.token
        else:
            address, token = _resolve_address(address, token)
            if num_cpus is not None or resources or num_gpus is not None or memory is not None:
                raise ValueError("num_cpus, num_gpus, memory and resources describe an embedded "
                                 "cluster; give them to `ddlf-node start` on each host instead")
        # No token found (None): the handshake then uses the empty key, which the head
        # refuses with an AuthenticationError that says how to pass its token.
        core = Core(address, token or "", is_driver=True, cluster=cluster)
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
        if cluster is not None:
            url = cluster.dashboard_url
        else:
            url = core.head_call("dashboard_url")
        _info = ClusterInfo(address, core.token, cluster is not None, url)
        if dashboard and url:
            import sys

            print(f"DDLF dashboard at {url}", file=sys.stderr, flush=True)
        return _info


def _init_ray(address, *, num_cpus, token, resources, num_gpus, memory, runtime_env,
              ignore_reinit_error) -> ClusterInfo:
    """``init(backend="ray")``: Ray for the training apps; see ``ray_session``."""
    global _info
    with _lock:
        if get_core(auto=False) is not None:
            raise AlreadyInitializedError(
                "this process is connected to a DDLF cluster: call ddlf.shutdown() before "
                "ddlf.init(backend='ray')")
        if token is not None:
            raise ValueError("token= is DDLF's cluster token; a Ray cluster has none to give")
        extra = {k: v for k, v in (("resources", resources), ("num_gpus", num_gpus),
                                   ("_memory", memory)) if v is not None}
        info = ray_session.start(address, num_cpus=num_cpus, runtime_env=runtime_env,
                                 ignore_reinit_error=ignore_reinit_error, **extra)
        where = info.get("address") or info.get("gcs_address") or address or "local"
        _info = ClusterInfo(f"ray:{where}", "", address is None)
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
    elif address.endswith((".yaml", ".yml")):
        from ddlf_actors.runtime import launch

        try:
            info = launch.connect(address)
        except launch.HostError as e:
            raise HeadUnreachableError(f"cluster file {address}: {e}", address) from None
        return info["address"], token or info["token"]
    if ":" not in address:
        raise ValueError(f"address must be 'host:port', 'auto', a cluster .toml file or the "
                         f"cluster.yaml of `ddlf up`, got {address!r}")
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
        if ray_session.chosen():
            _info = None
            ray_session.stop()
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
    """True after ``init`` (or a first call that started a cluster), until ``shutdown``;
    also while ``init(backend="ray")`` holds this process on Ray."""
    return get_core(auto=False) is not None or ray_session.chosen()


def core(auto_init: bool = True) -> Core:
    """The process's core; with ``auto_init``, a driver without one starts a local cluster.

    As in Ray, calls that need a cluster to mean anything (``.remote()``, ``get``, ``put``,
    ``wait``, ``kill``, ``get_actor``) start one; questions about the cluster (``nodes``,
    ``cluster_resources``) do not. Inside a worker, ``get_core`` joins the worker's cluster.
    """
    core = get_core()
    if core is not None:
        return core
    if ray_session.chosen():
        raise DDLFError("ddlf.init(backend='ray') put this process on Ray: DDLF's own calls "
                        "have no cluster (use ray.remote, ray.get ... there, or "
                        "ddlf.shutdown() and ddlf.init() for a DDLF cluster)")
    if not auto_init:
        raise DDLFError("DDLF is not initialized: call ddlf.init() first")
    if os.environ.get(_AUTO_INIT_ENV, "") == "0":
        raise DDLFError(f"DDLF is not initialized and {_AUTO_INIT_ENV}=0 turns off starting a "
                        "local cluster on first use: call ddlf.init() first")
    with _lock:
        # Another thread may have started it while we waited for the lock.
        core = get_core(auto=False)
        if core is None:
            init()
            core = get_core(auto=False)
        # init() sets the core or raises; shutdown() cannot run meanwhile (it takes _lock).
        assert core is not None
        return core
