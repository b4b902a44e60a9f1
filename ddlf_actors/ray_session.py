"""A Ray session for DDLF's training apps: ``ddlf.init(backend="ray", address=...)``.

DDLF's schemes can run their trainers on Ray actors (``ddlf_actors.apps.backends``).
This module is the one place that starts, joins and stops Ray for them, so that
``ddlf.init(backend="ray")``, ``train_sync(..., backend="ray")`` and ``ddlf-train run
--backend ray`` start Ray the same way:

- ``address=None``: a local Ray instance on this machine with ``num_cpus`` CPUs
  (default ``os.cpu_count()``, as DDLF's embedded cluster), no dashboard, Ray's own
  INFO lines hidden; the trainers' output still reaches the driver's terminal
  (``log_to_driver``), as on DDLF. It is stopped by :func:`stop`.
- ``address="auto"``, ``"ray://host:10001"`` (Ray Client) or ``"host:6379"``: join that
  cluster (``ray start --head`` there). ``ddlf-actors`` must be importable on its nodes
  (installed, or shipped with ``runtime_env={"py_modules": [...]}``).

A Ray session someone else started (``ray.init()`` before us) is used as it is and never
stopped here. Ray is imported only when asked for: ``pip install "ddlf-actors[ray]"``.
"""

from __future__ import annotations

import logging
import os
import threading

__all__ = ["start", "stop", "chosen", "ensure", "import_ray", "RayNotInstalledError",
           "RayUnreachableError"]

_lock = threading.RLock()
_chosen = False            # ddlf.init(backend="ray") was called and not shut down since
_owner: str | None = None  # who here called ray.init ("init", "run" ...): stop(owner) ends it


class RayNotInstalledError(ImportError):
    """``backend="ray"`` without Ray installed."""


class RayUnreachableError(ConnectionError):
    """No Ray cluster answers at the address given; the message says how to start one."""


def import_ray():
    """The ``ray`` module; ``RayNotInstalledError`` naming the extra to install if absent."""
    try:
        import ray
    except ImportError as e:
        raise RayNotInstalledError(
            f"backend='ray' needs Ray, which is not importable here ({e}): "
            "pip install 'ddlf-actors[ray]' (or pip install 'ray[default]')") from None
    return ray


def start(address: str | None = None, *, num_cpus: float | None = None,
          runtime_env: dict | None = None, log_to_driver: bool = True,
          ignore_reinit_error: bool = False, owner: str = "init", **ray_kwargs) -> dict:
    """Start or join Ray for this process (see the module docstring) and return what
    ``ray.init`` returned (its ``address_info`` dict; empty if Ray was running already).

    ``owner="init"`` (``ddlf.init(backend="ray")``) also makes Ray the training apps'
    backend until ``ddlf.shutdown()``. Another owner (``"run"``: a run that asked for
    Ray; a test's or a benchmark's name) only starts it. ``stop(owner)`` stops Ray only
    if that owner started it: a session found running is never stopped here.

    Raises ``RayNotInstalledError`` without Ray, ``ValueError`` for ``num_cpus`` with an
    address (a running cluster's CPUs are its nodes'), and ``RayUnreachableError`` (a
    ``ConnectionError``) naming the address and how to start a head there.
    """
    global _chosen, _owner
    ray = import_ray()
    with _lock:
        if ray.is_initialized():
            if owner == "init" and _chosen and not ignore_reinit_error:
                from .errors import AlreadyInitializedError

                raise AlreadyInitializedError(
                    "ddlf.init(backend='ray') was already called in this process; pass "
                    "ignore_reinit_error=True, or ddlf.shutdown() first")
            _chosen = _chosen or owner == "init"
            return {}
        if address is not None and num_cpus is not None:
            raise ValueError("num_cpus describes a local Ray instance; a running Ray cluster "
                             "has its nodes' CPUs (give them to `ray start` on each host)")
        if address not in (None, "auto", "local"):
            _probe(address)
        kw = dict(ray_kwargs)
        kw.setdefault("include_dashboard", False)
        kw.setdefault("logging_level", logging.WARNING)   # Ray's start-up banner, not errors
        if address is None:
            kw["num_cpus"] = num_cpus if num_cpus is not None else os.cpu_count() or 1
            # No network but the cluster's own: do not try to report usage to Ray's servers.
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        before = _children()
        try:
            ctx = ray.init(address=address, runtime_env=runtime_env,
                           log_to_driver=log_to_driver, **kw)
        except BaseException as e:
            # A local start that fails part-way ("The current node timed out during
            # startup" on a loaded machine) leaves the GCS and raylet it had started
            # running, listening beyond loopback, and the next start finds them.
            _stop_what_init_started(ray, before)
            if not isinstance(e, ConnectionError):
                raise
            raise RayUnreachableError(
                f"could not reach a Ray cluster at {address!r} ({e}). Start one there with "
                "`ray start --head` (Ray Client listens on ray://<host>:10001), or run "
                "without an address for a local Ray instance") from None
        _chosen = _chosen or owner == "init"
        _owner = owner
        return dict(getattr(ctx, "address_info", None) or {})


def _children() -> set:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_what_init_started(ray, before: set, grace_s: float = 5.0) -> None:
    """After a failed ``ray.init``: ``ray.shutdown()``, then end the Ray processes this
    process gained during the attempt (by pid; none that was there before, and none
    whose command line does not name Ray: another thread may be starting processes of
    its own), so a failed start leaves nothing running."""
    import psutil

    from .runtime.process import terminate_then_kill

    try:
        ray.shutdown()
    except Exception as e:   # noqa: BLE001
        # Safe to drop: the start already failed and its error is what the caller sees;
        # the processes are ended by pid below whatever shutdown managed.
        logging.getLogger(__name__).debug("ray.shutdown() after a failed start: %r", e)
    new = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in before and "ray" in " ".join(p.cmdline()).lower():
                new.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    terminate_then_kill(new, grace_s)


def _probe(address: str) -> None:
    """Fail in seconds when nothing listens at ``address``: Ray itself retries an
    unreachable GCS for minutes, printing a warning every few seconds."""
    import socket

    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r}: use 'auto', 'ray://host:10001' (Ray Client) "
                         "or 'host:port' (a Ray head's GCS, port 6379 by default)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise RayUnreachableError(
            f"could not reach a Ray cluster at {address!r}: {host}:{port} does not answer "
            f"({e.strerror or e}). Start one there with `ray start --head` (Ray Client "
            "listens on ray://<host>:10001), or run without an address for a local Ray "
            "instance") from None


def ensure() -> bool:
    """A Ray session for a run that asked for ``backend="ray"``: the current one if this
    process has one, else a local instance (:func:`start`). True if this call started it,
    so the caller calls ``stop("run")`` when the run ends."""
    ray = import_ray()
    with _lock:
        if ray.is_initialized():
            return False
        start(owner="run")
        return True


def stop(owner: str = "init") -> None:
    """``ray.shutdown()`` if ``owner``'s :func:`start` started or joined Ray (stopping a
    local instance and every process it started); ``"init"`` (``ddlf.shutdown()``) also
    ends Ray's turn as the apps' backend. A no-op for a session someone else started."""
    global _chosen, _owner
    with _lock:
        if owner == "init":
            _chosen = False
        if _owner is not None and _owner == owner:
            _owner = None
            import ray

            ray.shutdown()


def chosen() -> bool:
    """True between ``ddlf.init(backend="ray")`` and ``ddlf.shutdown()``: training apps
    that name no backend then run on Ray."""
    return _chosen
