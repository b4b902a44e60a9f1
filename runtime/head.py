"""The head: the cluster's directory of nodes, actors, names and leases.

Drivers, nodes and workers all connect here first. The head places actors and task
leases on nodes by free resources, restarts actors that may be restarted, answers
"where is actor X now", and fans worker logs out to the drivers that own them. Calls
to actors never pass through it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
import uuid

from . import __version__, config, rpc, scheduling
from .auth import generate_token, write_token_file
from .connection import serve
from .errors import ActorNameTakenError, UnschedulableError, VersionMismatchError
from .eventloop import new_event_loop

__all__ = ["Head", "main"]

log = logging.getLogger("ddlf.head")

PENDING, ALIVE, RESTARTING, DEAD = "PENDING", "ALIVE", "RESTARTING", "DEAD"
_WAIT_ACTOR_MAX_S = 30.0


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
        self.stats: dict = {}

    def heard(self) -> None:
        self.last_heartbeat = time.monotonic()
        self.missed = 0

    def public(self) -> dict:
        return {"node_id": self.node_id, "address": self.address, "alive": self.alive,
                "resources": dict(self.total), "available": dict(self.available),
                "heartbeat_age_s": round(time.monotonic() - self.last_heartbeat, 3),
                "pid": self.pid, "num_actors": len(self.actors)}


class ActorRecord:
    def __init__(self, spec: dict, owner: str | None):
        self.actor_id = spec["actor_id"]
        self.spec = spec
        self.name = spec.get("name")
        self.class_name = spec["class_name"]
        self.demand = spec.get("resources") or {}
        self.restarts_left = int(spec.get("max_restarts") or 0)
        self.detached = bool(spec.get("detached"))
        self.owner = owner
        self.state = PENDING
        self.epoch = 0
        self.node: NodeRecord | None = None
        self.address = None
        self.pid = None
        self.worker_id = None
        self.error = None          # serialized creation error, or a text reason
        self.killed = False
        self.changed = asyncio.Event()

    def view(self) -> dict:
        return {"actor_id": self.actor_id, "state": self.state, "epoch": self.epoch,
                "address": self.address, "pid": self.pid, "name": self.name,
                "class_name": self.class_name, "error": self.error,
                "node_id": self.node.node_id if self.node else None,
                "methods": self.spec.get("methods"),
                "max_task_retries": self.spec.get("max_task_retries", 0)}

    def touch(self):
        self.changed.set()
        self.changed = asyncio.Event()


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
        self.leases: dict[str, tuple] = {}          # lease id -> (node, demand, worker_id, job)
        self.lent: set[str] = set()   # leases whose task waits in get; resources lent out
        self.pending: list[tuple] = []              # (demand, future) waiting for resources
        self.packages: dict[str, bytes] = {}        # runtime_env packages, by id, for nodes
        self.server = None
        self.stopping = False
        self.stopped = loop.create_future()
        self.handler = _HeadRpcHandler(self)

    async def start(self):
        self.server = await serve(self.host, self.port, self.token, self.handler)
        self.port = self.server.sockets[0].getsockname()[1]
        self.loop.create_task(self._watch_nodes())

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- registration ------------------------------------------------------------------------
    def _check_version(self, info: dict, who: str):
        py = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if info.get("version") != __version__ or info.get("python") != py:
            raise VersionMismatchError(
                f"{who} runs DDLF {info.get('version')} on Python {info.get('python')}, but the head "
                f"runs DDLF {__version__} on Python {py}. Install the same DDLF and Python "
                "major.minor on every host.")

    def rpc_register_node(self, conn, info: dict):
        self._check_version(info, f"node {info.get('address')}")
        rec = NodeRecord(info, conn)
        self.nodes[rec.node_id] = rec
        conn.info["node"] = rec
        log.info("node %s joined at %s with %s", rec.node_id, rec.address, rec.total)
        self._push_all_drivers("nodes_changed", self._node_totals())
        self._retry_pending()
        return {"head_address": self.address}

    def rpc_hello_driver(self, conn, info: dict):
        self._check_version(info, "this driver")
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

    def on_push(self, conn, event, data):
        if event == "heartbeat":
            n = self.nodes.get(data["node_id"])
            if n is not None:
                n.heard()
                n.stats = data
        elif event == "worker_died":
            self._worker_died(conn.info.get("node"), data)
        elif event == "task_blocked":
            self._lend(data.get("worker_id"))
        elif event == "task_unblocked":
            self._unlend(data.get("worker_id"))
        elif event == "logs":
            self._route_logs(data)
        elif event == "release_name":
            r = self.reserved.get(data["actor_id"])
            # Only the connection that reserved a name may give it back.
            if r is not None and r["owner"] == conn.info.get("owner_id"):
                self._unreserve(data["actor_id"])

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
        for lease_id, (_node, _demand, _worker_id, owner) in list(self.leases.items()):
            if owner == owner_id:
                self._release_lease(lease_id)

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
        for lease_id, (n, *_rest) in list(self.leases.items()):
            if n is node:
                self.leases.pop(lease_id, None)
                self.lent.discard(lease_id)
        self._push_all_cores("node_dead", {"node_id": node.node_id, "why": why})
        for actor_id in list(node.actors):
            a = self.actors.get(actor_id)
            if a is not None and a.state in (ALIVE, PENDING):
                self._actor_lost(a, f"its node {node.node_id} died ({why})")
        self._push_all_drivers("nodes_changed", self._node_totals())

    # -- placement ---------------------------------------------------------------------------
    def _alive_nodes(self):
        return [n for n in self.nodes.values() if n.alive]

    def _unschedulable(self, demand: dict, what: str, nodes, pin: str | None = None):
        """The error for a demand that no (live, or pinned) node can ever meet."""
        if pin and not nodes:
            n = self.nodes.get(pin)
            state = "is dead" if n is not None else "is not in this cluster"
            return UnschedulableError(
                f"{what} is pinned to node {pin}, which {state}. Pin it to a live node "
                "(see ddlf.nodes()) or drop node_id=.")
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

    async def _place(self, demand: dict, what: str, pin: str | None = None) -> NodeRecord:
        """Reserve ``demand`` on a node; wait while it fits the cluster but not its free space."""
        while True:
            nodes = self._alive_nodes()
            if pin:
                nodes = [n for n in nodes if n.node_id == pin]
            if not nodes or not scheduling.feasible_anywhere(demand, [n.total for n in nodes]):
                raise self._unschedulable(demand, what, nodes, pin)
            node = scheduling.choose_node(demand, nodes, load_key=lambda n: len(n.actors))
            if node is not None:
                scheduling.subtract(node.available, demand)
                return node
            fut = self.loop.create_future()
            self.pending.append((demand, fut))
            await fut

    def _retry_pending(self):
        pending, self.pending = self.pending, []
        for _demand, fut in pending:
            if not fut.done():
                fut.set_result(None)

    def _free(self, node: NodeRecord | None, demand: dict):
        if node is not None and node.alive:
            scheduling.add(node.available, demand, node.total)
        self._retry_pending()

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

    async def rpc_create_actor(self, conn, spec: dict):
        name = spec.get("name")
        if name:
            self._claim_name(name, spec["actor_id"])
        a = ActorRecord(spec, conn.info.get("owner_id"))
        self.actors[a.actor_id] = a
        self._unreserve(a.actor_id)
        await self._start_actor(a)
        return a.view()

    async def _start_actor(self, a: ActorRecord):
        what = f"actor {a.class_name}"
        try:
            node = await self._place(a.demand, what, a.spec.get("node_id"))
        except UnschedulableError as e:
            self._set_dead(a, str(e), error_obj=e)
            return
        if a.state == DEAD:  # killed while waiting for resources
            self._free(node, a.demand)
            return
        a.node = node
        node.actors.add(a.actor_id)
        try:
            reply = await rpc.call(node.conn, "start_actor", a.spec)
        except Exception as e:
            node.actors.discard(a.actor_id)
            self._free(node, a.demand)
            self._actor_lost(a, f"its node failed to start it: {e}")
            return
        if not reply["ok"]:
            node.actors.discard(a.actor_id)
            self._free(node, a.demand)
            a.node = None
            self._set_dead(a, "its __init__ raised", creation_error=reply["error"])
            return
        if a.state == DEAD:  # killed while starting
            await self._safe_call(node.conn, "kill_actor", a.actor_id)
            return
        a.address, a.pid, a.worker_id = reply["address"], reply["pid"], reply["worker_id"]
        a.state = ALIVE
        a.epoch += 1
        a.touch()

    def _set_dead(self, a: ActorRecord, why: str, creation_error=None, error_obj=None):
        a.state = DEAD
        a.error = {"reason": why, "creation_error": creation_error,
                   "unschedulable": isinstance(error_obj, UnschedulableError)}
        a.address = None
        if a.node is not None:
            a.node.actors.discard(a.actor_id)
            self._free(a.node, a.demand)
            a.node = None
        if a.name and self.names.get(a.name) == a.actor_id:
            self.names.pop(a.name, None)
        a.touch()

    def _actor_lost(self, a: ActorRecord, why: str):
        """The actor's process is gone: restart it if allowed, else mark it dead."""
        # Callers holding a connection to it may never see that connection close (a cut
        # link sends no FIN): tell every core, so in-flight calls fail instead of hanging.
        self._push_all_cores("actor_lost", {"actor_id": a.actor_id, "epoch": a.epoch, "why": why})
        if a.node is not None:
            a.node.actors.discard(a.actor_id)
            self._free(a.node, a.demand)
            a.node = None
        if a.killed or a.state == DEAD:
            self._set_dead(a, a.error["reason"] if a.error else why)
            return
        if a.restarts_left != 0:   # -1: unlimited, as in Ray
            if a.restarts_left > 0:
                a.restarts_left -= 1
            a.state = RESTARTING
            a.address = None
            a.touch()
            log.info("restarting actor %s (%s); %d restarts left", a.class_name, why, a.restarts_left)
            self.loop.create_task(self._start_actor(a))
        else:
            self._set_dead(a, why)

    def _worker_died(self, node: NodeRecord | None, data: dict):
        actor_id = data.get("actor_id")
        if actor_id:
            a = self.actors.get(actor_id)
            if a is not None and a.worker_id == data["worker_id"] and a.state == ALIVE:
                code = data.get("exitcode")
                if data.get("on_purpose"):
                    # sys.exit(0) or exit_actor(), announced by the worker: it left on
                    # purpose, as in Ray. A bare os._exit(0) is not announced, so it is
                    # a crash and restarts.
                    a.killed = True
                    self._actor_lost(a, f"it exited on purpose (sys.exit(0) or exit_actor(), "
                                        f"pid {data.get('pid')}); it is not restarted")
                else:
                    self._actor_lost(a, f"its process (pid {data.get('pid')}) died with exit "
                                        f"code {code}")
        for lease_id, (n, demand, worker_id, _job) in list(self.leases.items()):
            if worker_id == data["worker_id"]:
                self.leases.pop(lease_id, None)
                if lease_id in self.lent:
                    self.lent.discard(lease_id)
                else:
                    self._free(n, demand)

    async def rpc_wait_actor(self, conn, actor_id: str, after_epoch: int):
        """Return the actor's view once its epoch passes ``after_epoch`` or it is dead."""
        deadline = time.monotonic() + _WAIT_ACTOR_MAX_S
        while True:
            a = self.actors.get(actor_id)
            r = self.reserved.get(actor_id) if a is None else None
            if r is not None:
                # Named and reserved, but its creation request has not arrived yet.
                try:
                    await asyncio.wait_for(r["created"].wait(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    return {"actor_id": actor_id, "state": PENDING, "epoch": 0, "address": None}
                continue
            if a is None:
                return {"actor_id": actor_id, "state": DEAD, "epoch": 0, "address": None,
                        "error": {"reason": "no such actor in this cluster (it may have been "
                                  "created by a driver that has since disconnected)",
                                  "creation_error": None, "unschedulable": False}}
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
            return {"actor_id": actor_id, "class_name": r["class_name"], "methods": r["methods"]}
        return self.actors[actor_id].view()

    def rpc_kill_actor(self, conn, actor_id: str, no_restart: bool = True):
        a = self.actors.get(actor_id)
        if a is None or a.state == DEAD:
            return False
        self._kill(a, "it was killed with ddlf.kill()", no_restart)
        return True

    def _kill(self, a: ActorRecord, why: str, no_restart: bool = True):
        node = a.node
        if no_restart:
            a.killed = True
            self._set_dead(a, why)
        if node is not None and node.alive:
            self.loop.create_task(self._safe_call(node.conn, "kill_actor", a.actor_id))

    async def _safe_call(self, conn, method, *args):
        try:
            return await rpc.call(conn, method, *args)
        except Exception as e:
            log.debug("%s failed: %s", method, e)

    def rpc_list_actors(self, conn):
        return [a.view() for a in self.actors.values()]

    # -- task leases -------------------------------------------------------------------------
    async def rpc_lease_worker(self, conn, demand: dict, wait: bool, runtime_env=None):
        owner_id = conn.info.get("owner_id")
        if not wait:
            nodes = self._alive_nodes()
            node = scheduling.choose_node(demand, nodes)
            if node is None:
                if not nodes or not scheduling.feasible_anywhere(demand, [n.total for n in nodes]):
                    raise self._unschedulable(demand, "task", nodes)
                return None
            scheduling.subtract(node.available, demand)
        else:
            node = await self._place(demand, "task")
        try:
            # The node picks GPU ids and a worker set up for this runtime env.
            reply = await rpc.call(node.conn, "lease_worker", demand, runtime_env)
        except Exception:
            self._free(node, demand)
            raise
        lease_id = uuid.uuid4().hex[:12]
        self.leases[lease_id] = (node, demand, reply["worker_id"], owner_id)
        return {"lease_id": lease_id, **reply}

    def rpc_return_lease(self, conn, lease_id: str):
        self._release_lease(lease_id)
        return None

    def _release_lease(self, lease_id):
        entry = self.leases.pop(lease_id, None)
        if entry is None:
            return
        node, demand, worker_id, _ = entry
        if node.alive:
            self.loop.create_task(self._safe_call(node.conn, "release_worker", worker_id))
        if lease_id in self.lent:
            self.lent.discard(lease_id)  # already given back when it was lent
            return
        self._free(node, demand)

    def _lease_of(self, worker_id):
        for lease_id, (node, demand, wid, _owner) in self.leases.items():
            if wid == worker_id:
                return lease_id, node, demand
        return None, None, None

    def _lend(self, worker_id) -> None:
        """A leased task waits in get: give its resources to other work meanwhile."""
        lease_id, node, demand = self._lease_of(worker_id)
        if lease_id is None or lease_id in self.lent:
            return
        if sum(1 for lid in self.lent if self.leases[lid][0] is node) >= config.MAX_LENT_TASKS_PER_NODE:
            return  # bounded: this task keeps its CPU (see config)
        self.lent.add(lease_id)
        self._free(node, demand)

    def _unlend(self, worker_id) -> None:
        lease_id, node, demand = self._lease_of(worker_id)
        if lease_id is None or lease_id not in self.lent:
            return
        self.lent.discard(lease_id)
        scheduling.subtract(node.available, demand)  # may go below zero for a while

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
    def _route_logs(self, data: dict):
        by_job: dict = {}
        for rec in data["records"]:
            by_job.setdefault(rec[0], []).append(rec)
        for job_id, recs in by_job.items():
            targets = [self.drivers[job_id]] if job_id in self.drivers else (
                list(self.drivers.values()) if job_id is None else [])
            for conn in targets:
                rpc.push(conn, "logs", {"host": data["host"], "node_id": data.get("node_id"),
                                        "records": recs})

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
    token = token or os.environ.get("DDLF_AUTH_TOKEN") or generate_token()
    head = Head(loop, token, host, port)
    loop.run_until_complete(head.start())
    session = os.path.join(config.session_root(), f"head-{head.port}")
    os.makedirs(session, mode=0o700, exist_ok=True)
    token_file = os.path.join(session, "token")
    write_token_file(token_file, token)

    def stop(*_):
        loop.create_task(head.rpc_shutdown(None))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    if stdin_lifeline:
        from .node import _watch_stdin

        _watch_stdin(loop, stop)
    if ready_out is not None:
        ready_out.write("DDLF_READY " + json.dumps({"address": head.address, "token_file": token_file,
                                                    "pid": os.getpid()}) + "\n")
        ready_out.flush()
        # Nobody reads our stdout after the ready line: send later output to stderr so a
        # full pipe can never block this process.
        os.dup2(2, 1)
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
