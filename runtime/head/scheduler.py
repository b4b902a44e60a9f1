"""The head's scheduling policy: which node (or placement group bundle) an actor or a
task lease takes its demand from.

A request is a demand (``{"CPU": 1.0, ...}``) and a :class:`~..scheduling.Scheduling`
(None: DEFAULT). :meth:`Scheduler.try_place` answers at once, in one of three ways:

* ``(node, charge)``: placed; the demand is taken out of ``charge``, the node itself or
  the bundle reservation it runs in, and goes back there with :meth:`Scheduler.free`;
* ``None``: it can fit but there is no room now; the caller waits for resources to be
  freed and asks again;
* it raises ``UnschedulableError`` when it can never fit (no live node is big enough, a
  hard affinity to a dead node), or a ``PlacementGroupRemovedError`` (the actor's or
  the task's kind, chosen by :class:`WorkKind`) when its group is gone.

:meth:`Scheduler.place_batch` places many requests in one pass (a burst of actor
creations): DEFAULT ones pick from a heap of the nodes' scores instead of scanning every
node for each. Pure state with no I/O.
"""

from __future__ import annotations

import heapq
from enum import Enum

from ..errors import (
    ActorPlacementGroupRemovedError,
    PlacementGroupRemovedError,
    TaskPlacementGroupRemovedError,
    UnschedulableError,
)
from ..placement import describe_bundles
from ..scheduling import (
    Scheduling,
    Strategy,
    add,
    choose_node,
    feasible_anywhere,
    fits,
    node_order,
    subtract,
)
from ..states import GroupState
from .nodes import NodeRecord, NodeTable
from .placement_groups import PlacementGroupManager

__all__ = ["WorkKind", "Scheduler"]


class WorkKind(Enum):
    """What is being placed: it decides which error a removed placement group raises."""

    ACTOR = "actor"
    TASK = "task"


def actor_load(node: NodeRecord) -> int:
    """DEFAULT's tie-break for actors: fewer actors first."""
    return len(node.actors)


