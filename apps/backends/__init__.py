"""Where the training apps' actors run: DDLF (the default) or Ray.

    from ddlf_actors.apps import backends
    backend = backends.select(config.backend)     # a Backend: remote, get, put, wait ...

This is the one place that picks a backend; nothing else in ``apps/`` asks which one it
has. ``select(None)`` is Ray after ``ddlf.init(backend="ray")`` (until
``ddlf.shutdown()``) and DDLF otherwise. Inside a trainer, :func:`here` is the backend
the trainer's own process runs on.
"""

from __future__ import annotations

import sys

from ddlf_actors import ray_session

from .base import Backend, current

__all__ = ["Backend", "select", "here", "NAMES"]

NAMES = ("ddlf", "ray")
_instances: dict = {}


def select(name: str | Backend | None = None) -> Backend:
    """The backend named ``name`` (``"ddlf"`` or ``"ray"``); for None, the one
    ``ddlf.init`` chose; a :class:`Backend` instance as it is (the tests' in-process
    ``FakeBackend``). ``ValueError`` for another name; ``RayNotInstalledError`` (an
    ``ImportError``) for ``"ray"`` without Ray."""
    if isinstance(name, Backend):
        return name
    if name is None:
        name = "ray" if ray_session.chosen() else "ddlf"
    if name not in NAMES:
        raise ValueError(f"backend must be one of {', '.join(map(repr, NAMES))}, got {name!r}")
    backend = _instances.get(name)
    if backend is None:
        if name == "ray":
            from .ray import RayBackend

            ray_session.import_ray()   # fail here, by name, if Ray is not installed
            backend = RayBackend()
        else:
            from .ddlf import DDLFBackend

            backend = DDLFBackend()
        _instances[name] = backend
    return backend


def here() -> Backend:
    """The backend of the process this runs in: Ray in a Ray worker (Ray is imported and
    connected there), else DDLF; inside an in-process actor, its fake backend. A trainer
    uses it to ask for its node's id and to call its peers (allreduce's ring)."""
    local = getattr(current, "backend", None)
    if local is not None:
        return local
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return select("ray")
    return select("ddlf")
