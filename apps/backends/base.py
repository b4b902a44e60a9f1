"""What the training apps need from an actor runtime: the ``Backend`` interface.

``apps/`` talks to the runtime only through this (the schemes, the trainer pool, the
evaluation, the trainer itself), so the same schemes run their trainers on DDLF's actors
(:mod:`.ddlf`) or on Ray's (:mod:`.ray`). Both runtimes have Ray's shape, so each method
is the runtime's own call of the same name; what a backend adds is starting a session
and turning its runtime's errors into DDLF's.

The one rule that keeps the schemes backend-blind: a call whose actor is gone raises
``ddlf_actors.errors.ActorDiedError`` from :meth:`Backend.get` on every backend (with
``cause`` set when the actor's ``__init__`` raised), because that is what the pool
treats as a lost trainer (``pool.LOSS_ERRORS``).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

__all__ = ["Backend", "current"]

# The backend of code running inside an in-process actor (backends/fake.py sets it on its
# actors' threads): what ``backends.here()`` returns there.
current = threading.local()


class Backend:
    """One actor runtime. Subclasses implement every method; refs and handles are the
    runtime's own (``ObjectRef``, actor handles with ``.method.remote(...)``)."""

    #: "ddlf" or "ray": what ``backend=`` names it.
    name: str = ""
    #: Whether a run is published to the runtime's dashboard (``callbacks.DashboardPublisher``,
    #: through ``ddlf_actors.util.dashboard``): DDLF's head has one; Ray's does not take ours.
    publishes_runs: bool = False

    # -- the session --------------------------------------------------------------------------
    def ensure_session(self) -> bool:
        """Connect to the runtime, starting a local one if this process has none.
        True if this call started it: the caller then calls :meth:`shutdown` at the end."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop what :meth:`ensure_session` started."""
        raise NotImplementedError

    def is_initialized(self) -> bool:
        """True while this process has a session (nothing to kill without one)."""
        raise NotImplementedError

    # -- actors and objects -------------------------------------------------------------------
    def remote(self, cls: type, **options) -> Any:
        """``cls`` as an actor class with ``options`` (``num_cpus``, ``resources``,
        ``runtime_env`` ...): ``.options(...)``, ``.remote(*args)`` give handles."""
        raise NotImplementedError

    def get(self, refs, *, timeout: float | None = None):
        """The value(s) of ``refs``; ``ActorDiedError`` (DDLF's) when the actor is gone."""
        raise NotImplementedError

    def put(self, value) -> Any:
        """An object ref to ``value``, stored once and passed to many calls by reference."""
        raise NotImplementedError

    def wait(self, refs: Sequence, *, num_returns: int = 1,
             timeout: float | None = None) -> tuple[list, list]:
        """``(ready, not_ready)``: the first ``num_returns`` of ``refs`` done, in ``refs``
        order, within ``timeout`` seconds (None: no limit)."""
        raise NotImplementedError

    def kill(self, handle) -> None:
        """End the actor, without restart; its pending calls, and calls after it is gone,
        raise ``ActorDiedError``. Ray ends it asynchronously: a call sent at once may
        still run."""
        raise NotImplementedError

    # -- placement ----------------------------------------------------------------------------
    def placement_group(self, bundles: list[dict], strategy: str) -> Any:
        """Reserve ``bundles`` (``{"CPU": 1.0}`` ...) as a group; returns at once. The
        group has ``wait(timeout_s) -> bool``."""
        raise NotImplementedError

    def placement_group_table(self, group) -> dict:
        """The group's state: ``{"state": "PENDING" | "CREATED" | ..., "stats":
        {"scheduling_state": ..., ...}}``."""
        raise NotImplementedError

    def remove_placement_group(self, group) -> None:
        raise NotImplementedError

    def in_bundle(self, group, index: int) -> Any:
        """The ``scheduling_strategy`` option that places an actor in bundle ``index``."""
        raise NotImplementedError

    # -- the cluster --------------------------------------------------------------------------
    def nodes(self) -> list[dict]:
        """One dict per node, with at least ``node_id``, ``alive`` and ``resources``."""
        raise NotImplementedError

    def cluster_resources(self) -> dict:
        raise NotImplementedError

    def available_resources(self) -> dict:
        raise NotImplementedError

    def node_id(self) -> str | None:
        """The id of the node the calling code runs on (in a trainer: its node), as in
        :meth:`nodes`; None when not known."""
        raise NotImplementedError

    def __repr__(self):
        return f"<{self.name} backend>"