class Scheduler:
    """Places demands on the live nodes of ``nodes`` and the bundles of ``groups``."""

    def __init__(self, nodes: NodeTable, groups: PlacementGroupManager):
        self.nodes = nodes
        self.groups = groups
        self._spread_next = 0   # SPREAD's round-robin cursor

    # -- one request -----------------------------------------------------------------------
    def try_place(self, demand: dict, sched: Scheduling | None, kind: WorkKind,
                  what: str | None = None, load_key=None):
        """``(node, charge)`` with ``demand`` taken out, None if it must wait; raises if it
        never can (see the module's docstring). ``what`` names the work in errors."""
        what = what or kind.value
        if sched is not None and sched.group_id:   # sched.in_group
            return self._try_place_in_group(demand, sched, sched.group_id, kind, what)
        nodes = self.nodes.alive()
        pin = sched.node_id if sched is not None else None
        if sched is not None and pin:
            target = [n for n in nodes if n.node_id == pin]
            if target and fits(demand, target[0].total):
                node = target[0]
                if fits(demand, node.available):
                    subtract(node.available, demand)
                    return node, node
                if sched.fail and not sched.soft:
                    raise UnschedulableError(
                        f"{what} is pinned to node {pin}, which has no room for {demand} now "
                        f"(free: {node.available}), and asked to fail rather than wait")
                if not (sched.soft and sched.spill):
                    return None   # as in Ray: a live node that can fit it is waited for
            elif not sched.soft:
                raise self.unschedulable(demand, what, target, pin)
            # soft: the node is gone or can never fit this demand; go anywhere.
        if not nodes or not feasible_anywhere(demand, [n.total for n in nodes]):
            raise self.unschedulable(demand, what, nodes)
        if sched is not None and sched.strategy is Strategy.SPREAD:
            node = self._spread_choice(demand, nodes)
        else:
            node = choose_node(demand, nodes, load_key)
        if node is None:
            return None
        subtract(node.available, demand)
        return node, node

    def _spread_choice(self, demand: dict, nodes: list):
        """Round-robin over the nodes with room, in the order they joined."""
        n = len(nodes)
        for k in range(n):
            node = nodes[(self._spread_next + k) % n]
            if fits(demand, node.available):
                self._spread_next = (self._spread_next + k + 1) % n
                return node
        return None

    def _try_place_in_group(self, demand: dict, sched: Scheduling, group_id: str, kind: WorkKind,
                            what: str):
        g = self.groups.get(group_id)
        if g is None or g.state == GroupState.REMOVED:
            cls = (ActorPlacementGroupRemovedError if kind is WorkKind.ACTOR
                   else TaskPlacementGroupRemovedError)
            raise cls(f"{what} was scheduled in placement group {group_id}, which "
                      "has been removed (remove_placement_group, or its owner exited)")
        index = sched.bundle_index
        if not -1 <= index < len(g.bundles):
            raise UnschedulableError(f"{what}: bundle index {index} is out of range for "
                                     f"placement group {g.group_id} ({len(g.bundles)} bundles)")
        specs = g.bundles if index == -1 else [g.bundles[index]]
        if not any(fits(demand, b) for b in specs):
            raise UnschedulableError(
                f"{what} asks for {demand}, more than its bundle of placement group "
                f"{g.group_id} reserves (bundles: {describe_bundles(specs)}). Lower its "
                "num_cpus/resources, or reserve a bigger bundle.")
        targets = g.reservations if index == -1 else [g.reservations[index]]
        for r in targets:
            if r is not None and r.alive and fits(demand, r.available):
                subtract(r.available, demand)
                return r.node, r
        return None   # the group is not placed yet, or its bundle is busy: wait

    def unschedulable(self, demand: dict, what: str, nodes, pin: str | None = None):
        """The error for a demand that no (live, or pinned) node can ever meet."""
        if pin and not nodes:
            n = self.nodes.get(pin)
            state = "is dead" if n is not None else "is not in this cluster"
            return UnschedulableError(
                f"{what} is pinned to node {pin}, which {state}. Pin it to a live node "
                "(see ddlf.nodes()), use a soft node affinity, or drop node_id=.")
        if not nodes:
            return UnschedulableError(
                f"{what} cannot be placed: the cluster has no live nodes "
                f"({self.nodes.dead_count()} dead). Start or restart a node (`ddlf-node "
                "start --address ...`), or, for an embedded cluster, ddlf.shutdown() and "
                "ddlf.init() again.")
        have = [n.total for n in nodes]
        return UnschedulableError(
            f"{what} asks for {demand}, more than any node has (nodes: {have}). "
            "Lower its num_cpus/resources, or add a node that has them.")

    # -- many requests at once ---------------------------------------------------------------
    def place_batch(self, requests: list, kind: WorkKind, load_key=None) -> list:
        """Place ``requests``, a list of ``(demand, sched, what)``, in order, as one
        :meth:`try_place` each would; one result per request: ``(node, charge)``, None
        (must wait) or the exception it raised.

        ``load_key(node)`` must count what this batch places on a node only once the
        caller records it (after this returns): placements made here are counted here.
        """
        out: list = []
        heap = _NodeHeap(self.nodes.alive(), load_key)
        feasible: dict = {}
        for demand, sched, what in requests:
            what = what or kind.value
            if sched is not None and (sched.in_group or sched.node_id
                                      or sched.strategy is not Strategy.DEFAULT):
                try:
                    got = self.try_place(demand, sched, kind, what, heap.load)
                except (UnschedulableError, PlacementGroupRemovedError) as e:
                    got = e
                if isinstance(got, tuple):
                    heap.changed(got[0])
                out.append(got)
                continue
            shape = tuple(sorted(demand.items()))
            ok = feasible.get(shape)
            if ok is None:
                ok = feasible[shape] = bool(heap.nodes) and feasible_anywhere(
                    demand, [n.total for n in heap.nodes])
            if not ok:
                out.append(self.unschedulable(demand, what, heap.nodes))
                continue
            node = heap.take(demand)
            if node is not None:
                subtract(node.available, demand)
                heap.changed(node)
                out.append((node, node))
            else:
                out.append(None)
        return out

    # -- giving back -----------------------------------------------------------------------
    @staticmethod
    def free(charge, demand: dict) -> None:
        """Give ``demand`` back to what it was taken from (a node or a bundle reservation),
        if that is still alive."""
        if charge is not None and charge.alive:
            add(charge.available, demand, charge.total)

    @staticmethod
    def take(charge, demand: dict) -> None:
        """Take ``demand`` out of ``charge`` again (a lent task resumed); it may go below
        zero for a while."""
        subtract(charge.available, demand)


class _NodeHeap:
    """The live nodes by DEFAULT's score, for one batch: the best node that fits a demand
    in O(log n), since a placement changes the score of one node only.

    Entries are ``(score..., join order, version, node)``; a node whose score changed
    gets a new entry with a new version, and older ones are skipped when popped.
    """

    def __init__(self, nodes: list, load_key):
        self.nodes = nodes
        self.load_key = load_key
        self.extra: dict = {}   # node -> placed by this batch (its load_key does not show it)
        self.version: dict = {}
        self.order = {id(n): i for i, n in enumerate(nodes)}
        self.heap = [self._entry(n) for n in nodes]
        heapq.heapify(self.heap)

    def load(self, node) -> int:
        return (self.load_key(node) if self.load_key else 0) + self.extra.get(node, 0)

    def _entry(self, n) -> tuple:
        return (*node_order(n, self.load(n)), self.order[id(n)], self.version.get(n, 0), n)

    def take(self, demand: dict):
        """Pop the best node that fits ``demand`` (None if none does); the caller takes
        the demand out of it and calls :meth:`changed`."""
        skipped = []
        node = None
        while self.heap:
            entry = heapq.heappop(self.heap)
            n = entry[-1]
            if entry[-2] != self.version.get(n, 0):
                continue   # an older score of a node that has a newer entry
            if fits(demand, n.available):
                node = n
                break
            skipped.append(entry)
        for entry in skipped:
            heapq.heappush(self.heap, entry)
        return node

    def changed(self, node, placed: bool = True) -> None:
        """``node``'s score changed: it took a request of this batch (``placed``, which
        its load does not show yet) or its free resources changed."""
        if id(node) not in self.order:
            return
        if placed:
            self.extra[node] = self.extra.get(node, 0) + 1
        self.version[node] = self.version.get(node, 0) + 1
        heapq.heappush(self.heap, self._entry(node))
