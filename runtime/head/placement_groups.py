"""The head's placement groups: bundles of resources reserved together, and what work
draws on them.

The head keeps one :class:`Group` per placement group. A group reserves all of its
bundles at once or none of them (:func:`plan` finds nodes for every bundle against the
nodes' free resources; :meth:`Group.commit` then subtracts them in one step, with no await
in between). A bundle placed on a node is a :class:`Reservation`: actors and tasks
scheduled in the group take their demand out of it instead of the node's free pool, and
give it back there. A reservation whose node dies is dropped and its bundle is placed
again (``RESCHEDULING``), as Ray does. :class:`PlacementGroupManager` holds the groups,
their names, and which ones wait to be placed.

Everything here is pure bookkeeping with no I/O, so it is tested without processes. The
caller's checks of bundles and strategies are in ``runtime/placement.py``.
"""

from __future__ import annotations

import asyncio
import uuid

from ..errors import DDLFError
from ..placement import PlacementStrategy, total_of
from ..scheduling import add, fits, subtract
from ..states import GroupSchedulingState, GroupState

__all__ = ["Group", "Reservation", "PlacementGroupManager", "plan"]


class PlacementGroupManager:
    """Every placement group, oldest first; the ones waiting to be placed; their names.

    Removed groups stay listed (``placement_group_table``) up to ``keep_removed``, the
    oldest forgotten first.
    """

    def __init__(self, keep_removed: int):
        self.keep_removed = keep_removed
        self.groups: dict[str, Group] = {}
        self.waiting: dict[str, Group] = {}   # PENDING or RESCHEDULING ones
        self.names: dict[str, str] = {}       # name -> group id

    def get(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def named(self, name: str) -> Group | None:
        group_id = self.names.get(name)
        return self.groups[group_id] if group_id is not None else None

    def create(self, bundles: list[dict], strategy: PlacementStrategy, name: str,
               owner: str | None, detached: bool) -> Group:
        """A new PENDING group, waiting to be placed; ``DDLFError`` if ``name`` is taken."""
        if name and name in self.names:
            raise DDLFError(f"a placement group named {name!r} already exists; pick another "
                            "name, or get it with get_placement_group(name)")
        g = Group(uuid.uuid4().hex[:16], bundles, strategy, name, owner=owner,
                  detached=detached)
        self.groups[g.group_id] = g
        self.waiting[g.group_id] = g
        if name:
            self.names[name] = g.group_id
        return g

    def place_waiting(self, nodes: list) -> list[Group]:
        """Reserve every waiting group that now fits ``nodes`` (oldest first; one that does
        not fit does not hold up the others); the groups placed."""
        placed = []
        for g in list(self.waiting.values()):
            chosen = plan(g.bundles, g.strategy, nodes, g.placed_nodes())
            if chosen is not None:
                g.commit(chosen)
                del self.waiting[g.group_id]
                placed.append(g)
        return placed

    def node_died(self, node) -> list[Group]:
        """Drop the bundles reserved on ``node``; the groups that lost some (they wait to
        be placed again)."""
        hit = []
        for g in self.groups.values():
            if g.drop_node(node):
                self.waiting[g.group_id] = g
                hit.append(g)
        return hit

    def mark_removed(self, g: Group) -> None:
        """First step of removing ``g``: REMOVED, so that nothing more is placed in it (its
        work is killed next, while its bundles still hold what that work gives back)."""
        g.state = GroupState.REMOVED
        self.waiting.pop(g.group_id, None)
        if g.name and self.names.get(g.name) == g.group_id:
            self.names.pop(g.name, None)

    def release(self, g: Group) -> None:
        """Last step of removing ``g``: its bundles go back to their nodes, waiters wake,
        and the oldest removed groups beyond ``keep_removed`` are forgotten."""
        g.release()
        g.touch()
        removed = [gid for gid, x in self.groups.items() if x.state == GroupState.REMOVED]
        for gid in removed[:max(0, len(removed) - self.keep_removed)]:
            del self.groups[gid]

    def owned_by(self, owner: str) -> list[Group]:
        """The groups that go with ``owner`` (not detached, not removed yet)."""
        return [g for g in self.groups.values() if g.owner == owner and not g.detached
                and g.state != GroupState.REMOVED]

    # -- views -----------------------------------------------------------------------------
    @staticmethod
    def infeasible(g: Group, nodes: list) -> bool:
        """True if no amount of waiting lets ``g`` fit ``nodes`` (the live ones)."""
        return plan(g.bundles, g.strategy, nodes, use_total=True) is None

    def view(self, g: Group, nodes: list) -> dict:
        """``g.view()`` plus Ray's ``stats.scheduling_state``."""
        view = g.view()
        if g.state == GroupState.CREATED:
            state = GroupSchedulingState.FINISHED
        elif g.state == GroupState.REMOVED:
            state = GroupSchedulingState.REMOVED
        elif self.infeasible(g, nodes):
            state = GroupSchedulingState.INFEASIBLE
        else:
            state = GroupSchedulingState.NO_RESOURCES
        view["stats"] = {"scheduling_state": state.value}
        return view

    def table(self, nodes: list) -> dict:
        return {gid: self.view(g, nodes) for gid, g in self.groups.items()}


# -- a group and its reservations ------------------------------------------------------------
class Reservation:
    """One bundle placed on one node: what the group's actors and tasks draw on.

    It is a fresh object each time its bundle is placed, so resources given back to an
    old one (whose node died, or whose group was removed) never leak into the new one.
    Like a node record, it has ``total``, ``available`` and ``alive``.
    """

    def __init__(self, group: Group, index: int, node):
        self.group = group
        self.index = index
        self.node = node
        self.total = dict(group.bundles[index])
        self.available = dict(self.total)
        self.active = True

    @property
    def alive(self) -> bool:
        return self.active and self.node.alive


class Group:
    """One placement group: its bundles, and where each one is reserved (if it is)."""

    def __init__(self, group_id: str, bundles: list[dict], strategy: PlacementStrategy,
                 name: str = "", owner: str | None = None, detached: bool = False):
        self.group_id = group_id
        self.bundles = bundles
        self.strategy = strategy
        self.name = name
        self.owner = owner
        self.detached = detached
        self.state = GroupState.PENDING
        self.reservations: list[Reservation | None] = [None] * len(bundles)
        self.changed = asyncio.Event()

    def touch(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def placed_nodes(self) -> list:
        return [r.node if r is not None else None for r in self.reservations]

    def commit(self, nodes: list) -> None:
        """Take every missing bundle out of its planned node's free pool, all at once."""
        for i, node in enumerate(nodes):
            if self.reservations[i] is None:
                subtract(node.available, self.bundles[i])
                self.reservations[i] = Reservation(self, i, node)
        self.state = GroupState.CREATED
        self.touch()

    def release(self) -> None:
        """Give every reservation back to its node (the group is being removed)."""
        for i, r in enumerate(self.reservations):
            if r is not None:
                r.active = False
                if r.node.alive:
                    add(r.node.available, r.total, r.node.total)
                self.reservations[i] = None

    def drop_node(self, node) -> bool:
        """Forget the bundles placed on ``node`` (it died); True if there were any."""
        lost = False
        for i, r in enumerate(self.reservations):
            if r is not None and r.node is node:
                r.active = False
                self.reservations[i] = None
                lost = True
        if lost and self.state == GroupState.CREATED:
            self.state = GroupState.RESCHEDULING
            self.touch()
        return lost

    def view(self) -> dict:
        """Ray's ``placement_group_table`` entry for this group."""
        return {
            "placement_group_id": self.group_id, "name": self.name,
            "bundles": {i: dict(b) for i, b in enumerate(self.bundles)},
            "bundles_to_node_id": {i: r.node.node_id for i, r in enumerate(self.reservations)
                                   if r is not None},
            "strategy": self.strategy.value, "state": self.state.value,
            "is_detached": self.detached,
        }


# -- choosing nodes --------------------------------------------------------------------------
def plan(bundles: list[dict], strategy: PlacementStrategy, nodes: list, fixed: list | None = None,
         use_total: bool = False) -> list | None:
    """A node for every bundle, or None if the strategy cannot be met now.

    ``nodes`` have ``.available`` and ``.total``; ``fixed[i]`` is the node bundle ``i`` is
    already on (None: to be placed). With ``use_total`` the nodes count as empty: that
    answers "could this group ever fit this cluster?".

    * ``STRICT_PACK``: every bundle on one node.
    * ``PACK``: one node if possible, else as few as a greedy fill finds.
    * ``STRICT_SPREAD``: every bundle on a different node.
    * ``SPREAD``: different nodes where possible, shared ones otherwise.

    Bundles are placed largest first; the search is greedy, so a group that only an
    exhaustive search could fit (rare mixes of bundle sizes) waits instead.
    """
    out = list(fixed) if fixed is not None else [None] * len(bundles)
    todo = [i for i, n in enumerate(out) if n is None]
    if not todo:
        return out
    free = {id(n): dict(n.total if use_total else n.available) for n in nodes}
    order = sorted(nodes, key=lambda n: -free[id(n)].get("CPU", 0.0))   # stable: ties keep order
    used = [n for n in out if n is not None]
    todo.sort(key=lambda i: -sum(bundles[i].values()))

    def room(n, i):
        return fits(bundles[i], free[id(n)])

    def take(n, i):
        subtract(free[id(n)], bundles[i])
        out[i] = n
        if n not in used:
            used.append(n)

    if strategy in (PlacementStrategy.STRICT_PACK, PlacementStrategy.PACK):
        need = total_of(bundles[i] for i in todo)
        anchors = [n for n in order if n in used]
        candidates = anchors if strategy == PlacementStrategy.STRICT_PACK and anchors else (
            anchors + [n for n in order if n not in used])
        for n in candidates:
            if fits(need, free[id(n)]):
                for i in todo:
                    take(n, i)
                return out
        if strategy == PlacementStrategy.STRICT_PACK:
            return None
        for i in todo:
            n = next((n for n in order if n in used and room(n, i)), None) or next(
                (n for n in order if room(n, i)), None)
            if n is None:
                return None
            take(n, i)
        return out
    for i in todo:
        fresh = [n for n in order if n not in used and room(n, i)]
        if fresh:
            n = max(fresh, key=lambda n: free[id(n)].get("CPU", 0.0))
        elif strategy == PlacementStrategy.SPREAD:
            n = next((n for n in order if room(n, i)), None)
        else:
            n = None
        if n is None:
            return None
        take(n, i)
    return out
