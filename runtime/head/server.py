"""The head's shell: RPC endpoints and I/O around the managers that hold its state.

As in Ray's GCS server, the state lives in one manager per concern (``nodes.py``,
``actors.py``, ``leases.py``, ``placement_groups.py``, ``scheduler.py``,
``packages.py``, ``logs.py``), which do no I/O. :class:`Head` answers requests, reads
pushes, and carries out what the managers decide: it calls nodes (start or kill an
actor, lend or release a worker), pushes events to drivers and workers, waits (for
resources, for an actor or a group to change) and runs the heartbeat clock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from typing import TYPE_CHECKING

from .. import config, placement, process
from ..errors import MessageError
from ..scheduling import Scheduling
from ..states import ActorState, GroupState
from ..wire import rpc
from ..wire.auth import generate_token, write_token_file
from ..wire.connection import serve
from ..wire.eventloop import new_event_loop
from ..wire.messages import Heartbeat, LeaseGrant, LogBatch, WorkerDied
from ..wire.taskgroup import TaskGroup
from .actor_lifecycle import ActorLifecycle, call_quietly
from .actors import ActorDirectory
from .dashboard.service import DashboardService
from .leases import LeaseManager
from .logs import LogFanout, WarnLimiter
from .nodes import NodeRecord, NodeTable
from .packages import PackageStore
from .placement_groups import Group, PlacementGroupManager, Reservation
from .placer import Placer
from .scheduler import Scheduler, WorkKind

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["Head", "run_head", "main"]

log = logging.getLogger("ddlf.head")

_OWNER_GONE = "its owner (the driver or worker that created it) disconnected"


class Head:
    """The head process: its server, its managers, and what connects them."""

    def __init__(self, loop, token: str, host: str = "127.0.0.1", port: int = 0, dashboard=None):
        self.loop = loop
        self.token = token
        self.host = host
        self.port = port
        self.nodes = NodeTable(config.NODE_DEAD_AFTER_MISSED)
        self.actors = ActorDirectory(config.DEAD_ACTORS_KEPT)
        self.leases = LeaseManager(config.MAX_LENT_TASKS_PER_NODE)
        self.groups = PlacementGroupManager(config.REMOVED_GROUPS_KEPT)
        self.scheduler = Scheduler(self.nodes, self.groups)
        self.placer = Placer(loop, self.nodes, self.groups, self.scheduler)
        self.packages = PackageStore()
        self.logs = LogFanout()
        self.cores: set = set()        # every driver's and worker's connection
        self.background = TaskGroup(loop, "head")
        self.lifecycle = ActorLifecycle(self.actors, self.placer, self.cores, self.background)
        self.server: asyncio.Server | None = None
        self.stopping = False
        self.stopped = loop.create_future()
        self._warn = WarnLimiter(log)
        self.dashboard = DashboardService(self, dashboard, self._warn)   # runs; the web page
        self.handler = _HeadRpcHandler(self, self.rpc_handlers())
        self._pushes = self.push_handlers()

    def rpc_handlers(self) -> dict:
        """Every request a driver, worker or node may send the head."""
        return {
            # registration
            "register_node": self.rpc_register_node,
            "hello_driver": self.rpc_hello_driver,
            # actors
            "reserve_name": self.rpc_reserve_name,
            "create_actors": self.rpc_create_actors,
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
            **self.dashboard.rpc_handlers(),
            "shutdown": self.rpc_shutdown,
        }

    def push_handlers(self) -> dict:
        """Every one-way event a node, driver or worker may send the head."""
        return {
            "heartbeat": self._on_heartbeat,        # node
            "worker_died": self._on_worker_died,    # node
            "logs": self._on_logs,                  # node
            "task_blocked": self._on_task_blocked,  # a leased task waits in get
            "task_unblocked": self._on_task_unblocked,
            "release_name": self._on_release_name,  # a named actor was never created
            **self.dashboard.push_handlers(),
        }

    async def start(self):
        self.server = await serve(self.host, self.port, self.token, self.handler)
        self.port = self.server.sockets[0].getsockname()[1]
        self.background.spawn(self._watch_nodes())
        await self.dashboard.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- registration ------------------------------------------------------------------------
    def rpc_register_node(self, conn: Connection, info: dict):
        process.check_versions(info, f"node {info.get('address')}")
        rec = self.nodes.register(info, conn)
        conn.info.node = rec
        log.info("node %s joined at %s with %s", rec.node_id, rec.address, rec.total)
        _push_all(self.logs.connections(), "nodes_changed", self.nodes.totals())
        self.placer.retry()
        return {"head_address": self.address}

    def rpc_hello_driver(self, conn: Connection, info: dict):
        process.check_versions(info, "this driver")
        wait_s = info.get("await_node_s")   # how long the client waits for a first node
        if not self.nodes.nodes and isinstance(wait_s, (int, float)) and wait_s > 0:
            return self._hello_later(conn, info, min(wait_s, config.START_TIMEOUT_S))
        # job id: whose logs these are (workers calling actors inherit their driver's);
        # owner id: whose actors die with this connection.
        job_id = info.get("job_id") or uuid.uuid4().hex[:8]
        conn.info.owner_id = uuid.uuid4().hex[:8]
        self.cores.add(conn)
        if info.get("is_driver", True):
            self.logs.add_driver(job_id, conn)
            conn.info.job_id = job_id
        return {"job_id": job_id, "node_totals": self.nodes.totals()}

    async def _hello_later(self, conn: Connection, info: dict, wait_s: float):
        """The hello, once a first node has registered (``Placer.first_node`` says why)."""
        await self.placer.first_node(wait_s)
        return None if conn.closed else self.rpc_hello_driver(conn, {**info, "await_node_s": 0})

    # -- pushes ------------------------------------------------------------------------------
    def on_push(self, conn: Connection, event, data):
        fn = self._pushes.get(event) if isinstance(event, str) else None
        if fn is not None:   # an unknown event is ignored, as it always was
            fn(conn, data)

    def _on_heartbeat(self, conn: Connection, data):
        beat = Heartbeat.from_wire(data)
        node = conn.info.node
        if node is None or node.node_id != beat.node_id:
            # Only a node speaks for itself: another peer with the token could otherwise
            # keep a hung node looking alive.
            self._warn("heartbeat", "ignored a heartbeat for node %s from %s: only that "
                       "node's own connection may send it", beat.node_id, conn.peer)
            return
        node.heard()

    def _on_worker_died(self, conn: Connection, data):
        died = WorkerDied.from_wire(data)
        node = conn.info.node
        if node is None:
            # Only a node daemon sees its workers exit. From a driver or a worker (any
            # peer with the token) this push would restart or kill actors it does not own.
            self._warn("worker_died", "ignored a worker_died push from %s: only a "
                       "registered node may send it", conn.peer)
            return
        self.lifecycle.worker_died(node, died)
        lease = self.leases.of_worker(died.worker_id)
        if lease is not None and lease.node is node:
            self.leases.pop(lease.lease_id)
            if not lease.lent:
                self.placer.free(lease.charge, lease.demand)

    def _on_logs(self, conn: Connection, data):
        batch = LogBatch.from_wire(data)
        if conn.info.node is None:
            # Worker output reaches drivers only through the node that tails it; any
            # other peer could print lines in a driver's terminal under a worker's name.
            self._warn("logs", "ignored a logs push from %s: only a registered node may "
                       "send worker output", conn.peer)
            return
        for driver, part in self.logs.route(batch):
            rpc.push(driver, "logs", part.to_wire())

    def _on_task_blocked(self, conn: Connection, data):
        lease = self.leases.lend(_field(data, "worker_id", "task_blocked"))
        if lease is not None:   # its resources go to other work while its task waits
            self.placer.free(lease.charge, lease.demand)

    def _on_task_unblocked(self, conn: Connection, data):
        lease = self.leases.unlend(_field(data, "worker_id", "task_unblocked"))
        if lease is not None:
            self.scheduler.take(lease.charge, lease.demand)

    def _on_release_name(self, conn: Connection, data):
        self.actors.release(_field(data, "actor_id", "release_name"), conn.info.owner_id)

    # -- connections ending; nodes dying -----------------------------------------------------
    def on_closed(self, conn: Connection, exc):
        node = conn.info.node
        if node is not None:
            self._node_dead(node, "its node daemon disconnected")
        job_id = conn.info.job_id
        if job_id is not None:
            self.logs.remove_driver(job_id, conn)
        owner_id = conn.info.owner_id
        if owner_id is not None:
            self.cores.discard(conn)
            self._owner_gone(owner_id)
            self.dashboard.owner_gone(owner_id)

    def _owner_gone(self, owner_id: str):
        # Actors, leases and groups die with the connection that owns them (unless detached).
        for actor_id in self.actors.reserved_by(owner_id):
            self.actors.unreserve(actor_id)
        for a in self.actors.owned_by(owner_id):
            self.lifecycle.kill(a, _OWNER_GONE)
        for lease in self.leases.owned_by(owner_id):
            self._release_lease(lease.lease_id)
        for g in self.groups.owned_by(owner_id):
            self._remove_group(g, _OWNER_GONE)

    async def _watch_nodes(self):
        """Every heartbeat interval, count a miss for each node; declare dead those past
        the limit (see ``NodeTable.tick``)."""
        limit = config.NODE_DEAD_AFTER_MISSED
        while True:
            await asyncio.sleep(config.HEARTBEAT_INTERVAL_S)
            for n in self.nodes.tick():
                self._node_dead(n, f"nothing heard from it for {limit} heartbeat intervals "
                                   f"of {config.HEARTBEAT_INTERVAL_S:g} s")

    def _node_dead(self, node: NodeRecord, why: str):
        if not self.nodes.mark_dead(node):
            return
        (log.info if self.stopping else log.warning)("node %s is dead: %s", node.node_id, why)
        if node.conn is not None:
            node.conn.abort()
        for lease in self.leases.on_node(node):
            self.leases.pop(lease.lease_id)   # nothing to give back: the node is gone
        for g in self.groups.node_died(node):
            log.info("placement group %s lost bundles on node %s; placing them again",
                     g.group_id, node.node_id)
        _push_all(self.cores, "node_dead", {"node_id": node.node_id, "why": why})
        for a in self.actors.on_node(node):
            self.lifecycle.lost(a, f"its node {node.node_id} died ({why})")
        _push_all(self.logs.connections(), "nodes_changed", self.nodes.totals())
        self.placer.retry()   # lost bundles may fit elsewhere

    # -- actors (their lives are in actor_lifecycle.py) -----------------------------------------
    def rpc_reserve_name(self, conn: Connection, name: str, actor_id: str, class_name: str, methods):
        """Claim ``name`` for an actor whose creation request is about to follow."""
        self.actors.reserve(name, actor_id, class_name, methods, conn.info.owner_id)
        return True

    def rpc_create_actors(self, conn: Connection, creations: list) -> list:
        """Create actors in one batch; per creation None (its view follows as an
        ``actor_started`` push) or the error that refused it (``ActorLifecycle.create``)."""
        return self.lifecycle.create(conn, creations, conn.info.owner_id)

    async def rpc_wait_actor(self, conn: Connection, actor_id: str, after_epoch: int):
        """The actor's view once its epoch passes ``after_epoch`` or it is dead."""
        return await self.lifecycle.wait(actor_id, after_epoch)

    def rpc_get_actor(self, conn: Connection, name: str):
        return self.actors.named(name)

    def rpc_kill_actor(self, conn: Connection, actor_id: str, no_restart: bool = True):
        a = self.actors.get(actor_id)
        if a is None or a.state == ActorState.DEAD:
            return False
        self.lifecycle.kill(a, "it was killed with ddlf.kill()", no_restart)
        return True

    def rpc_list_actors(self, conn: Connection):
        return self.actors.views()

    # -- task leases -------------------------------------------------------------------------
    async def rpc_lease_worker(self, conn: Connection, demand: dict, wait: bool, sched: dict | None = None,
                               runtime_env: dict | None = None):
        """Lend a worker for tasks of ``demand`` placed by ``sched`` (a ``Scheduling`` in
        wire form); None if ``wait`` is false and nothing has room now."""
        where = Scheduling.from_wire(sched, "lease_worker's scheduling")
        if wait:
            node, charge = await self.placer.place(demand, where, WorkKind.TASK, "task")
        else:
            got = self.scheduler.try_place(demand, where, WorkKind.TASK, "task")
            if got is None:
                return None
            node, charge = got
        try:
            # The node picks GPU ids and a worker set up for this runtime env.
            grant = LeaseGrant.from_wire(
                await rpc.call(node.conn, "lease_worker", demand, runtime_env))
        except Exception:
            self.placer.free(charge, demand)
            raise
        if isinstance(charge, Reservation) and not charge.active:
            # Its group was removed (or its node died) while the node answered.
            self.background.spawn(call_quietly(node.conn, "kill_worker", grant.worker_id))
            return await self.rpc_lease_worker(conn, demand, wait, sched, runtime_env)
        lease = self.leases.grant(node, charge, demand, grant.worker_id,
                                  conn.info.owner_id)
        grant.lease_id = lease.lease_id
        return grant.to_wire()

    def rpc_return_lease(self, conn: Connection, lease_id: str):
        self._release_lease(lease_id)
        return None

    def _release_lease(self, lease_id):
        lease = self.leases.pop(lease_id)
        if lease is None:
            return
        if lease.node.alive:
            self.background.spawn(call_quietly(lease.node.conn, "release_worker",
                                                  lease.worker_id))
        if not lease.lent:   # a lent one's demand was given back when it was lent
            self.placer.free(lease.charge, lease.demand)

    # -- placement groups --------------------------------------------------------------------
    def rpc_create_placement_group(self, conn: Connection, spec: dict):
        """Register a group and reserve it if it fits now; ``{"id", "state", "infeasible"}``.

        A group that does not fit stays PENDING and is placed when resources free up or a
        node joins, as in Ray, even one too big for every node alive now ("infeasible":
        a node may join later); the caller decides how long to wait (``pg.wait``).
        """
        g = self.groups.create(placement.check_bundles(spec["bundles"]),
                               placement.check_strategy(spec.get("strategy", "PACK")),
                               spec.get("name") or "", conn.info.owner_id,
                               bool(spec.get("detached")))
        self.placer.place_groups()
        alive = self.nodes.alive()
        infeasible = g.state == GroupState.PENDING and self.groups.infeasible(g, alive)
        if infeasible:
            log.warning("placement group %s (%s, %s) cannot fit the live nodes (%s); it waits "
                        "for a node that can hold it", g.group_id, g.strategy,
                        placement.describe_bundles(g.bundles),
                        placement.describe_bundles([n.total for n in alive]))
        return {"id": g.group_id, "state": g.state.value, "infeasible": infeasible}

    def rpc_remove_placement_group(self, conn: Connection, group_id: str):
        g = self.groups.get(group_id)
        if g is None or g.state == GroupState.REMOVED:
            return False
        self._remove_group(g, "it was removed with remove_placement_group()")
        return True

    def _remove_group(self, g: Group, why: str) -> None:
        """Kill the group's actors and leased workers, give its bundles back, fail waiters."""
        self.groups.mark_removed(g)
        reason = f"its placement group {g.group_id} was removed ({why})"
        for a in self.actors.in_group(g.group_id):
            # Callers holding a connection fail their in-flight calls with this reason.
            self.lifecycle.push_lost(a, reason)
            self.lifecycle.kill(a, reason, pg_removed=True)
        for lease in self.leases.charged_to_group(g):
            self.leases.pop(lease.lease_id)
            if lease.node.alive:
                self.background.spawn(
                    call_quietly(lease.node.conn, "kill_worker", lease.worker_id))
        self.groups.release(g)
        log.info("placement group %s removed: %s", g.group_id, why)
        self.placer.retry()   # waiters in the group fail; others may use what it held

    async def rpc_wait_placement_group(self, conn: Connection, group_id: str, timeout: float):
        """The group's table entry once it is CREATED or REMOVED, or after ``timeout`` s."""
        return await self.placer.wait_group(group_id, timeout)

    def rpc_placement_group_table(self, conn: Connection, group_id: str | None = None):
        if group_id is None:
            return self.groups.table(self.nodes.alive())
        g = self.groups.get(group_id)
        return self.groups.view(g, self.nodes.alive()) if g is not None else None

    def rpc_get_placement_group(self, conn: Connection, name: str):
        g = self.groups.named(name)
        return self.groups.view(g, self.nodes.alive()) if g is not None else None

    # -- runtime_env packages: uploaded once by a caller, fetched once by each node -----------
    def rpc_has_package(self, conn: Connection, pkg_id: str) -> bool:
        return pkg_id in self.packages

    def rpc_put_package(self, conn: Connection, pkg_id: str, data: bytes) -> None:
        self.packages.put(pkg_id, data)

    def rpc_get_package(self, conn: Connection, pkg_id: str):
        return self.packages.get(pkg_id)

    # -- cluster information ------------------------------------------------------------------
    def rpc_nodes(self, conn: Connection):
        return self.nodes.public()

    def rpc_cluster_resources(self, conn: Connection):
        return self.nodes.cluster_resources()

    def rpc_available_resources(self, conn: Connection):
        return self.nodes.available_resources()

    # -- stopping ------------------------------------------------------------------------------
    async def rpc_shutdown(self, conn: Connection | None):   # None: a signal asked
        """Stop every node (and so every worker), then the head itself."""
        self.stopping = True
        for n in self.nodes.alive():
            try:
                await asyncio.wait_for(rpc.call(n.conn, "shutdown"), 5)
            except Exception as e:   # best effort: a node that misses it stops on its own
                log.debug("node %s did not confirm shutdown (its _head_lost stops it): %r",
                          n.node_id, e)
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

    def frame_received(self, conn: Connection, segs):
        node = conn.info.node
        if node is not None:
            node.heard()
        super().frame_received(conn, segs)


