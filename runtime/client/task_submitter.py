"""Tasks, caller side: one ``TaskPool`` per kind of task, and the workers it leases.

Ray's ``NormalTaskSubmitter`` plays this part in its core worker. Tasks of one resource
shape, placement and runtime env share a pool: a queue, and worker leases granted by the
head that run its tasks (pipelined once no CPU is free). A task waits in the pool until
its arguments are ready; a task lost with its worker is retried (``max_retries``), and
one that raised may be (``retry_exceptions``). Results settle the caller's entries in the
object store; a generator task's items go to the core's ``Streams``.

Everything runs on the core's I/O thread. A pool is handed the owning core, of which it
uses only public attributes: ``store`` and ``streams``; ``head``, ``token`` and ``hello``
(connections); ``loop`` and ``background`` (timers, tasks); ``msg_ids`` and ``closed``.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING

from .. import config, shm_store
from ..errors import (
    DDLFError,
    PlacementGroupRemovedError,
    TaskCancelledError,
    UnschedulableError,
    WorkerCrashedError,
)
from ..scheduling import Scheduling
from ..wire import protocol, rpc
from ..wire.address import split_address
from ..wire.connection import connect
from ..wire.frames import TableFrameHandler
from ..wire.messages import LeaseGrant, MessageError
from ..wire.remote_error import decode_error
from ..wire.serialization import dumps, loads
from .dependencies import deps_state, ship_deps

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["Task", "Lease", "TaskPool", "LeaseHandler"]

log = logging.getLogger("ddlf.core")


class Task:
    __slots__ = ("obj_id", "fn_id", "fn_segments", "fn_name", "payload", "refs", "retries",
                 "retry_exc", "cancelled")

    def __init__(self, obj_id, fn_id, fn_segments, fn_name, payload, refs, retries):
        self.obj_id = obj_id
        self.fn_id = fn_id
        self.fn_segments = fn_segments
        self.fn_name = fn_name
        self.payload = payload
        self.refs = refs
        self.retries = retries
        self.retry_exc = None     # retry_exceptions: True, or a tuple of exception classes
        self.cancelled = False


class Lease:
    __slots__ = ("lease_id", "worker_id", "node_id", "conn", "inflight", "idle_timer",
                 "force_cancel")

    def __init__(self, lease_id, worker_id, node_id, conn: Connection | None = None):
        self.lease_id = lease_id
        self.worker_id = worker_id
        self.node_id = node_id
        # The worker's connection. A lease being opened gets it from TaskPool._request once
        # connected (its handler must exist first, to be handed to connect): until then
        # the lease is in no pool's leases and no frame has arrived, so nothing reads it.
        self.conn: Connection
        if conn is not None:
            self.conn = conn
        self.inflight: dict[int, Task] = {}
        self.idle_timer = None
        self.force_cancel: Task | None = None   # the task cancelled with force=True: its worker may exit


class TaskPool:
    """Tasks of one resource shape: a queue, and the worker leases that run them."""

    def __init__(self, core, demand: dict, sched: Scheduling | None = None,
                 runtime_env: dict | None = None):
        self.core = core
        self.store = core.store
        self.demand = demand
        self.sched = sched.to_wire() if sched is not None else None   # as lease_worker sends it
        self.runtime_env = runtime_env
        self.queue: collections.deque = collections.deque()
        self.leases: list[Lease] = []
        self.requesting = False
        self.retry_after = 0.0
        self.parked: dict[bytes, Task] = {}   # waiting for their arguments

    def add(self, task: Task) -> None:
        if task.refs:
            pending, failed = deps_state(self.store, task.refs)
            if failed is not None:
                self.store.copy_outcome(task.obj_id, failed)
                return
            if pending is not None:
                # Tasks have no ordering promise: park this one until its inputs exist.
                self.parked[task.obj_id] = task
                if self.store.on_done(pending, lambda: self._unpark(task)):
                    return
                return self._unpark(task)
        self.queue.append(task)
        self.pump()

    def _unpark(self, task: Task) -> None:
        if self.parked.pop(task.obj_id, None) is task:   # not cancelled meanwhile
            self.add(task)

    def cancel(self, obj_id: bytes, force: bool, recursive: bool) -> None:
        """Drop a task not yet sent, or ask its worker to cancel it (queued or running)."""
        task = self.parked.pop(obj_id, None)
        if task is not None:
            self.store.fail_cancelled(obj_id, f"task {task.fn_name}")
            return
        for i, task in enumerate(self.queue):
            if task.obj_id == obj_id:
                del self.queue[i]
                self.store.fail_cancelled(obj_id, f"task {task.fn_name}")
                return
        for lease in self.leases:
            for msg_id, task in lease.inflight.items():
                if task.obj_id == obj_id:
                    task.cancelled = True
                    task.retries = 0   # as in Ray, a cancelled task is never retried
                    flags = protocol.CANCEL_RECURSIVE if recursive else 0
                    if force:
                        flags |= protocol.CANCEL_FORCE
                        lease.force_cancel = task
                    if not lease.conn.closed:
                        lease.conn.send_msg(protocol.CANCEL, msg_id, [bytes((flags,))])
                    return

    def pump(self) -> None:
        """Send queued tasks to leases.

        An idle lease takes a task at once. A busy lease takes more (pipelined, up to
        ``config.TASK_PIPELINE_DEPTH``) only once the head has said that no CPU is free: otherwise a
        fast task could queue behind a slow one while another CPU sits idle.
        """
        queue = self.queue
        while queue:
            best = None
            for lease in self.leases:
                if lease.conn.closed:
                    continue  # aborted; its connection_closed (-> lost) has not run yet
                if best is None or len(lease.inflight) < len(best.inflight):
                    best = lease
            if best is None:
                break
            if best.inflight:
                if not self._saturated():
                    self._maybe_request()
                    break
                if len(best.inflight) >= config.TASK_PIPELINE_DEPTH:
                    break
            self._send(best, queue.popleft())
        if queue and not any(not lease.conn.closed for lease in self.leases):
            self._maybe_request()

    def _saturated(self) -> bool:
        """True while the head's last answer was "no free worker" (re-asked after a pause)."""
        return time.monotonic() < self.retry_after

    def _send(self, lease: Lease, task: Task) -> None:
        conn = lease.conn
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
            lease.idle_timer = None
        sent = conn.info.funcs
        if sent is None:
            sent = conn.info.funcs = set()
        if task.fn_id not in sent:
            conn.send_msg(protocol.FUNC, 0, [task.fn_id, *task.fn_segments])
            sent.add(task.fn_id)
        if task.refs:
            ship_deps(self.store, conn, task.refs)
        msg_id = next(self.core.msg_ids)
        lease.inflight[msg_id] = task
        conn.send_msg(protocol.CALL, msg_id, task.payload)

    def _maybe_request(self) -> None:
        if self.requesting or self.core.closed:
            return
        self.requesting = True
        self.core.background.spawn(self._request(wait=not self.leases))

    async def _request(self, wait: bool):
        lease = None
        try:
            reply = await rpc.call(self.core.head, "lease_worker", self.demand, wait, self.sched,
                                   self.runtime_env)
            if reply is None:
                self.retry_after = time.monotonic() + 0.05
                return
            grant = self._read_grant(reply)
            host, port = split_address(grant.address)
            lease = Lease(grant.lease_id, grant.worker_id, grant.node_id)
            handler = LeaseHandler(self, lease)
            try:
                lease.conn = await connect(host, port, self.core.token, handler)
            except Exception:
                await rpc.call(self.core.head, "return_lease", lease.lease_id)
                raise
            hello = {**self.core.hello, "demand": self.demand}   # get_assigned_resources
            lease.conn.send_msg(protocol.PUSH, 0, dumps(("hello", hello)))
            await shm_store.wait_hello(lease.conn)
            if lease.conn.closed:   # the worker went away while answering our hello
                await rpc.call(self.core.head, "return_lease", lease.lease_id)
                raise DDLFError("the leased worker closed its connection")
            self.leases.append(lease)
        except (UnschedulableError, PlacementGroupRemovedError) as e:
            while self.queue:
                self.store.fail(self.queue.popleft().obj_id, e)
        except Exception as e:
            # With leases in hand, treat a failed request like "nothing free" so that
            # pump() pipelines instead of asking again at once.
            self.retry_after = time.monotonic() + 0.05
            if not self.leases:
                err = e if isinstance(e, DDLFError) else DDLFError(f"could not lease a worker: {e}")
                while self.queue:
                    self.store.fail(self.queue.popleft().obj_id, err)
        finally:
            self.requesting = False
        self.pump()
        if (lease is not None and lease in self.leases and not lease.inflight
                and lease.idle_timer is None):
            # It came after the queue drained: without a timer it would hold its CPU
            # (at the head) until this process disconnects.
            lease.idle_timer = self.core.loop.call_later(config.LEASE_IDLE_S, self._return, lease)

    def _read_grant(self, reply) -> LeaseGrant:
        """The head's answer to lease_worker; MessageError, naming the fix, if malformed."""
        try:
            grant = LeaseGrant.from_wire(reply)
            if grant.lease_id is None:
                raise MessageError("it has no lease_id")
            split_address(grant.address)
            return grant
        except (MessageError, ValueError) as e:
            lease_id = reply.get("lease_id") if isinstance(reply, dict) else None
            if isinstance(lease_id, str) and lease_id:
                # Its worker may be held for us all the same: give it back.
                self.core.background.spawn(self._return_remote(lease_id))
            raise MessageError(
                f"could not lease a worker: the head's answer to lease_worker is malformed "
                f"({e}). Check that the head runs the same DDLF release as this "
                f"process.") from None

    def task_done(self, lease: Lease) -> None:
        if self.queue:
            self.pump()
        elif not lease.inflight and lease.idle_timer is None:
            lease.idle_timer = self.core.loop.call_later(config.LEASE_IDLE_S, self._return, lease)

    def _return(self, lease: Lease) -> None:
        lease.idle_timer = None
        if lease.inflight or lease not in self.leases:
            return
        self.leases.remove(lease)
        lease.conn.close()
        self.core.background.spawn(self._return_remote(lease.lease_id))

    async def _return_remote(self, lease_id):
        try:
            await rpc.call(self.core.head, "return_lease", lease_id)
        except Exception as e:
            # The head link is closing or gone: the head releases every lease of this
            # process when that connection closes (Head._owner_gone).
            log.debug("returning lease %s: %r", lease_id, e)

    def lost(self, lease: Lease) -> None:
        if lease in self.leases:
            self.leases.remove(lease)
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
        inflight, lease.inflight = lease.inflight, {}
        if self.core.closed:
            return
        retry = []
        for task in inflight.values():
            if task.cancelled:
                how = ("ddlf.cancel(force=True) ended its worker process"
                       if lease.force_cancel is task else
                       "it was cancelled with ddlf.cancel(), then its worker process exited")
                self.store.fail(task.obj_id, TaskCancelledError(f"task {task.fn_name}: {how}"))
            elif lease.force_cancel is not None:
                # Queued behind a task that ddlf.cancel(force=True) killed: not their fault.
                retry.append(task)
            elif task.retries != 0:   # -1: unlimited, as in Ray
                if task.retries > 0:
                    task.retries -= 1
                retry.append(task)
            else:
                self.store.fail(task.obj_id, WorkerCrashedError(
                    f"the worker process running task {task.fn_name} died before it finished "
                    "(it exited, was killed, or ran out of memory)"))
        self.queue.extendleft(reversed(retry))
        self.pump()

    def close(self):
        for lease in self.leases:
            if lease.idle_timer is not None:
                lease.idle_timer.cancel()
            lease.conn.close()   # a lease in self.leases is connected


