"""The process's current core: set by ``ddlf.init`` in a driver, joined on first use in a worker.

A module of its own, importing nothing of the runtime, so that the modules the core is
built from (refs, out-of-band fetches, the worker's call context) can find the process's
core without importing ``core`` (which imports them: an import cycle). A worker tells it
how to join its cluster (:func:`set_joiner`) when it starts; a driver has no joiner and
gets a core only from ``ddlf.init``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .core import Core

__all__ = ["get_core", "set_core", "set_joiner"]

_core: Core | None = None
_lock = threading.Lock()
_joiner: Callable[[], Core | None] | None = None


def set_core(core: Core | None) -> None:
    """Make ``core`` the process's core (None: there is none, after ``shutdown``)."""
    global _core
    _core = core


def set_joiner(joiner: Callable[[], Core | None] | None) -> None:
    """How this process connects a core on first use (a worker: to its own cluster); the
    joiner returns None when it cannot join (no worker context any more)."""
    global _joiner
    _joiner = joiner


def get_core(auto: bool = True) -> Core | None:
    """The current core, or None. With ``auto``, a worker without one joins its cluster on
    first use (as Ray workers do); a driver never gets one here (it calls ``ddlf.init``)."""
    if _core is not None or not auto or _joiner is None:
        return _core
    with _lock:
        if _core is None:
            core = _joiner()
            if core is not None:
                set_core(core)
    return _core
