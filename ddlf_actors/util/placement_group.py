"""Placement groups: reserve bundles of resources across nodes, all at once, as in Ray.

    pg = ddlf.util.placement_group([{"CPU": 1}] * 4, strategy="SPREAD")
    ddlf.get(pg.ready(), timeout=30)          # every bundle reserved
    Trainer.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
    ddlf.util.remove_placement_group(pg)      # kills its actors, frees its bundles

The head reserves all of a group's bundles or none. A group that does not fit now stays
``PENDING`` and is placed as soon as it fits (resources freed, a node joined), as in
Ray, including a group too big for every node alive now (Ray waits for its autoscaler;
DDLF waits for a node to join, and warns). ``pg.wait(timeout)`` and ``ddlf.get(pg.ready(),
timeout=...)`` bound the wait. A group belongs to the driver (or worker) that created
it and is removed when that process disconnects, unless ``lifetime="detached"``.
"""

from __future__ import annotations

import warnings

from ddlf_actors import autoinit
from ddlf_actors.runtime import context, placement
from ddlf_actors.runtime.client.core import ref_from_async
from ddlf_actors.runtime.errors import PlacementGroupRemovedError
from ddlf_actors.runtime.states import GroupState
from ddlf_actors.runtime.wire import rpc

__all__ = ["PlacementGroup", "placement_group", "remove_placement_group", "get_placement_group",
           "placement_group_table", "get_current_placement_group"]

_POLL_S = 30.0   # one long poll of the head while ready() waits


def _core():
    return autoinit.core()


class PlacementGroup:
    """A handle to a placement group: pass it to ``PlacementGroupSchedulingStrategy``, to
    tasks and to actors freely (it pickles as its id and bundles)."""

    def __init__(self, id: str, bundle_specs: list[dict]):
        self.id = id
        self.bundle_specs = [dict(b) for b in bundle_specs]

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def ready(self):
        """An ``ObjectRef`` that resolves to this group once every bundle is reserved, or
        raises ``PlacementGroupRemovedError`` if the group is removed first."""
        core = _core()
        group = self

        async def until_placed():
            while True:
                view = await rpc.call(core.head, "wait_placement_group", group.id, _POLL_S)
                state = GroupState(view["state"]) if view else GroupState.REMOVED
                if state is GroupState.CREATED:
                    return group
                if state is GroupState.REMOVED:
                    raise PlacementGroupRemovedError(
                        f"placement group {group.id} was removed before all its bundles "
                        "were reserved")

        return ref_from_async(core, until_placed)

    def wait(self, timeout_seconds: float = 30) -> bool:
        """True once every bundle is reserved; False if that did not happen in time."""
        if not isinstance(timeout_seconds, (int, float)) or timeout_seconds < 0:
            raise ValueError(f"timeout_seconds must be a number >= 0, got {timeout_seconds!r}")
        core = _core()
        left = float(timeout_seconds)
        while True:
            chunk = min(left, _POLL_S)
            view = core.head_call("wait_placement_group", self.id, chunk, timeout=chunk + 30)
            if view is None or view["state"] == GroupState.REMOVED:
                return False
            if view["state"] == GroupState.CREATED:
                return True
            left -= chunk
            if left <= 0:
                return False

    def __eq__(self, other):
        return isinstance(other, PlacementGroup) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        # A summary, not the list: a group of 99 bundles would print 99 dicts.
        return f"PlacementGroup({self.id}, {placement.describe_bundles(self.bundle_specs)})"


def placement_group(bundles: list[dict], strategy: str = "PACK", name: str = "",
                    lifetime: str | None = None, _max_cpu_fraction_per_node=None,
                    _soft_target_node_id=None, bundle_label_selector=None) -> PlacementGroup:
    """Reserve ``bundles`` (a list of ``{resource: amount}``) with ``strategy``:

    * ``"PACK"`` (default): on as few nodes as possible, one if it fits;
    * ``"SPREAD"``: on different nodes where possible;
    * ``"STRICT_PACK"``: all on one node;
    * ``"STRICT_SPREAD"``: each on a different node.

    Returns at once; the group is reserved when it fits (``ready()``, ``wait()``).
    ``name`` makes it reachable with :func:`get_placement_group`. ``lifetime="detached"``
    keeps it after its creator disconnects. ``ValueError`` for bad bundles or strategy.
    """
    bundles = placement.check_bundles(bundles)
    strategy = placement.check_strategy(strategy).value
    if lifetime not in (None, "detached"):
        raise ValueError(f"lifetime must be None or 'detached', got {lifetime!r}")
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    for key, value in (("_max_cpu_fraction_per_node", _max_cpu_fraction_per_node),
                       ("_soft_target_node_id", _soft_target_node_id),
                       ("bundle_label_selector", bundle_label_selector)):
        if value is not None:
            raise NotImplementedError(f"placement_group({key}=...) is not supported by DDLF")
    reply = _core().head_call("create_placement_group", {
        "bundles": bundles, "strategy": strategy, "name": name,
        "detached": lifetime == "detached"})
    if reply.get("infeasible"):
        warnings.warn(
            f"placement group {reply['id']} ({strategy}, bundles "
            f"{placement.describe_bundles(bundles)}) cannot fit the nodes alive now; it "
            "stays pending until a node that can hold it joins. "
            "Remove it with remove_placement_group(), or reserve smaller bundles.",
            stacklevel=2)
    return PlacementGroup(reply["id"], bundles)


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Remove the group: its actors are killed (their calls raise
    ``ActorPlacementGroupRemovedError``), its tasks that wait fail with
    ``TaskPlacementGroupRemovedError``, and its bundles are freed."""
    if not isinstance(placement_group, PlacementGroup):
        raise TypeError(f"remove_placement_group expects a PlacementGroup, got "
                        f"{type(placement_group).__name__}")
    _core().head_call("remove_placement_group", placement_group.id)


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """The live group created with ``name=placement_group_name``; ``ValueError`` if none."""
    view = _core().head_call("get_placement_group", placement_group_name)
    if view is None:
        raise ValueError(f"no placement group named {placement_group_name!r} in this cluster")
    return PlacementGroup(view["placement_group_id"],
                          [view["bundles"][i] for i in sorted(view["bundles"])])


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict:
    """Ray's table: for one group, ``{"placement_group_id", "name", "bundles",
    "bundles_to_node_id", "strategy", "state", ...}``; with no group, id -> that dict
    for every group (removed ones included, state ``"REMOVED"``)."""
    core = _core()
    if placement_group is None:
        return core.head_call("placement_group_table")
    return core.head_call("placement_group_table", placement_group.id) or {}


def get_current_placement_group() -> PlacementGroup | None:
    """The group the calling actor or task runs in; None in a driver or outside a group."""
    ctx = context.current
    current = ctx.placement if ctx is not None else None
    if not current:
        return None
    return PlacementGroup(current["group_id"], current["bundles"])
