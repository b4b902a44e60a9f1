"""``NodeDaemon``: the node's link to the head, what the head may ask of it, and how its
parts are wired: a :class:`~pool.WorkerPool` (processes, through a
:class:`~launcher.ForkserverLauncher`), a :class:`~gpus.GpuAllocator` and a
:class:`~logs.LogTailer`.

The daemon registers with the head, heartbeats to it, answers its requests
(``start_actor``, ``lease_worker``, ``kill_actor`` ...), reports worker deaths, and
forwards worker output. It exits, killing its workers, when it is told to, when the head
is gone, or (embedded clusters) when its parent driver goes away.

If the head connection closes while the head is still there (the head declared this
node dead after missed heartbeats, e.g. it was stopped or starved of CPU), the daemon
kills its workers, whose actors the head already counts as dead, and registers again
as a new node, so a cluster does not silently lose its only node.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING

import psutil

from .. import config, process, runtime_env, shm_store
from ..errors import ConnectionLostError, DDLFError
from ..states import WorkerState
from ..wire import rpc
from ..wire.address import split_address
from ..wire.connection import connect, serve
from ..wire.messages import ActorCreation, ActorStarted, LeaseGrant, LogBatch, WorkerDied
from ..wire.remote_error import encode_error
from ..wire.taskgroup import TaskGroup
from .gpus import GpuAllocator, detect_gpus
from .launcher import ForkserverLauncher
from .logs import LogTailer
from .pool import WorkerPool, WorkerProc

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["NodeDaemon"]

log = logging.getLogger("ddlf.node")


class NodeDaemon:
    def __init__(self, loop, head_address: str, token: str, *, host: str = "127.0.0.1",
                 num_cpus: float | None = None, resources: dict | None = None,
                 node_id: str | None = None,
                 num_gpus: float | None = None, memory: float | None = None):
        self.loop = loop
        self.head_address = head_address
        self.token = token
        self.host = host
        self.node_id = node_id or uuid.uuid4().hex[:12]
        resources = dict(resources or {})
        # A "GPU" or "memory" given as a custom resource is a declared amount, as the flags.
        if num_gpus is None and "GPU" in resources:
            num_gpus = resources.pop("GPU")
        if memory is None and "memory" in resources:
            memory = resources.pop("memory")
        total = {"CPU": float(num_cpus if num_cpus is not None else os.cpu_count() or 1)}
        total.update({k: float(v) for k, v in resources.items() if k not in ("GPU", "memory")})
        self.gpus = GpuAllocator(detect_gpus(num_gpus), loop)
        if self.gpus.ids:
            total["GPU"] = float(len(self.gpus.ids))
        total["memory"] = float(memory if memory is not None else psutil.virtual_memory().total)
        total.setdefault(f"node:{host}", 1.0)
        self.resources = total
        self.log_dir = os.path.join(config.session_root(), f"node-{self.node_id}")
        os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        self.packages = runtime_env.PackageCache(os.path.join(self.log_dir, "runtime_env"),
                                                 self._fetch_package)
        self.head_conn: Connection | None = None
        self.server: asyncio.Server | None = None
        self.address: str | None = None
        self.stopping = False
        self.stopped = loop.create_future()
        self.background = TaskGroup(loop, "node")
        self.pool = WorkerPool(
            loop, ForkserverLauncher(loop, self._worker_args), self.background, self.log_dir,
            idle_task_cap=max(config.IDLE_TASK_MIN_CAP, 2 * int(total.get("CPU", 1))),
            on_exit=self._worker_exited)
        self.logs = LogTailer(loop, self.log_dir, self.pool.workers, self._push_logs,
                              self.background)

    # -- what peers may ask ----------------------------------------------------------------------
    def head_requests(self) -> dict:
        """What the head may ask of this node, on the connection the node opened to it."""
        return {
            "start_actor": self.rpc_start_actor,
            "lease_worker": self.rpc_lease_worker,
            "release_worker": self.rpc_release_worker,
            "kill_worker": self.rpc_kill_worker,
            "kill_actor": self.rpc_kill_actor,
            "shutdown": self.rpc_shutdown,
        }

    def rpc_handlers(self) -> dict:
        """What this node's own port answers: its workers announce themselves there.

        Nothing else: the head's requests (start_actor, kill_worker, shutdown ...) come
        only on the connection this node opened to the head, so a peer that merely holds
        the token cannot reach them through this port.
        """
        return {"worker_ready": self.rpc_worker_ready}

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.server = await serve(self.host, 0, self.token,
                                  rpc.RpcHandler(self, self.rpc_handlers()))
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"{self.host}:{port}"
        # Warm workers before the head learns of us: the first actor placed on a cold node
        # waits for the forkserver to start and import what workers need (0.3 s idle, 1-1.5 s
        # at load ~12 on 2 cores), longer than callers expect an actor to take to start
        # (Ray's doc example actors.py cancels its call 1 s after creating the actor).
        if not await self.pool.warm(config.START_TIMEOUT_S / 2):
            log.warning("the node's workers are not ready after %g s; registering anyway",
                        config.START_TIMEOUT_S / 2)
        await self._register()
        self.background.spawn(self._heartbeat())
        self.background.spawn(self._sweep_shm())
        self.logs.start()

    async def _register(self) -> None:
        hhost, hport = split_address(self.head_address)
        conn = await connect(hhost, hport, self.token,
                             rpc.RpcHandler(_HeadLink(self), self.head_requests()))
        try:
            await rpc.call(conn, "register_node", {
                "node_id": self.node_id, "address": self.address, "resources": self.resources,
                "pid": os.getpid(), **process.versions(),
            }, timeout=30)
        except BaseException:
            conn.close()
            raise
        self.head_conn = conn

    async def _head_lost(self) -> None:
        """The head connection closed: register again as a new node, or stop if the head is gone.

        Our workers' actors are already dead as far as the head is concerned (it pushed
        that to every caller), so they are killed rather than left running unseen.
        """
        old_id = self.node_id
        self.node_id = uuid.uuid4().hex[:12]   # workers started from now on belong to it
        await self.pool.kill_all()
        deadline = time.monotonic() + config.NODE_REJOIN_TIMEOUT_S
        refused, delay, why = 0, 0.1, ""
        while not self.stopping:
            try:
                await self._register()
            except (OSError, asyncio.TimeoutError, ConnectionLostError) as e:
                why = f"{type(e).__name__}: {e}"
                refused = refused + 1 if isinstance(e, ConnectionRefusedError) else 0
                if refused >= config.REJOIN_REFUSED_TRIES or time.monotonic() > deadline:
                    break
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)
                continue
            except DDLFError as e:
                why = str(e)   # a head with another token or version, or one that refuses us
                break
            log.warning("registered with the head again as node %s (was %s)", self.node_id, old_id)
            self.pool.refill()
            return
        if not self.stopping:
            log.warning("the head at %s is gone (%s); stopping this node", self.head_address, why)
            await self.shutdown()

    async def shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = self.pool.stopping = True
        await self.pool.kill_all()
        await self.pool.join_all(5)
        self.logs.drain()
        self.logs.close()
        _sweep_quietly()   # the workers are gone: so are their segments (and a dead driver's)
        self.packages.clear()
        if self.server is not None:
            self.server.close()
        if self.head_conn is not None:
            self.head_conn.close()
        self.background.close()
        if not self.stopped.done():
            self.stopped.set_result(None)

    async def _heartbeat(self):
        proc = psutil.Process()
        while not self.stopping:
            beat = {"node_id": self.node_id}
            try:
                beat.update(cpu_percent=psutil.cpu_percent(None),
                            mem_available=psutil.virtual_memory().available,
                            rss=proc.memory_info().rss)
            except (OSError, psutil.Error):
                pass  # e.g. out of descriptors: the beat itself matters more than its stats
            if self.head_conn is not None:   # (set by start(), before this loop began)
                rpc.push(self.head_conn, "heartbeat", beat)
            await asyncio.sleep(config.HEARTBEAT_INTERVAL_S)

    async def _sweep_shm(self):
        """The janitor of this host's shared memory: unlink dead processes' segments."""
        while not self.stopping:
            _sweep_quietly()
            await asyncio.sleep(config.SHM_SWEEP_INTERVAL_S)

    # -- workers -----------------------------------------------------------------------------
    def _worker_args(self, w: WorkerProc) -> tuple:
        """What ``worker_main`` is started with: where to announce itself, and to whom."""
        assert self.address is not None  # start() listens before the pool starts a worker
        host, port = split_address(self.address)
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        return (host, port, self.token, self.node_id, w.worker_id, self.head_address,
                self.host, w.log_prefix, env, os.getpid())

    def rpc_worker_ready(self, conn: Connection, worker_id, pid, port):
        if worker_id not in self.pool.workers:
            conn.close()   # a worker this node did not start (or one that exited)
            return None
        conn.info.worker = self.pool.ready(worker_id, pid, f"{self.host}:{port}", conn)
        return None

    def _worker_exited(self, w: WorkerProc, prev: WorkerState, code) -> None:
        """The node's part of a worker's exit (the pool frees it after)."""
        self._give_gpus(w)
        self.logs.finish(w)
        if not self.stopping and self.head_conn is not None:
            rpc.push(self.head_conn, "worker_died", WorkerDied(
                w.worker_id, w.actor_id, code, prev.value, w.pid,
                on_purpose=w.on_purpose and code == 0).to_wire())

    def _give_gpus(self, w: WorkerProc) -> None:
        share, w.gpu_share = w.gpu_share, 0.0
        if share:
            self.gpus.give_back(w.gpu_ids, share)

    def _push_logs(self, records: list) -> None:
        if self.head_conn is not None and not self.head_conn.closed:
            rpc.push(self.head_conn, "logs", LogBatch(records, self.host, self.node_id).to_wire())

    # -- runtime envs ------------------------------------------------------------------------
    async def _fetch_package(self, pkg_id: str):
        if self.head_conn is None:
            raise ConnectionLostError(f"cannot fetch runtime_env package {pkg_id}: this node "
                                      "is not registered with a head")
        return await rpc.call(self.head_conn, "get_package", pkg_id, timeout=300)

    async def _env_setup(self, env: dict | None, gpu_ids: list) -> dict:
        """What a worker applies before user code: the runtime env's (``env``, in its wire
        form) variables, unpacked packages (fetched from the head once per node) and its
        GPUs as CUDA_VISIBLE_DEVICES."""
        for pkg_id in runtime_env.packages(env):
            await self.packages.ensure(pkg_id)
        setup = runtime_env.local_setup(self.packages, env)
        if gpu_ids:
            setup.setdefault("env_vars", {})["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
            setup["gpu_ids"] = list(gpu_ids)
        return setup

    # -- requests from the head --------------------------------------------------------------
    async def rpc_start_actor(self, conn: Connection, wire: dict):
        creation = ActorCreation.from_wire(wire)
        gpus = float(creation.demand.get("GPU", 0))
        share = GpuAllocator.share(gpus)
        gpu_ids = await self.gpus.claim(gpus)
        try:
            setup = await self._env_setup(creation.runtime_env, gpu_ids)
        except Exception as e:
            self.gpus.give_back(gpu_ids, share)
            err = DDLFError(f"could not set up the runtime_env of actor {creation.class_name} "
                            f"on node {self.node_id}: {type(e).__name__}: {e}")
            return ActorStarted(False, [bytes(s) for s in encode_error(err, "runtime_env")]).to_wire()
        if setup:
            creation.env_setup = setup
        try:
            w = await self.pool.fresh()
        except BaseException:
            self.gpus.give_back(gpu_ids, share)
            raise
        w.gpu_ids, w.gpu_share = gpu_ids, share
        w.env_key = "actor"   # never back in a pool: the process ends with its actor
        w.state = WorkerState.ACTOR
        w.actor_id = creation.actor_id
        w.name = creation.class_name
        w.job_id = creation.job_id
        assert w.conn is not None  # the pool hands out only workers that announced themselves
        try:
            reply = ActorStarted.from_wire(
                await rpc.call(w.conn, "start_actor", creation.to_wire()))
        except Exception as e:
            self.pool.kill(w)
            raise DDLFError(f"worker {w.pid} died while starting actor {w.name}: {e}")
        if not reply.ok:
            w.actor_id = None  # a failed __init__ is reported here, not as a crash
            self.pool.kill(w)
            return ActorStarted(False, reply.error, pid=w.pid).to_wire()
        if conn.closed:
            # The head dropped us meanwhile: it will never know this actor. Do not leave
            # it running unseen.
            self.pool.kill(w)
            raise DDLFError("the head connection closed while the actor was starting")
        return ActorStarted(True, address=w.address, pid=w.pid, worker_id=w.worker_id).to_wire()

    async def rpc_lease_worker(self, conn: Connection, demand: dict | None = None, env: dict | None = None):
        gpus = float((demand or {}).get("GPU", 0))
        share = GpuAllocator.share(gpus)
        gpu_ids = await self.gpus.claim(gpus)
        key = (env or {}).get("key", "") + (f"|gpu={gpu_ids}" if gpu_ids else "")
        try:
            w = self.pool.take_idle_task(key)
            if w is None:
                setup = await self._env_setup(env, gpu_ids)
                w = await self.pool.fresh()
                assert w.conn is not None  # fresh() returns once the worker announced itself
                if setup:
                    try:
                        await rpc.call(w.conn, "setup_env", setup, timeout=60)
                    except BaseException:
                        self.pool.kill(w)
                        raise
                w.env_key = key
        except BaseException:
            self.gpus.give_back(gpu_ids, share)
            raise
        w.gpu_ids, w.gpu_share = gpu_ids, share
        w.state = WorkerState.TASK
        assert w.address is not None  # fresh or idle: it announced itself (with its address)
        if conn.closed:  # the head that asked for it is gone: nobody would release it
            self.pool.kill(w)
            raise DDLFError("the head connection closed while leasing a worker")
        return LeaseGrant(w.address, w.worker_id, w.pid, self.node_id).to_wire()

    def rpc_release_worker(self, conn: Connection, worker_id):
        w = self.pool.workers.get(worker_id)
        if w is not None and w.state is WorkerState.TASK:
            self._give_gpus(w)
            self.pool.park_task_worker(w)
        return None

    def rpc_kill_worker(self, conn: Connection, worker_id):
        # The head ends a leased worker whose placement group went away (head.py).
        w = self.pool.workers.get(worker_id)
        if w is not None:
            self.pool.kill(w)
        return None

    def rpc_kill_actor(self, conn: Connection, actor_id):
        self.pool.kill_actor(actor_id)
        return None

    async def rpc_shutdown(self, conn: Connection):
        self.loop.call_soon(lambda: self.background.spawn(self.shutdown()))
        return None

    def on_push(self, conn: Connection, event, data):
        w = conn.info.worker
        if event == "exiting_on_purpose" and w is not None:
            w.on_purpose = True

    def on_closed(self, conn: Connection, exc):
        w, conn.info.worker = conn.info.worker, None
        if w is not None and not w.exited and not self.stopping:
            # A worker that closed its control connection is on its way out; make sure.
            self.pool.kill(w)


class _HeadLink:
    """Pushes and the end of the connection this node opened to the head (the head's
    requests on it are answered from ``NodeDaemon.head_requests``)."""

    def __init__(self, node: NodeDaemon):
        self.node = node

    def on_push(self, conn: Connection, event, data):
        pass

    def on_closed(self, conn: Connection, exc):
        node = self.node
        if not node.stopping and conn is node.head_conn:
            log.warning("lost the head connection (%s); killing this node's workers and "
                        "registering again", exc or "closed by the head")
            node.background.spawn(node._head_lost())


def _sweep_quietly() -> None:
    try:
        shm_store.sweep()
    except Exception as e:  # a janitor must not take the node down
        log.warning("shared-memory sweep failed: %s", e)
