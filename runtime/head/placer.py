"""Placements that wait: the head's loop side of the scheduler.

:class:`~.scheduler.Scheduler` answers at once whether a demand fits now. A demand that
can fit but has no room now waits here until resources are given back or a node joins
(:meth:`Placer.retry`), then asks again, as Ray's raylet queues a lease request. Giving
resources back goes through :meth:`Placer.free`, which also places waiting placement
groups and wakes every waiting placement. A client waits here for a group to be placed
(:meth:`Placer.wait_group`), and for a new head's first node (:meth:`Placer.first_node`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from .. import config
from ..scheduling import Scheduling
from ..states import GroupState
from .nodes import NodeTable
from .placement_groups import PlacementGroupManager
from .scheduler import Scheduler, WorkKind

__all__ = ["Placer"]

log = logging.getLogger("ddlf.head")


class Placer:
    def __init__(self, loop, nodes: NodeTable, groups: PlacementGroupManager,
                 scheduler: Scheduler):
        self.loop = loop
        self.nodes = nodes
        self.groups = groups
        self.scheduler = scheduler
        self.waiting: list = []   # futures of placements waiting for resources
        self._waiting_kinds: collections.Counter = collections.Counter()   # for the dashboard

    async def place(self, demand: dict, sched: Scheduling | None, kind: WorkKind,
                    what: str, load_key=None):
        """Reserve ``demand``; return (node, charge). Wait while it can fit but has no room
        now. Raises what ``Scheduler.try_place`` raises when it never can. Anything handed
        out per placement (device ids such as GPUs) belongs with the charge returned here,
        so that it is given back by :meth:`free` with the rest."""
        while True:
            got = self.scheduler.try_place(demand, sched, kind, what, load_key)
            if got is not None:
                return got
            fut = self.loop.create_future()
            self.waiting.append(fut)
            self._waiting_kinds[kind] += 1
            try:
                await fut
            finally:
                self._waiting_kinds[kind] -= 1

    async def first_node(self, timeout: float) -> bool:
        """Wait until a node has registered (ever), at most ``timeout`` s; whether one has.

        ``ddlf-node start --head`` starts the head's own node once the head serves, so a
        client that connects as the port opens would find no node and fail its first
        creation ("no live nodes"): the head holds its hello here instead, as Ray's driver
        waits for its raylet. A head whose nodes all died does not wait (it had nodes).
        """
        deadline = time.monotonic() + timeout
        while not self.nodes.nodes:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("a client waited %g s for a first node to register; none did",
                            timeout)
                return False
            fut = self.loop.create_future()
            self.waiting.append(fut)   # woken by retry(), which a node's registration calls
            try:
                await asyncio.wait_for(fut, left)
            except asyncio.TimeoutError:
                pass
        return True

    async def wait_group(self, group_id: str, timeout: float):
        """The group's table entry once it is CREATED or REMOVED, or after ``timeout`` s
        (at most ``WAIT_GROUP_MAX_S``); None for a group the head does not know."""
        deadline = time.monotonic() + min(float(timeout), config.WAIT_GROUP_MAX_S)
        while True:
            g = self.groups.get(group_id)
            if g is None:
                return None
            left = deadline - time.monotonic()
            if g.state in (GroupState.CREATED, GroupState.REMOVED) or left <= 0:
                return self.groups.view(g, self.nodes.alive())
            try:
                await asyncio.wait_for(g.changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    def waiting_for(self, kind: str) -> int:
        """How many placements of this ``WorkKind`` value ("actor", "task") wait now."""
        return sum(n for k, n in self._waiting_kinds.items() if k.value == kind)

    def place_groups(self) -> None:
        """Reserve the placement groups that wait and now fit."""
        for g in self.groups.place_waiting(self.nodes.alive()):
            log.info("placement group %s placed on %s", g.group_id,
                     # (a group just placed has every bundle reserved: no None here)
                     sorted({r.node.node_id for r in g.reservations if r is not None}))

    def retry(self) -> None:
        """Resources were freed or a node joined: place the groups that now fit, then let
        every waiting placement try again."""
        self.place_groups()
        waiting, self.waiting = self.waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    def free(self, charge, demand: dict) -> None:
        """Give ``demand`` back to what it was taken from (a node or a bundle reservation)."""
        self.scheduler.free(charge, demand)
        self.retry()
