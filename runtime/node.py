"""The node daemon: one per host. Starts, watches and kills worker processes.

Workers come from a ``forkserver`` that has already imported the worker module, numpy
and cloudpickle, and the daemon keeps a few of them started ahead of need, so creating
an actor costs handing its class to an idle worker rather than starting Python.

The daemon registers with the head, heartbeats to it, answers its requests
(``start_actor``, ``lease_worker``, ``kill_actor`` ...), reports worker deaths, and
forwards worker output line by line. It exits, killing its workers, when it is told to,
when the head is gone, or (embedded clusters) when its parent driver goes away.

If the head connection closes while the head is still there (the head declared this
node dead after missed heartbeats, e.g. it was stopped or starved of CPU), the daemon
kills its workers, whose actors the head already counts as dead, and registers again
as a new node, so a cluster does not silently lose its only node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import psutil

from . import config, process, rpc, runtime_env, shm_store
from .address import split_address
from .connection import connect, serve
from .errors import ConnectionLostError, DDLFError
from .eventloop import new_event_loop
from .messages import ActorCreation, ActorStarted, LeaseGrant, LogBatch, WorkerDied
from .remote_error import encode_error
from .states import WorkerState
from .taskgroup import TaskGroup

__all__ = ["NodeDaemon", "main", "detect_gpus"]

log = logging.getLogger("ddlf.node")

_MARKER = "\x00ddlf:"


class WorkerProc:
    __slots__ = ("worker_id", "process", "pid", "address", "conn", "state", "actor_id", "ready",
                 "log_prefix", "offsets", "partial", "name", "job_id", "exited", "on_purpose",
                 "env_key", "gpu_ids", "gpu_share")

    def __init__(self, worker_id, log_prefix):
        self.worker_id = worker_id
        self.process = None
        self.pid = None
        self.address = None
        self.conn = None
        self.state = WorkerState.STARTING
        self.actor_id = None
        self.ready: asyncio.Future | None = None
        self.log_prefix = log_prefix
        self.offsets = {".out": 0, ".err": 0}
        self.partial = {".out": b"", ".err": b""}
        self.name = "worker"
        self.job_id = None
        self.exited = False
        self.on_purpose = False   # the actor said it exits on purpose (exit_actor/sys.exit(0))
        self.env_key = ""         # the runtime env (and GPU ids) it was set up for, for good
        self.gpu_ids: list = []
        self.gpu_share = 0.0      # what it holds of each GPU in gpu_ids (0 once given back)


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
        self.gpu_ids = detect_gpus(num_gpus)
        # GPU id -> the fraction of it not yet handed to a worker.
        self.gpu_free: dict = {g: 1.0 for g in self.gpu_ids}
        self._gpu_returned = asyncio.Event()
        if self.gpu_ids:
            total["GPU"] = float(len(self.gpu_ids))
        total["memory"] = float(memory if memory is not None else psutil.virtual_memory().total)
        total.setdefault(f"node:{host}", 1.0)
        self.resources = total
        self.log_dir = os.path.join(config.session_root(), f"node-{self.node_id}")
        os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        self.packages = runtime_env.PackageCache(os.path.join(self.log_dir, "runtime_env"),
                                                 self._fetch_package)
        self.workers: dict[str, WorkerProc] = {}
        self.idle_fresh: list[WorkerProc] = []
        # Idle task workers by the runtime env they were set up for: a worker set up for
        # one env never runs work of another.
        self.idle_task: dict[str, list[WorkerProc]] = {}
        self.head_conn = None
        self.server = None
        self.address = None
        self.stopping = False
        self._starting: set = set()
        self.stopped = loop.create_future()
        self.background = TaskGroup(loop, "node")
        self._ctx = multiprocessing.get_context("forkserver")
        # uvloop too: importing it costs each new worker 3 ms of CPU otherwise.
        self._ctx.set_forkserver_preload(
            ["ddlf_actors.runtime.worker", "numpy", "cloudpickle", "uvloop"])
        _skip_main_module_in_workers()
        self._refilling = False

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
        await self._register()
        self.background.spawn(self._heartbeat())
        self.background.spawn(self._tail_logs())
        self.background.spawn(self._sweep_shm())
        self._refill()

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
        await self._kill_workers()
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
            self._refill()
            return
        if not self.stopping:
            log.warning("the head at %s is gone (%s); stopping this node", self.head_address, why)
            await self.shutdown()

    async def _kill_workers(self) -> None:
        # Workers whose start() is still running in the executor have no pid yet; wait
        # for those starts so they can be killed too instead of being waited on for 5 s.
        starting = [t for t in self._starting if not t.done()]
        if starting:
            await asyncio.wait(starting, timeout=5)
        self.idle_fresh.clear()
        self.idle_task.clear()
        for w in list(self.workers.values()):
            if not w.exited:
                _signal(w.pid, signal.SIGKILL)

    async def shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        await self._kill_workers()
        procs = [w for w in self.workers.values() if w.process is not None and not w.exited]
        for w in procs:
            try:
                await self.loop.run_in_executor(None, w.process.join, 5)
            except Exception:
                pass
        self._drain_logs()
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
            rpc.push(self.head_conn, "heartbeat", beat)
            await asyncio.sleep(config.HEARTBEAT_INTERVAL_S)

    async def _sweep_shm(self):
        """The janitor of this host's shared memory: unlink dead processes' segments."""
        while not self.stopping:
            _sweep_quietly()
            await asyncio.sleep(config.SHM_SWEEP_INTERVAL_S)

    # -- workers -----------------------------------------------------------------------------
    def _spawn(self) -> WorkerProc:
        from .worker import worker_main

        wid = uuid.uuid4().hex[:12]
        w = WorkerProc(wid, os.path.join(self.log_dir, f"worker-{wid}"))
        w.ready = self.loop.create_future()
        host, port = split_address(self.address)
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        w.process = self._ctx.Process(
            target=worker_main, name=f"ddlf-worker-{wid}", daemon=False,
            args=(host, port, self.token, self.node_id, wid, self.head_address,
                  self.host, w.log_prefix, env, os.getpid()),
        )
        self.workers[wid] = w
        task = self.background.spawn(self._start_process(w))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)
        return w

    async def _start_process(self, w: WorkerProc):
        try:
            await self.loop.run_in_executor(None, w.process.start)
        except Exception as e:
            self.workers.pop(w.worker_id, None)
            if not w.ready.done():
                w.ready.set_exception(DDLFError(f"could not start a worker process: {e}"))
            return
        w.pid = w.process.pid
        _drop_parent_pipe(w.process)
        self.loop.add_reader(w.process.sentinel, self._on_exit, w)

    def rpc_worker_ready(self, conn, worker_id, pid, port):
        w = self.workers.get(worker_id)
        if w is None:
            conn.close()
            return None
        w.pid = pid
        w.conn = conn
        w.address = f"{self.host}:{port}"
        conn.info["worker"] = w
        if not w.ready.done():
            w.ready.set_result(None)
        return None

    def _on_exit(self, w: WorkerProc):
        try:
            self.loop.remove_reader(w.process.sentinel)
        except Exception:
            pass
        if w.exited:
            return
        w.exited = True
        w.process.join(0)
        code = w.process.exitcode
        prev = w.state
        w.state = WorkerState.DEAD
        self.workers.pop(w.worker_id, None)
        for pool in (self.idle_fresh, self.idle_task.get(w.env_key, ())):
            if w in pool:
                pool.remove(w)
        self._give_gpus(w)
        if not w.ready.done():
            w.ready.set_exception(DDLFError(f"worker process exited during start-up (exit code {code})"))
        self._read_logs(w)
        # While stopping, shutdown() may be joining this process from another thread.
        self._release(w, close_process=not self.stopping)
        if not self.stopping and self.head_conn is not None:
            rpc.push(self.head_conn, "worker_died", WorkerDied(
                w.worker_id, w.actor_id, code, prev.value, w.pid,
                on_purpose=w.on_purpose and code == 0).to_wire())
            self._refill()

    @staticmethod
    def _release(w: WorkerProc, close_process: bool = True) -> None:
        """Free what an exited worker holds: its process handle's pipe and its connection.

        Left to the garbage collector, they would linger: the worker and its control
        connection refer to each other (``w.conn``, ``conn.info["worker"]``), and only a
        full collection frees such cycles, which a quiet daemon seldom runs. Each one held
        two pipe descriptors and the connection's 256 KiB receive buffer.
        """
        conn, w.conn = w.conn, None
        if conn is not None:
            conn.info.pop("worker", None)
            conn.close()
        if close_process:
            try:
                w.process.close()
            except ValueError:  # still running: cannot happen once its sentinel fired
                pass

    def _refill(self):
        if self.stopping or self._refilling:
            return
        starting = sum(1 for w in self.workers.values() if w.state == WorkerState.STARTING)
        for _ in range(max(0, config.PRESTART_WORKERS - len(self.idle_fresh) - starting)):
            w = self._spawn()
            self.background.spawn(self._park(w))

    async def _park(self, w: WorkerProc):
        try:
            await w.ready
        except Exception:
            return
        if w.state == WorkerState.STARTING:
            w.state = WorkerState.IDLE
            self.idle_fresh.append(w)

    async def _fresh_worker(self) -> WorkerProc:
        if self.idle_fresh:
            w = self.idle_fresh.pop(0)
        else:
            starting = [w for w in self.workers.values() if w.state == WorkerState.STARTING]
            w = starting[0] if starting else self._spawn()
            w.state = WorkerState.CLAIMED
            await w.ready
        w.state = WorkerState.CLAIMED
        self._refill()
        return w

    # -- requests from the head --------------------------------------------------------------
    # -- runtime envs and GPUs ------------------------------------------------------------------
    async def _fetch_package(self, pkg_id: str):
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

    def _take_gpus(self, amount: float, share: bool = True) -> list | None:
        """Pick GPU ids for a demand of ``amount`` GPUs and mark them used.

        A fraction goes to the fullest GPU it still fits on, so fractions pack together
        and whole GPUs stay free; a whole number takes that many unused GPUs. When no
        GPU has room: None, or with ``share`` the least used ones, shared (GPU use is
        not enforced, as in Ray), with a warning.
        """
        free = self.gpu_free
        if amount <= 0 or not free:
            return []
        if amount < 1:
            fits = [g for g, f in free.items() if f + 1e-9 >= amount]
            if fits:
                ids = [min(fits, key=lambda g: free[g])]
            elif not share:
                return None
            else:
                ids = [max(free, key=lambda g: free[g])]
                log.warning("no single GPU has %.2f free; sharing GPU %s", amount, ids[0])
        else:
            n = int(round(amount))
            ids = [g for g, f in free.items() if f >= 1 - 1e-9][:n]
            if len(ids) < n:
                if not share:
                    return None
                ids = sorted(free, key=lambda g: -free[g])[:n]
                log.warning("fewer than %d unused GPUs; sharing GPUs %s", n, ids)
        for g in ids:
            free[g] -= self._gpu_share(amount)
        return ids

    async def _claim_gpus(self, amount: float) -> list:
        """GPU ids for a demand the head placed here, waiting briefly if none has room.

        The head counts this node's GPUs in total. It frees a killed actor's share at
        once, while its process may still be exiting here, and it cannot see how
        fractions are spread over GPUs; so a demand may arrive before a GPU is back.
        """
        deadline = self.loop.time() + config.GPU_WAIT_S
        while True:
            ids = self._take_gpus(amount, share=self.loop.time() >= deadline)
            if ids is not None:
                return ids
            self._gpu_returned.clear()
            try:
                await asyncio.wait_for(self._gpu_returned.wait(),
                                       max(0.01, deadline - self.loop.time()))
            except asyncio.TimeoutError:
                pass

    def _return_gpus(self, ids: list, share: float) -> None:
        for g in ids:
            if g in self.gpu_free:
                self.gpu_free[g] = min(1.0, self.gpu_free[g] + share)
        if ids:
            self._gpu_returned.set()

    def _give_gpus(self, w: WorkerProc) -> None:
        share, w.gpu_share = w.gpu_share, 0.0
        if share:
            self._return_gpus(w.gpu_ids, share)

    @staticmethod
    def _gpu_share(amount: float) -> float:
        return amount if amount < 1 else 1.0

    def _trim_idle_tasks(self, keep: str) -> None:
        """Bound idle task workers across runtime envs: end the oldest of other envs."""
        cap = max(config.IDLE_TASK_MIN_CAP, 2 * int(self.resources.get("CPU", 1)))
        total = sum(len(p) for p in self.idle_task.values())
        for key, pool in list(self.idle_task.items()):
            while total > cap and key != keep and pool:
                _signal(pool.pop(0).pid, signal.SIGKILL)
                total -= 1
            if not pool:
                self.idle_task.pop(key, None)

    async def rpc_start_actor(self, conn, creation: dict):
        creation = ActorCreation.from_wire(creation)
        gpus = float(creation.demand.get("GPU", 0))
        gpu_ids = await self._claim_gpus(gpus)
        try:
            setup = await self._env_setup(creation.runtime_env, gpu_ids)
        except Exception as e:
            self._return_gpus(gpu_ids, self._gpu_share(gpus))
            err = DDLFError(f"could not set up the runtime_env of actor {creation.class_name} "
                            f"on node {self.node_id}: {type(e).__name__}: {e}")
            return ActorStarted(False, [bytes(s) for s in encode_error(err, "runtime_env")]).to_wire()
        if setup:
            creation.env_setup = setup
        try:
            w = await self._fresh_worker()
        except BaseException:
            self._return_gpus(gpu_ids, self._gpu_share(gpus))
            raise
        w.gpu_ids, w.gpu_share = gpu_ids, self._gpu_share(gpus)
        w.env_key = "actor"   # never back in a pool: the process ends with its actor
        w.state = WorkerState.ACTOR
        w.actor_id = creation.actor_id
        w.name = creation.class_name
        w.job_id = creation.job_id
        try:
            reply = ActorStarted.from_wire(
                await rpc.call(w.conn, "start_actor", creation.to_wire()))
        except Exception as e:
            _signal(w.pid, signal.SIGKILL)
            raise DDLFError(f"worker {w.pid} died while starting actor {w.name}: {e}")
        if not reply.ok:
            w.actor_id = None  # a failed __init__ is reported here, not as a crash
            _signal(w.pid, signal.SIGKILL)
            return ActorStarted(False, reply.error, pid=w.pid).to_wire()
        if conn.closed:
            # The head dropped us meanwhile: it will never know this actor. Do not leave
            # it running unseen.
            _signal(w.pid, signal.SIGKILL)
            raise DDLFError("the head connection closed while the actor was starting")
        return ActorStarted(True, address=w.address, pid=w.pid, worker_id=w.worker_id).to_wire()

    async def rpc_lease_worker(self, conn, demand: dict | None = None, env: dict | None = None):
        gpus = float((demand or {}).get("GPU", 0))
        gpu_ids = await self._claim_gpus(gpus)
        key = (env or {}).get("key", "") + (f"|gpu={gpu_ids}" if gpu_ids else "")
        pool = self.idle_task.get(key)
        try:
            if pool:
                w = pool.pop()
            else:
                setup = await self._env_setup(env, gpu_ids)
                w = await self._fresh_worker()
                if setup:
                    try:
                        await rpc.call(w.conn, "setup_env", setup, timeout=60)
                    except BaseException:
                        _signal(w.pid, signal.SIGKILL)
                        raise
                w.env_key = key
        except BaseException:
            self._return_gpus(gpu_ids, self._gpu_share(gpus))
            raise
        w.gpu_ids, w.gpu_share = gpu_ids, self._gpu_share(gpus)
        w.state = WorkerState.TASK
        if conn.closed:  # the head that asked for it is gone: nobody would release it
            _signal(w.pid, signal.SIGKILL)
            raise DDLFError("the head connection closed while leasing a worker")
        return LeaseGrant(w.address, w.worker_id, w.pid, self.node_id).to_wire()

    def rpc_release_worker(self, conn, worker_id):
        w = self.workers.get(worker_id)
        if w is not None and w.state == WorkerState.TASK:
            self._give_gpus(w)
            w.state = WorkerState.IDLE
            self.idle_task.setdefault(w.env_key, []).append(w)
            self._trim_idle_tasks(w.env_key)
        return None

    def rpc_kill_worker(self, conn, worker_id):
        # The head ends a leased worker whose placement group went away (head.py).
        w = self.workers.get(worker_id)
        if w is not None:
            _signal(w.pid, signal.SIGKILL)
        return None

    def rpc_kill_actor(self, conn, actor_id):
        for w in list(self.workers.values()):
            if w.actor_id == actor_id:
                _signal(w.pid, signal.SIGKILL)
        return None

    async def rpc_shutdown(self, conn):
        self.loop.call_soon(lambda: self.background.spawn(self.shutdown()))
        return None

    def on_push(self, conn, event, data):
        w = conn.info.get("worker")
        if event == "exiting_on_purpose" and w is not None:
            w.on_purpose = True

    def on_closed(self, conn, exc):
        w = conn.info.pop("worker", None)
        if w is not None and not w.exited and not self.stopping:
            # A worker that closed its control connection is on its way out; make sure.
            _signal(w.pid, signal.SIGKILL)

    # -- logs --------------------------------------------------------------------------------
    async def _tail_logs(self):
        # Poll fast while workers print, back off while they are quiet: a node with
        # hundreds of idle actors must not spend its CPU looking at empty files.
        delay = config.LOG_POLL_S
        while not self.stopping:
            delay = config.LOG_POLL_S if self._drain_logs() else min(config.LOG_POLL_MAX_S, delay * 2)
            await asyncio.sleep(delay)

    def _drain_logs(self) -> bool:
        records = []
        for w in list(self.workers.values()):
            records.extend(self._read_logs(w, push=False))
        if records and self.head_conn is not None:
            rpc.push(self.head_conn, "logs", LogBatch(records, self.host, self.node_id).to_wire())
        return bool(records)

    def _read_logs(self, w: WorkerProc, push: bool = True) -> list:
        records = []
        for suffix in (".out", ".err"):
            path = w.log_prefix + suffix
            try:
                if os.stat(path).st_size <= w.offsets[suffix]:
                    continue  # one stat instead of open/seek/read/close per quiet file
                with open(path, "rb") as f:
                    f.seek(w.offsets[suffix])
                    data = f.read(1 << 20)
            except OSError:
                continue
            if not data:
                continue
            w.offsets[suffix] += len(data)
            data = w.partial[suffix] + data
            lines = data.split(b"\n")
            w.partial[suffix] = lines.pop()
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if line.startswith(_MARKER):
                    _, kind_name_job = line.split(":", 1)
                    parts = kind_name_job.split(":")
                    if len(parts) >= 3:
                        w.name, w.job_id = parts[1], parts[2] or None
                    continue
                records.append((w.job_id, w.name, w.pid, suffix[1:], line))
        if push and records and self.head_conn is not None and not self.head_conn.closed:
            rpc.push(self.head_conn, "logs", LogBatch(records, self.host, self.node_id).to_wire())
        return records


def _skip_main_module_in_workers() -> None:
    """Stop multiprocessing from re-running this process's ``__main__`` in every worker.

    Each process multiprocessing starts first re-executes the parent's main module (here
    the node daemon's own module, or the ``ddlf-node`` script) so that pickled references
    to ``__main__`` resolve. Workers never need it (their target is
    ``runtime.worker.worker_main``), and it cost each new worker about 7 ms of CPU: a
    third of an actor creation. The node runs no user code, so dropping the main-module
    entries from the start-up data is safe here; nothing else in the node uses them.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_ddlf_no_main", False):
        return

    def get_preparation_data(name):
        data = original(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    get_preparation_data._ddlf_no_main = True
    spawn.get_preparation_data = get_preparation_data


class _HeadLink:
    """Pushes and the end of the connection this node opened to the head (the head's
    requests on it are answered from ``NodeDaemon.head_requests``)."""

    def __init__(self, node: NodeDaemon):
        self.node = node

    def on_push(self, conn, event, data):
        pass

    def on_closed(self, conn, exc):
        node = self.node
        if not node.stopping and conn is node.head_conn:
            log.warning("lost the head connection (%s); killing this node's workers and "
                        "registering again", exc or "closed by the head")
            node.background.spawn(node._head_lost())


def _drop_parent_pipe(process) -> None:
    """Close the spare pipe end multiprocessing keeps for each forkserver child.

    ``popen_forkserver`` holds a duplicate of the data pipe's write end for the child's
    whole life, only so that ``multiprocessing.parent_process().is_alive()`` works in the
    child. Workers watch the node by pid and by their control connection instead, so it
    is one descriptor per worker the node does not need (with it, a node held three per
    actor and hit a soft limit of 1024 at about 330 actors). If this Python's internals
    differ, the pipe is simply left open.
    """
    popen = getattr(process, "_popen", None)
    fin = getattr(popen, "finalizer", None)
    args = getattr(fin, "_args", None)
    sentinel = getattr(popen, "sentinel", None)
    if not (isinstance(args, tuple) and len(args) == 2 and args[1] == sentinel
            and isinstance(args[0], int)):
        return
    fin.cancel()
    popen.finalizer = multiprocessing.util.Finalize(
        popen, multiprocessing.util.close_fds, (sentinel,))
    try:
        os.close(args[0])
    except OSError:
        pass


def _sweep_quietly() -> None:
    try:
        shm_store.sweep()
    except Exception as e:  # a janitor must not take the node down
        log.warning("shared-memory sweep failed: %s", e)


def _signal(pid, sig) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def detect_gpus(declared: float | None = None) -> list:
    """The GPU ids this node offers.

    As in Ray: the entries of ``CUDA_VISIBLE_DEVICES`` when it is set (kept as strings),
    else ``0 .. n-1`` for the n GPUs ``nvidia-smi -L`` lists (none without it). A declared
    count (``--num-gpus``) keeps the first n visible ids, or numbers them ``0 .. n-1``;
    declaring more than ``CUDA_VISIBLE_DEVICES`` lists is an error.
    """
    if declared is not None and (isinstance(declared, bool) or declared < 0
                                 or float(declared) != int(declared)):
        raise DDLFError(f"num_gpus of a node must be a whole number >= 0, got {declared!r}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [] if visible.strip() in ("", "NoDevFiles") else [
            i.strip() for i in visible.split(",") if i.strip()]
        if declared is None:
            return ids
        if int(declared) > len(ids):
            raise DDLFError(f"num_gpus={declared:g} but CUDA_VISIBLE_DEVICES={visible!r} lists "
                            f"{len(ids)} GPU(s); declare at most {len(ids)} or widen "
                            "CUDA_VISIBLE_DEVICES")
        return ids[:int(declared)]
    if declared is not None:
        return list(range(int(declared)))
    return list(range(_nvidia_smi_count()))


def _nvidia_smi_count() -> int:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def run_node(head_address: str, token: str, *, host: str, num_cpus, resources, node_id=None,
             stdin_lifeline: bool = False, ready_out=None, num_gpus=None, memory=None) -> None:
    """Run a node daemon in this process until it is stopped."""
    config.raise_open_file_limit()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        node = NodeDaemon(loop, head_address, token, host=host, num_cpus=num_cpus,
                          resources=resources, node_id=node_id, num_gpus=num_gpus, memory=memory)
    except DDLFError as e:
        print(f"ddlf node: {e}", file=sys.stderr)
        sys.exit(2)

    def stop(*_):
        node.background.spawn(node.shutdown())

    process.stop_on_signals(loop, stop, stdin_lifeline)
    try:
        loop.run_until_complete(node.start())
    except (DDLFError, OSError) as e:
        msg = str(e)
        if isinstance(e, rpc.RemoteRpcError) or not msg:
            msg = f"{type(e).__name__}: {e}"
        print(f"ddlf node: could not join the head at {head_address}: {msg}", file=sys.stderr)
        loop.run_until_complete(node.shutdown())
        sys.exit(1)
    if ready_out is not None:
        process.announce_ready(ready_out, {"node_id": node.node_id, "address": node.address,
                                           "pid": os.getpid()})
    loop.run_until_complete(node.stopped)
    loop.run_until_complete(asyncio.sleep(0.05))


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ddlf_actors.runtime.node")
    p.add_argument("--address", required=True, help="head host:port")
    p.add_argument("--token", help="deprecated: visible in the process list; set "
                                    "DDLF_AUTH_TOKEN in the environment or use --token-file")
    p.add_argument("--token-file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--num-cpus", type=float)
    p.add_argument("--resources", default="{}")
    p.add_argument("--num-gpus", type=float)
    p.add_argument("--memory", type=float, help="bytes of memory to offer (default: all)")
    p.add_argument("--node-id")
    p.add_argument("--stdin-lifeline", action="store_true")
    a = p.parse_args(argv)
    if a.token:
        print("ddlf node: warning: --token is visible to every local user in the process list; "
              "pass the token in DDLF_AUTH_TOKEN or with --token-file instead", file=sys.stderr)
    token = process.resolve_token(a.token, a.token_file)
    if not token:
        p.error("no token: pass --token, --token-file or set DDLF_AUTH_TOKEN")
    run_node(a.address, token, host=a.host, num_cpus=a.num_cpus, resources=json.loads(a.resources),
             node_id=a.node_id, stdin_lifeline=a.stdin_lifeline, ready_out=sys.stdout,
             num_gpus=a.num_gpus, memory=a.memory)


if __name__ == "__main__":
    main()
