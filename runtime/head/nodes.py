"""The head's table of nodes: who joined, where they listen, what they hold, and whether
they are still alive.

Liveness is judged by *missed heartbeat intervals* counted on the head's own ticks
(:meth:`NodeTable.tick`), not by wall seconds since the last beat: a head whose loop was
starved wakes up to one missed interval, not to every node dead at once. Any frame from a
node counts as a sign of life (:meth:`NodeRecord.heard`).

Pure state with no I/O: the head's shell aborts a dead node's connection and tells the
cores (``server.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["NodeRecord", "NodeTable"]


class NodeRecord:
    """One node daemon: its address, its resources (total and free now), its actors."""

    def __init__(self, info: dict, conn: Connection):
        self.node_id = info["node_id"]
        self.address = info["address"]
        self.total = dict(info["resources"])
        self.available = dict(info["resources"])
        self.pid = info.get("pid")
        self.conn = conn
        self.alive = True
        self.last_heartbeat = time.monotonic()   # last time anything arrived from it
        self.missed = 0                          # head ticks since then
        self.actors: set[str] = set()

    def heard(self) -> None:
        self.last_heartbeat = time.monotonic()
        self.missed = 0

    def public(self) -> dict:
        return {"node_id": self.node_id, "address": self.address, "alive": self.alive,
                "resources": dict(self.total), "available": dict(self.available),
                "heartbeat_age_s": round(time.monotonic() - self.last_heartbeat, 3),
                "pid": self.pid, "num_actors": len(self.actors)}


class NodeTable:
    """Every node that ever joined, in the order they joined (dead ones included, as
    ``ddlf.nodes()`` lists them)."""

    def __init__(self, dead_after_missed: int):
        self.dead_after_missed = dead_after_missed
        self.nodes: dict[str, NodeRecord] = {}
        self._alive: list[NodeRecord] | None = None   # cached: placement asks all the time

    def register(self, info: dict, conn: Connection) -> NodeRecord:
        """Add the node ``info`` describes (``node_id``, ``address``, ``resources``)."""
        rec = NodeRecord(info, conn)
        self.nodes[rec.node_id] = rec
        self._alive = None
        return rec

    def get(self, node_id: str) -> NodeRecord | None:
        return self.nodes.get(node_id)

    def alive(self) -> list[NodeRecord]:
        """The live nodes, in the order they joined (SPREAD's round-robin order)."""
        if self._alive is None:
            self._alive = [n for n in self.nodes.values() if n.alive]
        return self._alive

    def dead_count(self) -> int:
        return len(self.nodes) - len(self.alive())

    def mark_dead(self, node: NodeRecord) -> bool:
        """Mark ``node`` dead; False if it already was."""
        if not node.alive:
            return False
        node.alive = False
        self._alive = None
        return True

    def tick(self) -> list[NodeRecord]:
        """Count one heartbeat interval for every live node; the nodes now silent for more
        than ``dead_after_missed`` intervals in a row (the caller declares them dead)."""
        silent = []
        for n in self.alive():
            n.missed += 1
            if n.missed > self.dead_after_missed:
                silent.append(n)
        return silent

    def totals(self) -> list[dict]:
        """Each live node's total resources (what drivers check demands against)."""
        return [dict(n.total) for n in self.alive()]

    def public(self) -> list[dict]:
        return [n.public() for n in self.nodes.values()]

    def cluster_resources(self) -> dict:
        return _sum(n.total for n in self.alive())

    def available_resources(self) -> dict:
        return _sum(n.available for n in self.alive())


def _sum(dicts) -> dict:
    """Resource dicts added up, without the per-node ``node:<ip>`` markers."""
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            if k.startswith("node:"):
                continue
            out[k] = out.get(k, 0.0) + v
    return out