def _push_all(conns, event, data):
    for conn in list(conns):
        rpc.push(conn, event, data)


def _field(data, key: str, event: str) -> str:
    """``data[key]`` of a one-key push (a str id); ``MessageError`` if it is not there."""
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, str):
        raise MessageError(f"a {event} push must be a dict with a str {key!r}, got {data!r:.80}")
    return value


def run_head(*, host: str, port: int, token: str | None, stdin_lifeline: bool = False,
             ready_out=None, dashboard: dict | None = None) -> None:
    """Run a head until it is shut down; ``dashboard`` (``{"host", "port", "fallback"}``)
    serves the web dashboard too."""
    config.raise_open_file_limit()
    # The head moves no bulk data: freed receive buffers must go back to the system
    # instead of piling up in malloc's heap (see the function).
    process.pin_malloc_mmap_threshold()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    token = process.resolve_token(token) or generate_token()
    head = Head(loop, token, host, port, dashboard)
    loop.run_until_complete(head.start())
    session = os.path.join(config.session_root(), f"head-{head.port}")
    os.makedirs(session, mode=0o700, exist_ok=True)
    token_file = os.path.join(session, "token")
    write_token_file(token_file, token)

    def stop(*_):
        head.background.spawn(head.rpc_shutdown(None))

    process.stop_on_signals(loop, stop, stdin_lifeline)
    if ready_out is not None:
        process.announce_ready(ready_out, {
            "address": head.address, "token_file": token_file, "pid": os.getpid(),
            "dashboard_url": head.dashboard.url})
    loop.run_until_complete(head.stopped)
    loop.run_until_complete(head.dashboard.stop())
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
    p.add_argument("--dashboard-host", default="127.0.0.1")
    p.add_argument("--dashboard-port", type=int, default=0, help="0: no dashboard")
    p.add_argument("--dashboard-port-fallback", action="store_true",
                   help="take any free port if --dashboard-port is taken")
    a = p.parse_args(argv)
    dashboard = None
    if a.dashboard_port:
        from .dashboard import MISSING_MESSAGE, available

        if not available():
            p.exit(2, f"ddlf head: {MISSING_MESSAGE}\n")
        dashboard = {"host": a.dashboard_host, "port": a.dashboard_port,
                     "fallback": a.dashboard_port_fallback}
    if a.token:
        print("ddlf head: warning: --token is visible to every local user in the process "
              "list; pass the token in DDLF_AUTH_TOKEN instead", file=sys.stderr)
    run_head(host=a.host, port=a.port, token=a.token, stdin_lifeline=a.stdin_lifeline,
             ready_out=sys.stdout, dashboard=dashboard)
