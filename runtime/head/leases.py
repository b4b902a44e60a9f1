"""The head's task leases: workers lent to one caller for tasks of one demand.

A lease's demand is taken from its node (or from a placement group's bundle, its
*charge*) when it is granted and given back when it is returned. While its task waits
in ``get`` the lease is *lent*: its demand goes back early so that the tasks it waits for
can run (at most ``max_lent_per_node`` per node), and is taken again when the task
resumes.

Pure state with no I/O: the head's shell tells nodes to release or kill workers, and
gives demands back to their charges.
"""

from __future__ import annotations

import uuid

from .nodes import NodeRecord
from .placement_groups import Reservation

__all__ = ["LeaseRecord", "LeaseManager"]


class LeaseRecord:
    """A worker lent to one caller for tasks, and what its demand was taken from."""

    __slots__ = ("lease_id", "node", "charge", "demand", "worker_id", "owner", "lent")

    def __init__(self, lease_id: str, node: NodeRecord, charge, demand: dict, worker_id: str,
                 owner: str | None):
        self.lease_id = lease_id
        self.node = node
        self.charge = charge      # the node, or a placement group's bundle reservation
        self.demand = demand
        self.worker_id = worker_id
        self.owner = owner
        self.lent = False         # its task waits in get: its demand is given back for now


class LeaseManager:
    """Every lease granted and not yet returned, by lease id and by worker id."""

    def __init__(self, max_lent_per_node: int):
        self.max_lent_per_node = max_lent_per_node
        self.leases: dict[str, LeaseRecord] = {}
        self._by_worker: dict[str, LeaseRecord] = {}
        self._lent_on: dict[NodeRecord, int] = {}   # node -> how many of its leases are lent
        self.granted = 0                              # leases granted since the head started

    def grant(self, node: NodeRecord, charge, demand: dict, worker_id: str,
              owner: str | None) -> LeaseRecord:
        lease = LeaseRecord(uuid.uuid4().hex[:12], node, charge, demand, worker_id, owner)
        self.leases[lease.lease_id] = lease
        self._by_worker[worker_id] = lease
        self.granted += 1
        return lease

    def pop(self, lease_id: str) -> LeaseRecord | None:
        """Forget the lease. The caller gives its demand back unless it was lent (then it
        already was)."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return None
        if self._by_worker.get(lease.worker_id) is lease:
            del self._by_worker[lease.worker_id]
        if lease.lent:
            self._count_lent(lease.node, -1)
        return lease

    def of_worker(self, worker_id: str) -> LeaseRecord | None:
        return self._by_worker.get(worker_id)

    def lend(self, worker_id: str) -> LeaseRecord | None:
        """The lease whose task now waits in get, if its demand may be lent out (the
        caller gives it back to its charge); None if not leased, already lent, or its node
        lends as many as it may already (that task keeps its CPU)."""
        lease = self._by_worker.get(worker_id)
        if lease is None or lease.lent:
            return None
        if self._lent_on.get(lease.node, 0) >= self.max_lent_per_node:
            return None
        lease.lent = True
        self._count_lent(lease.node, 1)
        return lease

    def unlend(self, worker_id: str) -> LeaseRecord | None:
        """The lent lease whose task resumed (the caller takes its demand again)."""
        lease = self._by_worker.get(worker_id)
        if lease is None or not lease.lent:
            return None
        lease.lent = False
        self._count_lent(lease.node, -1)
        return lease

    def _count_lent(self, node: NodeRecord, delta: int) -> None:
        n = self._lent_on.get(node, 0) + delta
        if n > 0:
            self._lent_on[node] = n
        else:
            self._lent_on.pop(node, None)

    # -- queries: which leases end with a node, a worker, an owner or a group ----------------
    def on_node(self, node: NodeRecord) -> list[LeaseRecord]:
        return [lease for lease in self.leases.values() if lease.node is node]

    def owned_by(self, owner: str) -> list[LeaseRecord]:
        return [lease for lease in self.leases.values() if lease.owner == owner]

    def charged_to_group(self, group) -> list[LeaseRecord]:
        """The leases that draw on one of ``group``'s bundle reservations."""
        return [lease for lease in self.leases.values()
                if isinstance(lease.charge, Reservation) and lease.charge.group is group]