class LeaseHandler(TableFrameHandler):
    """The frames of one leased worker's connection (dispatched through FRAMES)."""

    __slots__ = ("pool", "lease")

    def __init__(self, pool: TaskPool, lease: Lease):
        self.pool = pool
        self.lease = lease

    def _on_stream(self, conn: Connection, kind, msg_id, segs):
        inflight = self.lease.inflight
        task = (inflight.get if kind == protocol.STREAM_ITEM else inflight.pop)(msg_id, None)
        if task is not None:
            self.pool.core.streams.frame(conn, kind, msg_id, task.obj_id, segs)
            if kind == protocol.STREAM_END:
                self.pool.task_done(self.lease)

    def _on_result(self, conn: Connection, kind, msg_id, segs):
        task = self.lease.inflight.pop(msg_id, None)
        if task is None:
            return
        if task.cancelled and self.lease.force_cancel is task:
            self.lease.force_cancel = None   # it ended before force could kill its worker
        if (kind == protocol.RESULT_ERR and task.retry_exc is not None and task.retries != 0
                and not task.cancelled and _should_retry(task.retry_exc, segs)):
            if task.retries > 0:
                task.retries -= 1
            self.pool.queue.append(task)   # as in Ray, the retry may run on any worker
            self.pool.task_done(self.lease)
            return
        self.pool.store.complete_result(task.obj_id, kind, segs)
        self.pool.task_done(self.lease)

    def _on_shm_result(self, conn: Connection, kind, msg_id, segs):
        kind, segs = shm_store.client_result(conn, segs)
        self._on_result(conn, kind, msg_id, segs)

    def _on_shm_ack(self, conn: Connection, kind, msg_id, segs):
        shm_store.on_ack(conn, segs)

    def _on_push(self, conn: Connection, kind, msg_id, segs):
        event, data = loads(segs[1:])
        if event == "hello":
            shm_store.client_hello(conn, data)

    FRAMES = {protocol.STREAM_ITEM: _on_stream, protocol.STREAM_END: _on_stream,
              protocol.RESULT_OK: _on_result, protocol.RESULT_ERR: _on_result,
              protocol.RESULT_REFS: _on_result, protocol.RESULT_MULTI: _on_result,
              protocol.RESULT_SHM: _on_shm_result, protocol.SHM_ACK: _on_shm_ack,
              protocol.PUSH: _on_push}

    def connection_closed(self, conn: Connection, exc):
        self.pool.lost(self.lease)


def _should_retry(retry_exc, segs) -> bool:
    """retry_exceptions: does the exception a task raised call for a retry?

    Decided by the caller, which holds the option. An exception whose class cannot be
    rebuilt here matches only ``retry_exceptions=True``; a cancelled task never retries.
    """
    try:
        cause = decode_error(segs[1:]).cause
    except Exception:
        return retry_exc is True
    if isinstance(cause, TaskCancelledError):
        return False
    if retry_exc is True:
        return True
    return cause is not None and isinstance(cause, retry_exc)
