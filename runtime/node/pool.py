"""The node's worker processes, from start to exit: started ahead of need, idle, claimed
for an actor, leased for tasks, and pooled again by runtime env.

Pure bookkeeping on the event loop: starting and killing processes is the launcher's
(``launcher.ForkserverLauncher``), so tests drive the pool with a fake one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import TYPE_CHECKING

from .. import config
from ..errors import DDLFError
from ..states import WorkerState

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["WorkerProc", "WorkerPool"]

log = logging.getLogger("ddlf.node")


class WorkerProc:
    """One worker process as its node sees it."""

    __slots__ = ("worker_id", "process", "pid", "address", "conn", "state", "actor_id", "ready",
                 "log_prefix", "name", "job_id", "exited", "on_purpose", "env_key", "gpu_ids",
                 "gpu_share")

    def __init__(self, worker_id: str, log_prefix: str, ready: asyncio.Future):
        self.worker_id = worker_id
        self.process = None
        self.pid: int | None = None
        self.address: str | None = None
        self.conn: Connection | None = None              # its control connection, once it is ready
        self.state = WorkerState.STARTING
        self.actor_id = None
        self.ready = ready            # settles when it announces itself
        self.log_prefix = log_prefix  # its output goes to log_prefix + ".out" / ".err"
        self.name = "worker"          # whose output it prints (from its log markers)
        self.job_id = None
        self.exited = False
        self.on_purpose = False   # the actor said it exits on purpose (exit_actor/sys.exit(0))
        self.env_key = ""         # the runtime env (and GPU ids) it was set up for, for good
        self.gpu_ids: list = []
        self.gpu_share = 0.0      # what it holds of each GPU in gpu_ids (0 once given back)


class WorkerPool:
    """Worker processes by id, the idle ones, and what happens when one exits.

    ``launcher`` starts (``await start(w, on_exit)``), kills, reaps and closes processes.
    ``on_exit(w, previous_state, exit_code)`` is the node's part of an exit (GPUs back,
    last output, telling the head); the pool then frees the worker and starts another.
    """

    def __init__(self, loop, launcher, background, log_dir: str, *, idle_task_cap: int,
                 on_exit=None, prestart: int | None = None):
        self.loop = loop
        self.launcher = launcher
        self.background = background   # a TaskGroup: owns the pool's tasks
        self.log_dir = log_dir
        self.idle_task_cap = idle_task_cap
        self.on_exit = on_exit
        self.prestart = config.PRESTART_WORKERS if prestart is None else prestart
        self.workers: dict[str, WorkerProc] = {}
        self.idle_fresh: list[WorkerProc] = []
        # Idle task workers by the runtime env they were set up for: a worker set up for
        # one env never runs work of another.
        self.idle_task: dict[str, list[WorkerProc]] = {}
        self.stopping = False
        self._starting: set = set()

    # -- starting ------------------------------------------------------------------------------
    def spawn(self) -> WorkerProc:
        """A new worker, starting (ready once it announces itself: ``ready``)."""
        wid = uuid.uuid4().hex[:12]
        w = WorkerProc(wid, os.path.join(self.log_dir, f"worker-{wid}"), self.loop.create_future())
        self.workers[wid] = w
        task = self.background.spawn(self._start(w))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)
        return w

    async def _start(self, w: WorkerProc) -> None:
        try:
            await self.launcher.start(w, self.exited)
        except Exception as e:
            self.workers.pop(w.worker_id, None)
            if not w.ready.done():
                w.ready.set_exception(e if isinstance(e, DDLFError) else DDLFError(
                    f"could not start a worker process: {e}"))

    def ready(self, worker_id: str, pid: int, address: str, conn: Connection) -> WorkerProc | None:
        """A worker announced itself (``worker_ready``); None if this pool never started it."""
        w = self.workers.get(worker_id)
        if w is None:
            return None
        w.pid, w.conn, w.address = pid, conn, address
        if not w.ready.done():
            w.ready.set_result(None)
        return w

    def refill(self) -> None:
        """Start workers until ``prestart`` are idle or on their way."""
        if self.stopping:
            return
        starting = sum(1 for w in self.workers.values() if w.state is WorkerState.STARTING)
        for _ in range(max(0, self.prestart - len(self.idle_fresh) - starting)):
            w = self.spawn()
            self.background.spawn(self._park(w))

    async def warm(self, timeout: float) -> bool:
        """Start the prestarted workers and wait, at most ``timeout`` s, until they are idle;
        whether they are. The first start also starts the forkserver, which imports what
        every worker needs: that is most of a new node's first actor start."""
        self.refill()
        starting = [w.ready for w in self.workers.values() if w.state is WorkerState.STARTING]
        if not starting:
            return True
        done, _ = await asyncio.wait(starting, timeout=timeout)
        return len(done) == len(starting)

    async def _park(self, w: WorkerProc) -> None:
        try:
            await w.ready
        except Exception:
            return
        if w.state is WorkerState.STARTING:
            w.state = WorkerState.IDLE
            self.idle_fresh.append(w)

    # -- handing workers out -----------------------------------------------------------------
    async def fresh(self) -> WorkerProc:
        """A worker never used, claimed: an idle one, else one starting, else a new one."""
        if self.idle_fresh:
            w = self.idle_fresh.pop(0)
        else:
            starting = [w for w in self.workers.values() if w.state is WorkerState.STARTING]
            w = starting[0] if starting else self.spawn()
            w.state = WorkerState.CLAIMED
            await w.ready
        w.state = WorkerState.CLAIMED
        self.refill()
        return w

    def take_idle_task(self, key: str) -> WorkerProc | None:
        """An idle task worker set up for runtime env ``key``, or None."""
        pool = self.idle_task.get(key)
        return pool.pop() if pool else None

    def park_task_worker(self, w: WorkerProc) -> None:
        """A task worker's lease ended: keep it idle for its runtime env."""
        w.state = WorkerState.IDLE
        self.idle_task.setdefault(w.env_key, []).append(w)
        self._trim_idle_tasks(w.env_key)

    def _trim_idle_tasks(self, keep: str) -> None:
        """Bound idle task workers across runtime envs: end the oldest of other envs."""
        total = sum(len(p) for p in self.idle_task.values())
        for key, pool in list(self.idle_task.items()):
            while total > self.idle_task_cap and key != keep and pool:
                self.launcher.kill(pool.pop(0))
                total -= 1
            if not pool:
                self.idle_task.pop(key, None)

    # -- ending --------------------------------------------------------------------------------
    def kill(self, w: WorkerProc) -> None:
        self.launcher.kill(w)

    def kill_actor(self, actor_id: str) -> None:
        for w in list(self.workers.values()):
            if w.actor_id == actor_id:
                self.launcher.kill(w)

    async def kill_all(self) -> None:
        """Kill every worker (their exits are handled as they come)."""
        # Workers whose start() is still running in the executor have no pid yet; wait
        # for those starts so they can be killed too instead of being waited on for 5 s.
        starting = [t for t in self._starting if not t.done()]
        if starting:
            await asyncio.wait(starting, timeout=5)
        self.idle_fresh.clear()
        self.idle_task.clear()
        for w in list(self.workers.values()):
            if not w.exited:
                self.launcher.kill(w)

    async def join_all(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s each) for every process still running to end."""
        for w in [w for w in self.workers.values() if w.process is not None and not w.exited]:
            try:
                await self.launcher.join(w, timeout)
            except Exception as e:
                # Shutting down: kill_all has SIGKILLed it already and the node exits next,
                # so a join that fails (or the executor refusing work) changes nothing.
                log.debug("joining worker %s (pid %s): %r", w.worker_id, w.pid, e)

    def exited(self, w: WorkerProc) -> None:
        """``w``'s process ended (the launcher calls this on the loop)."""
        if w.exited:
            return
        w.exited = True
        code = self.launcher.reap(w)
        prev, w.state = w.state, WorkerState.DEAD
        self.workers.pop(w.worker_id, None)
        for pool in (self.idle_fresh, self.idle_task.get(w.env_key, [])):
            if w in pool:
                pool.remove(w)
        if not w.ready.done():
            w.ready.set_exception(DDLFError(
                f"worker process exited during start-up (exit code {code})"))
        if self.on_exit is not None:
            self.on_exit(w, prev, code)
        # While stopping, shutdown may be joining this process from another thread.
        self.release(w, close_process=not self.stopping)
        self.refill()

    def release(self, w: WorkerProc, close_process: bool = True) -> None:
        """Free what an exited worker holds: its process handle's pipe and its connection.

        Left to the garbage collector, they would linger: the worker and its control
        connection refer to each other (``w.conn``, ``conn.info.worker``), and only a
        full collection frees such cycles, which a quiet daemon seldom runs. Each one held
        two pipe descriptors and the connection's 256 KiB receive buffer.
        """
        conn, w.conn = w.conn, None
        if conn is not None:
            conn.info.worker = None
            conn.close()
        if close_process:
            self.launcher.close(w)
