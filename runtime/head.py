"""The head: the cluster's directory of nodes, actors, names and leases.

Drivers, nodes and workers all connect here first. The head places actors and task
leases on nodes by free resources, restarts actors that may be restarted, answers
"where is actor X now", and fans worker logs out to the drivers that own them. Calls
to actors never pass through it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid

from . import config, placement, process, rpc, scheduling
from .auth import generate_token, write_token_file
from .connection import serve
from .errors import (
    ActorNameTakenError,
    ActorPlacementGroupRemovedError,
    DDLFError,
    PlacementGroupRemovedError,
    TaskPlacementGroupRemovedError,
    UnschedulableError,
)
from .eventloop import new_event_loop
from .messages import (
    ActorCreation,
    ActorDeath,
    ActorLost,
    ActorStarted,
    ActorView,
    Heartbeat,
    LeaseGrant,
    LogBatch,
    MessageError,
    WorkerDied,
)
from .states import ActorState
from .taskgroup import TaskGroup

__all__ = ["Head", "main"]

log = logging.getLogger("ddlf.head")

# How often a refused push may be logged per kind (see Head._warn_limited).
_WARN_EVERY_S = 60.0

# Short names for the states this module compares against all the time.
PENDING, ALIVE, RESTARTING, DEAD = (ActorState.PENDING, ActorState.ALIVE, ActorState.RESTARTING,
                                    ActorState.DEAD)


class NodeRecord:
    def __init__(self, info: dict, conn):
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


class ActorRecord:
    def __init__(self, creation: ActorCreation | dict, owner: str | None):
        creation = ActorCreation.from_wire(creation)
        self.actor_id = creation.actor_id
        self.creation = creation   # kept to start it again on a restart
        self.name = creation.name
        self.class_name = creation.class_name
        self.demand = creation.demand
        # Where it may run (node affinity, SPREAD, a placement group's bundle).
        self.sched = creation.placement
        self.charge = None         # what its demand was taken from: its node, or a bundle
        self.restarts_left = int(creation.max_restarts or 0)
        self.detached = creation.detached
        self.owner = owner
        self.state = PENDING
        self.epoch = 0
        self.node: NodeRecord | None = None
        self.address = None
        self.pid = None
        self.worker_id = None
        self.death: ActorDeath | None = None   # why it is dead, once it is
        self.killed = False
        self.changed = asyncio.Event()

    @property
    def error(self) -> dict | None:
        return self.death.to_wire() if self.death is not None else None

    def view(self) -> dict:
        return ActorView(self.actor_id, self.state.value, self.epoch, self.address, self.pid,
                         self.name, self.class_name, self.error,
                         self.node.node_id if self.node else None, self.creation.methods,
                         self.creation.max_task_retries).to_wire()

    def touch(self):
        self.changed.set()
        self.changed = asyncio.Event()


class LeaseRecord:
    """A worker lent to one caller for tasks, and what its demand was taken from."""

    __slots__ = ("node", "charge", "demand", "worker_id", "owner")

    def __init__(self, node: NodeRecord, charge, demand: dict, worker_id: str, owner):
        self.node = node
        self.charge = charge      # the node, or a placement group's bundle reservation
        self.demand = demand
        self.worker_id = worker_id
        self.owner = owner


class Head:
    def __init__(self, loop, token: str, host: str = "127.0.0.1", port: int = 0):
        self.loop = loop
        self.token = token
        self.host = host
        self.port = port
        self.nodes: dict[str, NodeRecord] = {}
        self.actors: dict[str, ActorRecord] = {}
        self.names: dict[str, str] = {}
        # Names claimed at .remote() time, before the create_actor request arrives.
        self.reserved: dict[str, dict] = {}
        self.drivers: dict[str, object] = {}       # job id -> connection
        self.cores: set = set()                     # every driver and worker core
        self.leases: dict[str, LeaseRecord] = {}
        self.lent: set[str] = set()   # leases whose task waits in get; resources lent out
        self.pending: list[tuple] = []              # (demand, future) waiting for resources
        self.packages: dict[str, bytes] = {}        # runtime_env packages, by id, for nodes
        self.groups: dict[str, placement.Group] = {}   # placement groups, oldest first
        self.waiting_groups: dict[str, placement.Group] = {}   # PENDING or RESCHEDULING ones
        self.group_names: dict[str, str] = {}          # name -> group id
        self._spread_next = 0                          # SPREAD's round-robin cursor
        self.server = None
        self.stopping = False
        self.stopped = loop.create_future()
        self.handler = _HeadRpcHandler(self, self.rpc_handlers())
        self._pushes = self.push_handlers()
        self._warned: dict[str, tuple] = {}   # key -> (when last logged, how many skipped)
        self.background = TaskGroup(loop, "head")

    def rpc_handlers(self) -> dict:
        """Every request a driver, worker or node may send the head."""
        return {
            # registration
            "register_node": self.rpc_register_node,
            "hello_driver": self.rpc_hello_driver,
            # actors
            "reserve_name": self.rpc_reserve_name,
            "create_actor": self.rpc_create_actor,
            "wait_actor": self.rpc_wait_actor,
            "get_actor": self.rpc_get_actor,
            "kill_actor": self.rpc_kill_actor,
            "list_actors": self.rpc_list_actors,
            # task leases
            "lease_worker": self.rpc_lease_worker,
            "return_lease": self.rpc_return_lease,
            # placement groups
            "create_placement_group": self.rpc_create_placement_group,
            "remove_placement_group": self.rpc_remove_placement_group,
            "wait_placement_group": self.rpc_wait_placement_group,
            "placement_group_table": self.rpc_placement_group_table,
            "get_placement_group": self.rpc_get_placement_group,
            # runtime_env packages
            "has_package": self.rpc_has_package,
            "put_package": self.rpc_put_package,
            "get_package": self.rpc_get_package,
            # cluster information
            "nodes": self.rpc_nodes,
            "cluster_resources": self.rpc_cluster_resources,
            "available_resources": self.rpc_available_resources,
            "shutdown": self.rpc_shutdown,
        }

    async def start(self):
        self.server = await serve(self.host, self.port, self.token, self.handler)
        self.port = self.server.sockets[0].getsockname()[1]
        self.background.spawn(self._watch_nodes())

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- registration ------------------------------------------------------------------------
    def rpc_register_node(self, conn, info: dict):
        process.check_versions(info, f"node {info.get('address')}")
        rec = NodeRecord(info, conn)
        self.nodes[rec.node_id] = rec
        conn.info["node"] = rec
        log.info("node %s joined at %s with %s", rec.node_id, rec.address, rec.total)
        self._push_all_drivers("nodes_changed", self._node_totals())
        self._retry_pending()
        return {"head_address": self.address}

    def rpc_hello_driver(self, conn, info: dict):
        process.check_versions(info, "this driver")
        # job id: whose logs these are (workers calling actors inherit their driver's);
        # owner id: whose actors die with this connection.
        job_id = info.get("job_id") or uuid.uuid4().hex[:8]
        conn.info["owner_id"] = uuid.uuid4().hex[:8]
        self.cores.add(conn)
        if info.get("is_driver", True):
            self.drivers[job_id] = conn
            conn.info["job_id"] = job_id
        return {"job_id": job_id, "node_totals": self._node_totals()}

    def _node_totals(self) -> list[dict]:
        return [dict(n.total) for n in self.nodes.values() if n.alive]

    def push_handlers(self) -> dict:
        """Every one-way event a node, driver or worker may send the head."""
        return {
            "heartbeat": self._on_heartbeat,        # node
            "worker_died": self._on_worker_died,    # node
            "logs": self._on_logs,                  # node
            "task_blocked": self._on_task_blocked,  # a leased task waits in get
            "task_unblocked": self._on_task_unblocked,
            "release_name": self._on_release_name,  # a named actor was never created
        }

    def on_push(self, conn, event, data):
        fn = self._pushes.get(event) if isinstance(event, str) else None
        if fn is not None:   # an unknown event is ignored, as it always was
            fn(conn, data)

    def _on_heartbeat(self, conn, data):
        beat = Heartbeat.from_wire(data)
        node = conn.info.get("node")
        if node is None or node.node_id != beat.node_id:
            # Only a node speaks for itself: another peer with the token could otherwise
            # keep a hung node looking alive.
            self._warn_limited("heartbeat", "ignored a heartbeat for node %s from %s: only "
                               "that node's own connection may send it", beat.node_id,
                               conn.peer)
            return
        node.heard()

    def _on_worker_died(self, conn, data):
        died = WorkerDied.from_wire(data)
        node = conn.info.get("node")
        if node is None:
            # Only a node daemon sees its workers exit. From a driver or a worker (any
            # peer with the token) this push would restart or kill actors it does not own.
            self._warn_limited("worker_died", "ignored a worker_died push from %s: only a "
                               "registered node may send it", conn.peer)
            return
        self._worker_died(node, died)

    def _warn_limited(self, key: str, msg: str, *args) -> None:
        """``log.warning``, at most once per ``_WARN_EVERY_S`` for ``key``: a peer
        repeating a refused push must not flood the head's log."""
        now = time.monotonic()
        last, skipped = self._warned.get(key, (None, 0))
        if last is not None and now - last < _WARN_EVERY_S:
            self._warned[key] = (last, skipped + 1)
            return
        self._warned[key] = (now, 0)
        if skipped:
            msg += f" ({skipped} more like it not logged)"
        log.warning(msg, *args)

    def _on_logs(self, conn, data):
        batch = LogBatch.from_wire(data)
        if conn.info.get("node") is None:
            # Worker output reaches drivers only through the node that tails it; any
            # other peer could print lines in a driver's terminal under a worker's name.
            self._warn_limited("logs", "ignored a logs push from %s: only a registered node "
                               "may send worker output", conn.peer)
            return
        self._route_logs(batch)

    def _on_task_blocked(self, conn, data):
        self._lend(_field(data, "worker_id", "task_blocked"))

    def _on_task_unblocked(self, conn, data):
        self._unlend(_field(data, "worker_id", "task_unblocked"))

    def _on_release_name(self, conn, data):
        actor_id = _field(data, "actor_id", "release_name")
        r = self.reserved.get(actor_id)
        # Only the connection that reserved a name may give it back.
        if r is not None and r["owner"] == conn.info.get("owner_id"):
            self._unreserve(actor_id)

    def on_closed(self, conn, exc):
        node = conn.info.get("node")
        if node is not None:
            self._node_dead(node, "its node daemon disconnected")
        job_id = conn.info.get("job_id")
        if job_id is not None and self.drivers.get(job_id) is conn:
            self.drivers.pop(job_id, None)
        owner_id = conn.info.get("owner_id")
        if owner_id is not None:
            self.cores.discard(conn)
            self._owner_gone(owner_id)

    def _owner_gone(self, owner_id: str):
        # Actors and leases die with the connection that owns them (unless detached).
        for actor_id, r in list(self.reserved.items()):
            if r["owner"] == owner_id:
                self._unreserve(actor_id)
        for a in list(self.actors.values()):
            if a.owner == owner_id and not a.detached and a.state != DEAD:
                self._kill(a, "its owner (the driver or worker that created it) disconnected")
        for lease_id, lease in list(self.leases.items()):
            if lease.owner == owner_id:
                self._release_lease(lease_id)
        for g in list(self.groups.values()):
            if g.owner == owner_id and not g.detached:
                self._remove_group(g, "its owner (the driver or worker that created it) "
                                      "disconnected")

    async def _watch_nodes(self):
        """Count, per node, the heartbeat intervals in which nothing arrived from it.

        Misses are counted on this loop's own ticks rather than as seconds since the last
        beat: if the head itself was starved of CPU or stopped, its first tick afterwards
        counts one miss (possibly before it has read the beats waiting in its sockets),
        not "silent for the whole stall" for every node at once.
        """
        limit = config.NODE_DEAD_AFTER_MISSED
        while True:
            await asyncio.sleep(config.HEARTBEAT_INTERVAL_S)
            for n in list(self.nodes.values()):
                if not n.alive:
                    continue
                n.missed += 1
                if n.missed > limit:
                    self._node_dead(n, f"nothing heard from it for {limit} heartbeat intervals "
                                       f"of {config.HEARTBEAT_INTERVAL_S:g} s")

    def _node_dead(self, node: NodeRecord, why: str):
        if not node.alive:
            return
        node.alive = False
        (log.info if self.stopping else log.warning)("node %s is dead: %s", node.node_id, why)
        if node.conn is not None:
            node.conn.abort()
        for lease_id, lease in list(self.leases.items()):
            if lease.node is node:
                self.leases.pop(lease_id, None)
                self.lent.discard(lease_id)
        for g in self.groups.values():
            if g.drop_node(node):
                self.waiting_groups[g.group_id] = g
                log.info("placement group %s lost bundles on node %s; placing them again",
                         g.group_id, node.node_id)
        self._push_all_cores("node_dead", {"node_id": node.node_id, "why": why})
        for actor_id in list(node.actors):
            a = self.actors.get(actor_id)
            if a is not None and a.state in (ALIVE, PENDING):
                self._actor_lost(a, f"its node {node.node_id} died ({why})")
        self._push_all_drivers("nodes_changed", self._node_totals())
        self._retry_pending()   # lost bundles may fit elsewhere

    # -- placement ---------------------------------------------------------------------------
    # A placement request ("sched") is None or a dict of: strategy ("DEFAULT" | "SPREAD"),
    # node_id + soft (+ spill: soft leaves a busy node; fail: hard fails on a busy one),
    # or group_id + bundle_index. A placed demand is "charged" to its node, or to the
    # bundle reservation it came out of, and given back there (_free).
    def _alive_nodes(self):
        return [n for n in self.nodes.values() if n.alive]

    def _unschedulable(self, demand: dict, what: str, nodes, pin: str | None = None):
        """The error for a demand that no (live, or pinned) node can ever meet."""
        if pin and not nodes:
            n = self.nodes.get(pin)
            state = "is dead" if n is not None else "is not in this cluster"
            return UnschedulableError(
                f"{what} is pinned to node {pin}, which {state}. Pin it to a live node "
                "(see ddlf.nodes()), use a soft node affinity, or drop node_id=.")
        if not nodes:
            dead = sum(1 for n in self.nodes.values() if not n.alive)
            return UnschedulableError(
                f"{what} cannot be placed: the cluster has no live nodes ({dead} dead). "
                "Start or restart a node (`ddlf-node start --address ...`), or, for an "
                "embedded cluster, ddlf.shutdown() and ddlf.init() again.")
        have = [n.total for n in nodes]
        return UnschedulableError(
            f"{what} asks for {demand}, more than any node has (nodes: {have}). "
            "Lower its num_cpus/resources, or add a node that has them.")

    async def _place(self, demand: dict, what: str, sched: dict | None = None, load_key=None):
        """Reserve ``demand``; return (node, charge). Wait while it can fit but has no room now.

        Raises ``UnschedulableError`` when it can never fit, and a
        ``PlacementGroupRemovedError`` when its placement group is gone. Anything handed
        out per placement (device ids such as GPUs) belongs with the charge returned here,
        so that it is given back by ``_free`` with the rest.
        """
        while True:
            got = self._try_place(demand, what, sched, load_key)
            if got is not None:
                return got
            fut = self.loop.create_future()
            self.pending.append((demand, fut))
            await fut

    def _try_place(self, demand: dict, what: str, sched: dict | None, load_key=None):
        """(node, charge) with ``demand`` taken out, None if it must wait; raises if never."""
        sched = sched or {}
        if sched.get("group_id"):
            return self._try_place_in_group(demand, what, sched)
        nodes = self._alive_nodes()
        pin = sched.get("node_id")
        if pin:
            target = [n for n in nodes if n.node_id == pin]
            if target and scheduling.fits(demand, target[0].total):
                node = target[0]
                if scheduling.fits(demand, node.available):
                    scheduling.subtract(node.available, demand)
                    return node, node
                if sched.get("fail") and not sched.get("soft"):
                    raise UnschedulableError(
                        f"{what} is pinned to node {pin}, which has no room for {demand} now "
                        f"(free: {node.available}), and asked to fail rather than wait")
                if not (sched.get("soft") and sched.get("spill")):
                    return None   # as in Ray: a live node that can fit it is waited for
            elif not sched.get("soft"):
                raise self._unschedulable(demand, what, target, pin)
            # soft: the node is gone or can never fit this demand; go anywhere.
        if not nodes or not scheduling.feasible_anywhere(demand, [n.total for n in nodes]):
            raise self._unschedulable(demand, what, nodes)
        if sched.get("strategy") == "SPREAD":
            node = self._spread_choice(demand, nodes)
        else:
            node = scheduling.choose_node(demand, nodes, load_key=load_key)
        if node is None:
            return None
        scheduling.subtract(node.available, demand)
        return node, node

    def _spread_choice(self, demand: dict, nodes: list):
        """Round-robin over the nodes with room, in the order they joined."""
        n = len(nodes)
        for k in range(n):
            node = nodes[(self._spread_next + k) % n]
            if scheduling.fits(demand, node.available):
                self._spread_next = (self._spread_next + k + 1) % n
                return node
        return None

    def _try_place_in_group(self, demand: dict, what: str, sched: dict):
        g = self.groups.get(sched["group_id"])
        if g is None or g.state == placement.REMOVED:
            cls = (ActorPlacementGroupRemovedError if what.startswith("actor")
                   else TaskPlacementGroupRemovedError)
            raise cls(f"{what} was scheduled in placement group {sched['group_id']}, which "
                      "has been removed (remove_placement_group, or its owner exited)")
        index = sched.get("bundle_index", -1)
        if not -1 <= index < len(g.bundles):
            raise UnschedulableError(f"{what}: bundle index {index} is out of range for "
                                     f"placement group {g.group_id} ({len(g.bundles)} bundles)")
        specs = g.bundles if index == -1 else [g.bundles[index]]
        if not any(scheduling.fits(demand, b) for b in specs):
            raise UnschedulableError(
                f"{what} asks for {demand}, more than its bundle of placement group "
                f"{g.group_id} reserves (bundles: {placement.describe_bundles(specs)}). Lower "
                "its num_cpus/resources, or reserve a bigger bundle.")
        targets = g.reservations if index == -1 else [g.reservations[index]]
        for r in targets:
            if r is not None and r.alive and scheduling.fits(demand, r.available):
                scheduling.subtract(r.available, demand)
                return r.node, r
        return None   # the group is not placed yet, or its bundle is busy: wait

    def _retry_pending(self):
        self._place_groups()
        pending, self.pending = self.pending, []
        for _demand, fut in pending:
            if not fut.done():
                fut.set_result(None)

    def _free(self, charge, demand: dict):
        """Give ``demand`` back to what it was taken from (a node or a bundle reservation)."""
        if charge is not None and charge.alive:
            scheduling.add(charge.available, demand, charge.total)
        self._retry_pending()

    # -- placement groups --------------------------------------------------------------------
    def _place_groups(self) -> None:
        """Reserve every group that waits and now fits (oldest first; one that does not fit
        does not hold up the others)."""
        if not self.waiting_groups:
            return   # the common case, on every resource release: nothing to do
        nodes = self._alive_nodes()
        for g in list(self.waiting_groups.values()):
            chosen = placement.plan(g.bundles, g.strategy, nodes, g.placed_nodes())
            if chosen is not None:
                g.commit(chosen)
                del self.waiting_groups[g.group_id]
                log.info("placement group %s placed on %s", g.group_id,
                         sorted({n.node_id for n in chosen}))

    def _infeasible(self, g: placement.Group) -> bool:
        """True if no amount of waiting lets ``g`` fit the nodes alive now."""
        return placement.plan(g.bundles, g.strategy, self._alive_nodes(), use_total=True) is None

    def _group_view(self, g: placement.Group) -> dict:
        """``g.view()`` plus Ray's ``stats.scheduling_state``: FINISHED, REMOVED,
        NO_RESOURCES (waits for resources to free up) or INFEASIBLE (waits for a node that
        can hold it to join)."""
        view = g.view()
        if g.state in (placement.CREATED, placement.REMOVED):
            state = "FINISHED" if g.state == placement.CREATED else "REMOVED"
        else:
            state = "INFEASIBLE" if self._infeasible(g) else "NO_RESOURCES"
        view["stats"] = {"scheduling_state": state}
        return view

    def rpc_create_placement_group(self, conn, spec: dict):
        """Register a group and reserve it if it fits now; ``{"id", "state", "infeasible"}``.

        A group that does not fit stays PENDING and is placed when resources free up or a
        node joins, as in Ray, even one too big for every node alive now ("infeasible":
        a node may join later); the caller decides how long to wait (``pg.wait``).
        """
        bundles = placement.check_bundles(spec["bundles"])
        strategy = placement.check_strategy(spec.get("strategy", "PACK"))
        name = spec.get("name") or ""
        if name and name in self.group_names:
            raise DDLFError(f"a placement group named {name!r} already exists; pick another "
                            "name, or get it with get_placement_group(name)")
        g = placement.Group(uuid.uuid4().hex[:16], bundles, strategy, name,
                            owner=conn.info.get("owner_id"), detached=bool(spec.get("detached")))
        self.groups[g.group_id] = g
        self.waiting_groups[g.group_id] = g
        if name:
            self.group_names[name] = g.group_id
        self._place_groups()
        infeasible = g.state == placement.PENDING and self._infeasible(g)
        if infeasible:
            log.warning("placement group %s (%s, %s) cannot fit the live nodes (%s); it waits "
                        "for a node that can hold it", g.group_id, strategy,
                        placement.describe_bundles(bundles),
                        placement.describe_bundles([n.total for n in self._alive_nodes()]))
        return {"id": g.group_id, "state": g.state, "infeasible": infeasible}

    def rpc_remove_placement_group(self, conn, group_id: str):
        g = self.groups.get(group_id)
        if g is None or g.state == placement.REMOVED:
            return False
        self._remove_group(g, "it was removed with remove_placement_group()")
        return True

    def _remove_group(self, g: placement.Group, why: str) -> None:
        """Kill the group's actors and leased workers, give its bundles back, fail waiters."""
        g.state = placement.REMOVED
        self.waiting_groups.pop(g.group_id, None)
        if g.name and self.group_names.get(g.name) == g.group_id:
            self.group_names.pop(g.name, None)
        reason = f"its placement group {g.group_id} was removed ({why})"
        for a in list(self.actors.values()):
            if a.sched and a.sched.get("group_id") == g.group_id and a.state != DEAD:
                # Callers holding a connection fail their in-flight calls with this reason.
                self._push_all_cores("actor_lost",
                                     ActorLost(a.actor_id, a.epoch, reason).to_wire())
                self._kill(a, reason, pg_removed=True)
        for lease_id, lease in list(self.leases.items()):
            if isinstance(lease.charge, placement.Reservation) and lease.charge.group is g:
                self.leases.pop(lease_id, None)
                self.lent.discard(lease_id)
                if lease.node.alive:
                    self.background.spawn(
                        self._safe_call(lease.node.conn, "kill_worker", lease.worker_id))
        g.release()
        g.touch()
        log.info("placement group %s removed: %s", g.group_id, why)
        removed = [gid for gid, x in self.groups.items() if x.state == placement.REMOVED]
        for gid in removed[:max(0, len(removed) - config.REMOVED_GROUPS_KEPT)]:
            del self.groups[gid]   # the table keeps the newest removed groups only
        self._retry_pending()   # waiters in the group fail; others may use what it held

    async def rpc_wait_placement_group(self, conn, group_id: str, timeout: float):
        """The group's table entry once it is CREATED or REMOVED, or after ``timeout`` s."""
        deadline = time.monotonic() + min(float(timeout), config.WAIT_GROUP_MAX_S)
        while True:
            g = self.groups.get(group_id)
            if g is None:
                return None
            left = deadline - time.monotonic()
            if g.state in (placement.CREATED, placement.REMOVED) or left <= 0:
                return self._group_view(g)
            try:
                await asyncio.wait_for(g.changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    def rpc_placement_group_table(self, conn, group_id: str | None = None):
        if group_id is not None:
            g = self.groups.get(group_id)
            return self._group_view(g) if g is not None else None
        return {gid: self._group_view(g) for gid, g in self.groups.items()}

    def rpc_get_placement_group(self, conn, name: str):
        group_id = self.group_names.get(name)
        return self._group_view(self.groups[group_id]) if group_id is not None else None

    # -- actors ------------------------------------------------------------------------------
    def _claim_name(self, name: str, actor_id: str) -> None:
        """Give ``name`` to ``actor_id``, or raise if a live or reserved actor holds it."""
        existing = self.names.get(name)
        if existing is not None and existing != actor_id:
            a = self.actors.get(existing)
            if existing in self.reserved or (a is not None and a.state != DEAD):
                raise ActorNameTakenError(
                    f"an actor named {name!r} already exists; pick another name or use "
                    "ddlf.get_actor(name) to reach it")
        self.names[name] = actor_id

    def rpc_reserve_name(self, conn, name: str, actor_id: str, class_name: str, methods):
        """Claim ``name`` for an actor whose create_actor request is about to follow."""
        self._claim_name(name, actor_id)
        self.reserved[actor_id] = {"class_name": class_name, "methods": methods, "name": name,
                                   "owner": conn.info.get("owner_id"), "created": asyncio.Event()}
        return True

    def _unreserve(self, actor_id: str) -> None:
        r = self.reserved.pop(actor_id, None)
        if r is not None:
            if self.names.get(r["name"]) == actor_id and actor_id not in self.actors:
                self.names.pop(r["name"], None)
            r["created"].set()

    async def rpc_create_actor(self, conn, creation: dict):
        creation = ActorCreation.from_wire(creation)
        if creation.name:
            self._claim_name(creation.name, creation.actor_id)
        a = ActorRecord(creation, conn.info.get("owner_id"))
        self.actors[a.actor_id] = a
        self._unreserve(a.actor_id)
        await self._start_actor(a)
        return a.view()

    async def _start_actor(self, a: ActorRecord):
        what = f"actor {a.class_name}"
        try:
            node, charge = await self._place(a.demand, what, a.sched,
                                             load_key=lambda n: len(n.actors))
        except (UnschedulableError, PlacementGroupRemovedError) as e:
            if a.state != DEAD:
                self._set_dead(a, str(e), error_obj=e)
            return
        if a.state == DEAD:  # killed while waiting for resources
            self._free(charge, a.demand)
            return
        a.node, a.charge = node, charge
        node.actors.add(a.actor_id)
        try:
            reply = ActorStarted.from_wire(
                await rpc.call(node.conn, "start_actor", a.creation.to_wire())).check_placed()
        except Exception as e:
            node.actors.discard(a.actor_id)
            a.charge = None
            self._free(charge, a.demand)
            self._actor_lost(a, f"its node failed to start it: {e}")
            return
        if not reply.ok:
            node.actors.discard(a.actor_id)
            a.charge = None
            self._free(charge, a.demand)
            a.node = None
            self._set_dead(a, "its __init__ raised", creation_error=reply.error)
            return
        if a.state == DEAD:  # killed while starting
            await self._safe_call(node.conn, "kill_actor", a.actor_id)
            return
        a.address, a.pid, a.worker_id = reply.address, reply.pid, reply.worker_id
        a.state = ALIVE
        a.epoch += 1
        a.touch()

    def _set_dead(self, a: ActorRecord, why: str, creation_error=None, error_obj=None,
                  pg_removed: bool = False):
        a.state = DEAD
        a.death = ActorDeath.of(why, creation_error=creation_error, error=error_obj,
                                pg_removed=pg_removed)
        a.address = None
        if a.node is not None:
            a.node.actors.discard(a.actor_id)
            self._free(a.charge, a.demand)
            a.node = a.charge = None
        if a.name and self.names.get(a.name) == a.actor_id:
            self.names.pop(a.name, None)
        a.touch()

    def _actor_lost(self, a: ActorRecord, why: str):
        """The actor's process is gone: restart it if allowed, else mark it dead."""
        # Callers holding a connection to it may never see that connection close (a cut
        # link sends no FIN): tell every core, so in-flight calls fail instead of hanging.
        self._push_all_cores("actor_lost", ActorLost(a.actor_id, a.epoch, why).to_wire())
        if a.node is not None:
            a.node.actors.discard(a.actor_id)
            self._free(a.charge, a.demand)
            a.node = a.charge = None
        if a.killed or a.state == DEAD:
            self._set_dead(a, a.death.reason if a.death else why)
            return
        if a.restarts_left != 0:   # -1: unlimited, as in Ray
            if a.restarts_left > 0:
                a.restarts_left -= 1
            a.state = RESTARTING
            a.address = None
            a.touch()
            log.info("restarting actor %s (%s); %d restarts left", a.class_name, why, a.restarts_left)
            self.background.spawn(self._start_actor(a))
        else:
            self._set_dead(a, why)

    def _worker_died(self, node: NodeRecord, died: WorkerDied):
        # A node speaks for its own workers only.
        if died.actor_id:
            a = self.actors.get(died.actor_id)
            if (a is not None and a.worker_id == died.worker_id and a.state == ALIVE
                    and a.node is node):
                if died.on_purpose:
                    # sys.exit(0) or exit_actor(), announced by the worker: it left on
                    # purpose, as in Ray. A bare os._exit(0) is not announced, so it is
                    # a crash and restarts.
                    a.killed = True
                    self._actor_lost(a, f"it exited on purpose (sys.exit(0) or exit_actor(), "
                                        f"pid {died.pid}); it is not restarted")
                else:
                    self._actor_lost(a, f"its process (pid {died.pid}) died with exit "
                                        f"code {died.exitcode}")
        for lease_id, lease in list(self.leases.items()):
            if lease.worker_id == died.worker_id and lease.node is node:
                self.leases.pop(lease_id, None)
                if lease_id in self.lent:
                    self.lent.discard(lease_id)
                else:
                    self._free(lease.charge, lease.demand)

    async def rpc_wait_actor(self, conn, actor_id: str, after_epoch: int):
        """Return the actor's view once its epoch passes ``after_epoch`` or it is dead."""
        deadline = time.monotonic() + config.WAIT_ACTOR_MAX_S
        while True:
            a = self.actors.get(actor_id)
            r = self.reserved.get(actor_id) if a is None else None
            if r is not None:
                # Named and reserved, but its creation request has not arrived yet.
                try:
                    await asyncio.wait_for(r["created"].wait(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    return ActorView(actor_id, ActorState.RESERVED.value).to_wire(
                        ActorView.RESERVED_KEYS)
                continue
            if a is None:
                death = ActorDeath.of("no such actor in this cluster (it may have been created "
                                      "by a driver that has since disconnected)")
                return ActorView(actor_id, DEAD.value, error=death.to_wire()).to_wire(
                    ActorView.UNKNOWN_KEYS)
            if a.state == DEAD or (a.state == ALIVE and a.epoch > after_epoch):
                return a.view()
            left = deadline - time.monotonic()
            if left <= 0:
                return a.view()
            try:
                await asyncio.wait_for(a.changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    def rpc_get_actor(self, conn, name: str):
        actor_id = self.names.get(name)
        if actor_id is None:
            return None
        if actor_id in self.reserved:
            r = self.reserved[actor_id]
            return ActorView(actor_id, class_name=r["class_name"],
                             methods=r["methods"]).to_wire(ActorView.STUB_KEYS)
        return self.actors[actor_id].view()

    def rpc_kill_actor(self, conn, actor_id: str, no_restart: bool = True):
        a = self.actors.get(actor_id)
        if a is None or a.state == DEAD:
            return False
        self._kill(a, "it was killed with ddlf.kill()", no_restart)
        return True

    def _kill(self, a: ActorRecord, why: str, no_restart: bool = True, pg_removed: bool = False):
        node = a.node
        if no_restart:
            a.killed = True
            self._set_dead(a, why, pg_removed=pg_removed)
        if node is not None and node.alive:
            self.background.spawn(self._safe_call(node.conn, "kill_actor", a.actor_id))

    async def _safe_call(self, conn, method, *args):
        try:
            return await rpc.call(conn, method, *args)
        except Exception as e:
            log.debug("%s failed: %s", method, e)

    def rpc_list_actors(self, conn):
        return [a.view() for a in self.actors.values()]

    # -- task leases -------------------------------------------------------------------------
    async def rpc_lease_worker(self, conn, demand: dict, wait: bool, sched: dict | None = None,
                               runtime_env: dict | None = None):
        """Lend a worker for tasks of ``demand`` placed by ``sched``; None if ``wait`` is
        false and nothing has room now."""
        owner_id = conn.info.get("owner_id")
        if wait:
            node, charge = await self._place(demand, "task", sched)
        else:
            got = self._try_place(demand, "task", sched)
            if got is None:
                return None
            node, charge = got
        try:
            # The node picks GPU ids and a worker set up for this runtime env.
            grant = LeaseGrant.from_wire(
                await rpc.call(node.conn, "lease_worker", demand, runtime_env))
        except Exception:
            self._free(charge, demand)
            raise
        if isinstance(charge, placement.Reservation) and not charge.active:
            # Its group was removed (or its node died) while the node answered.
            self.background.spawn(self._safe_call(node.conn, "kill_worker", grant.worker_id))
            return await self.rpc_lease_worker(conn, demand, wait, sched, runtime_env)
        grant.lease_id = uuid.uuid4().hex[:12]
        self.leases[grant.lease_id] = LeaseRecord(node, charge, demand, grant.worker_id, owner_id)
        return grant.to_wire()

    def rpc_return_lease(self, conn, lease_id: str):
        self._release_lease(lease_id)
        return None

    def _release_lease(self, lease_id):
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        if lease.node.alive:
            self.background.spawn(self._safe_call(lease.node.conn, "release_worker",
                                                  lease.worker_id))
        if lease_id in self.lent:
            self.lent.discard(lease_id)  # already given back when it was lent
            return
        self._free(lease.charge, lease.demand)

    def _lease_of(self, worker_id):
        for lease_id, lease in self.leases.items():
            if lease.worker_id == worker_id:
                return lease_id, lease
        return None, None

    def _lend(self, worker_id) -> None:
        """A leased task waits in get: give its resources to other work meanwhile.

        A task in a placement group lends to its bundle, so its child tasks in the same
        group (captured) can run there.
        """
        lease_id, lease = self._lease_of(worker_id)
        if lease_id is None or lease_id in self.lent:
            return
        node = lease.node
        if sum(1 for lid in self.lent if self.leases[lid].node is node) >= config.MAX_LENT_TASKS_PER_NODE:
            return  # bounded: this task keeps its CPU (see config)
        self.lent.add(lease_id)
        self._free(lease.charge, lease.demand)

    def _unlend(self, worker_id) -> None:
        lease_id, lease = self._lease_of(worker_id)
        if lease_id is None or lease_id not in self.lent:
            return
        self.lent.discard(lease_id)
        # May go below zero for a while.
        scheduling.subtract(lease.charge.available, lease.demand)

    # -- runtime_env packages: uploaded once by a caller, fetched once by each node ---------------
    def rpc_has_package(self, conn, pkg_id: str) -> bool:
        return pkg_id in self.packages

    def rpc_put_package(self, conn, pkg_id: str, data: bytes) -> None:
        from .runtime_env import check_package

        check_package(pkg_id, data)
        self.packages[pkg_id] = bytes(data)

    def rpc_get_package(self, conn, pkg_id: str):
        return self.packages.get(pkg_id)

    # -- cluster information ------------------------------------------------------------------
    def rpc_nodes(self, conn):
        return [n.public() for n in self.nodes.values()]

    def rpc_cluster_resources(self, conn):
        return _sum([n.total for n in self._alive_nodes()])

    def rpc_available_resources(self, conn):
        return _sum([n.available for n in self._alive_nodes()])

    # -- logs --------------------------------------------------------------------------------
    def _route_logs(self, batch: LogBatch):
        by_job: dict = {}
        for rec in batch.records:
            by_job.setdefault(rec[0], []).append(rec)
        for job_id, recs in by_job.items():
            targets = [self.drivers[job_id]] if job_id in self.drivers else (
                list(self.drivers.values()) if job_id is None else [])
            for conn in targets:
                rpc.push(conn, "logs", LogBatch(recs, batch.host, batch.node_id).to_wire())

    def _push_all_cores(self, event, data):
        for conn in list(self.cores):
            rpc.push(conn, event, data)

    def _push_all_drivers(self, event, data):
        for conn in list(self.drivers.values()):
            rpc.push(conn, event, data)

    async def rpc_shutdown(self, conn):
        """Stop every node (and so every worker), then the head itself."""
        self.stopping = True
        for n in self._alive_nodes():
            try:
                await asyncio.wait_for(rpc.call(n.conn, "shutdown"), 5)
            except Exception:
                pass
        self.loop.call_later(0.05, self._stop)
        return None

    def _stop(self):
        self.background.close()
        if self.server is not None:
            self.server.close()
        if not self.stopped.done():
            self.stopped.set_result(None)


class _HeadRpcHandler(rpc.RpcHandler):
    """The head's RPC handler: any frame from a node counts as a sign of life.

    A node busy sending logs or replies is not silent, even if its heartbeat is late.
    """

    def frame_received(self, conn, segs):
        node = conn.info.get("node")
        if node is not None:
            node.heard()
        super().frame_received(conn, segs)


def _field(data, key: str, event: str) -> str:
    """``data[key]`` of a one-key push (a str id); ``MessageError`` if it is not there."""
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, str):
        raise MessageError(f"a {event} push must be a dict with a str {key!r}, got {data!r:.80}")
    return value


def _sum(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            if k.startswith("node:"):
                continue
            out[k] = out.get(k, 0.0) + v
    return out


def run_head(*, host: str, port: int, token: str | None, stdin_lifeline: bool = False,
             ready_out=None) -> None:
    config.raise_open_file_limit()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    token = process.resolve_token(token) or generate_token()
    head = Head(loop, token, host, port)
    loop.run_until_complete(head.start())
    session = os.path.join(config.session_root(), f"head-{head.port}")
    os.makedirs(session, mode=0o700, exist_ok=True)
    token_file = os.path.join(session, "token")
    write_token_file(token_file, token)

    def stop(*_):
        head.background.spawn(head.rpc_shutdown(None))

    process.stop_on_signals(loop, stop, stdin_lifeline)
    if ready_out is not None:
        process.announce_ready(ready_out, {"address": head.address, "token_file": token_file,
                                           "pid": os.getpid()})
    loop.run_until_complete(head.stopped)
    try:
        os.unlink(token_file)
        os.rmdir(session)
    except OSError:
        pass


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ddlf_actors.runtime.head")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", help="deprecated: visible in the process list; set "
                                    "DDLF_AUTH_TOKEN in the environment instead")
    p.add_argument("--stdin-lifeline", action="store_true")
    a = p.parse_args(argv)
    if a.token:
        print("ddlf head: warning: --token is visible to every local user in the process "
              "list; pass the token in DDLF_AUTH_TOKEN instead", file=sys.stderr)
    run_head(host=a.host, port=a.port, token=a.token, stdin_lifeline=a.stdin_lifeline,
             ready_out=sys.stdout)


if __name__ == "__main__":
    main()
