"""The worker process: becomes one actor, or runs tasks from a pool.

A node daemon starts workers ahead of need (through a forkserver that has already
imported this module, numpy and cloudpickle), so creating an actor only costs handing
its class to an idle worker. Callers connect to the worker directly; the data path
never relays through the node or the head.

Execution model (as in Ray's core worker):

* The event loop thread only does I/O: it authenticates callers, parses frames,
  resolves arguments and sends replies. It never runs user code that may block.
* Sync methods, sync tasks and the actor's ``__init__`` run on an execution thread
  (:class:`Executor`), in the order their frames arrived, so calls from one caller run
  in submission order. A minute-long ``train`` call therefore leaves the worker
  answering pings, accepting new callers and flushing replies. With
  ``max_concurrency > 1`` there are that many execution threads, and calls may overlap.
* ``async def`` methods run as tasks on the loop, at most ``max_concurrency`` at once.
* Objects (``OBJ`` frames) and task code (``FUNC`` frames) arrive once per connection
  and are cached until the owner frees them or the connection closes.

A worker exits as soon as its connection to the node daemon closes, so a node that
dies (even by SIGKILL) leaves no orphaned workers behind.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import inspect
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback

import psutil

from . import context, oob, protocol, rpc, runtime_env, shm_store
from . import core as core_mod
from .callspec import CallSpec, TaskSpec
from .connection import connect, serve
from .dependencies import resolve_args
from .errors import ActorDiedError, ActorExit, SerializationError, TaskCancelledError
from .eventloop import new_event_loop
from .messages import ActorCreation, ActorStarted
from .object_ref import set_default_resolver
from .remote_error import encode_error
from .serialization import dumps, loads
from .states import CallState
from .taskgroup import TaskGroup

__all__ = ["worker_main", "apply_sys_path"]

_pid = os.getpid()


def apply_sys_path(paths, cwd: str | None = None) -> None:
    """Put the caller's ``sys.path`` entries in front of ours, skipping ones absent here.

    This mirrors Ray: classes and functions defined in the driver's own modules (test
    files, scripts in the current folder) unpickle on workers of the same host. They go
    after the runtime env's working_dir and py_modules, which keep the front.
    """
    new = []
    for p in paths:
        if p == "" and cwd:
            p = cwd
        if p and p not in sys.path and p not in new and os.path.isdir(p):
            new.append(p)
    if new:
        at = runtime_env.front()
        sys.path[at:at] = new


def _apply_env(setup: dict | None) -> None:
    """Enter the runtime env (variables, cwd, sys.path, GPU ids) before any user code."""
    if not setup:
        return
    runtime_env.apply(setup)
    ctx = context.current
    ctx.runtime_env = setup.get("runtime_env")
    ctx.gpu_ids = list(setup.get("gpu_ids") or ())


class ObjectCache:
    """Objects shipped by callers, keyed by 16-byte id, deserialized on first use."""

    def __init__(self):
        self._raw: dict[bytes, list] = {}
        self._values: dict[bytes, object] = {}

    def raw(self, obj_id: bytes):
        """The shipped segments of ``obj_id``, or None."""
        return self._raw.get(obj_id)

    def add(self, obj_id: bytes, segments: list) -> None:
        self._raw[obj_id] = segments
        self._values.pop(obj_id, None)

    def get(self, obj_id: bytes):
        try:
            return self._values[obj_id]
        except KeyError:
            pass
        segs = self._raw.get(obj_id)
        if segs is None:
            raise KeyError(
                f"object {obj_id.hex()} was not shipped to this worker (was it freed by its owner?)"
            )
        value = loads(segs)
        self._values[obj_id] = value
        return value

    def drop(self, obj_id: bytes) -> None:
        self._raw.pop(obj_id, None)
        self._values.pop(obj_id, None)

    def __len__(self):
        return len(self._raw)


def _encode_result(value, where: str, can_block: bool = True):
    """(frame kind, segments) for a call's return value; a value that cannot be pickled,
    whatever pickling raises, becomes a ``SerializationError`` reply.

    A value holding ObjectRefs carries their objects along (RESULT_REFS), so the refs
    outlive this worker. Refs still pending are waited for first; with ``can_block``
    false (on the event loop) that returns None instead, and the caller retries on a
    thread.
    """
    try:
        segs, refs = core_mod.dumps_with_refs(value)
        if not refs:
            return protocol.RESULT_OK, segs
        pending = [r for r in refs if _is_pending(r)]
        if pending:
            if not can_block:
                return None
            for r in pending:
                r._core.wait([r], 1, None)
        return protocol.RESULT_REFS, core_mod.bundle_refs(refs, segs)
    except SerializationError as e:
        return protocol.RESULT_ERR, encode_error(e, where)
    except BaseException as e:
        err = SerializationError(f"the return value of {where} could not be pickled: "
                                 f"{type(e).__name__}: {e}")
        return protocol.RESULT_ERR, encode_error(err, where)


def _encode_returns(value, nret: int, where: str, can_block: bool = True):
    """RESULT_MULTI for a call declared with ``num_returns=nret`` (> 1): each value is
    encoded on its own, so each of the caller's refs gets its own object (or error)."""
    try:
        items = list(value)
    except TypeError:
        items = None
    if items is None or len(items) != nret:
        got = f"{len(items)} values" if items is not None else f"a {type(value).__name__}"
        err = ValueError(f"{where} was declared with num_returns={nret} but returned {got}; "
                         f"return a tuple or list of exactly {nret} values")
        return protocol.RESULT_ERR, encode_error(err, where)
    parts = []
    for item in items:
        part = _encode_result(item, where, can_block)
        if part is None:
            return None
        parts.append(part)
    return _multi(parts)


def _multi(parts):
    index = [(kind, len(segs)) for kind, segs in parts]
    return protocol.RESULT_MULTI, [pickle.dumps(index, protocol=5),
                                   *(seg for _, segs in parts for seg in segs)]


def _encode_yielded(gen, nret: int, where: str):
    """A generator called with ``num_returns=k``: its k yielded values are the k returns,
    as in Ray. An exception raised before the k-th value becomes the error of each
    return still missing. Runs on an execution thread; ``SystemExit`` propagates."""
    parts, error, extra = [], None, 0
    try:
        for item in gen:
            if len(parts) < nret:
                parts.append(_encode_result(item, where))
            else:
                extra += 1   # still run to the end: code after the last yield runs in Ray too
    except SystemExit:
        raise
    except BaseException as e:
        error = e
    if len(parts) < nret:
        if error is None:
            error = ValueError(f"{where} was declared with num_returns={nret} but its generator "
                               f"yielded {len(parts)} values; yield exactly {nret}")
        parts += [(protocol.RESULT_ERR, encode_error(error, where))] * (nret - len(parts))
    elif extra or error is not None:
        # As in Ray, the returns already made stand and the surplus is only reported.
        what = (f"yielded {extra} more values than that (ignored)" if extra
                else f"raised after its last value: {error!r}")
        print(f"ddlf: {where} was declared with num_returns={nret} but its generator {what}",
              file=sys.stderr, flush=True)
    return parts[0] if nret == 1 else _multi(parts)


def _as_iterator(value, where: str):
    """The sync iterator over what a generator call returned (an async generator, e.g. a
    task defined with ``async def ... yield``, is driven on a private event loop)."""
    if inspect.isgenerator(value):
        return value
    if inspect.isasyncgen(value):
        return _drive_async(value)
    raise TypeError(f"{where} was called with num_returns='streaming' or 'dynamic' but returned "
                    f"a {type(value).__name__}, not a generator; make it yield its values, or "
                    "call it with an int num_returns")


def _drive_async(agen):
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()


class _StreamOut:
    """Worker side of one generator call: the caller's backpressure credit.

    The generator pauses once ``limit`` items sent are still unconsumed by the caller
    (Ray's ``_generator_backpressure_num_objects``; -1: never). Credits arrive on the loop;
    a sync generator waits on ``cond`` in its execution thread, an async one on ``event``.
    """

    __slots__ = ("limit", "consumed", "cond", "event")

    def __init__(self, limit: int):
        self.limit = limit
        self.consumed = 0
        self.cond = threading.Condition()
        self.event: asyncio.Event | None = None

    def credit(self, consumed: int) -> None:
        with self.cond:
            self.consumed = sys.maxsize if consumed < 0 else max(self.consumed, consumed)
            self.cond.notify_all()
        if self.event is not None:
            self.event.set()

    def _ahead(self, sent: int) -> bool:
        return self.limit > 0 and sent - self.consumed >= self.limit

    def wait_credit(self, sent: int, conn) -> bool:
        """Block while too far ahead of the caller; False once the caller is gone."""
        if self._ahead(sent):
            with self.cond:
                # The timeout only re-checks conn.closed; credits wake us at once.
                while self._ahead(sent) and not conn.closed:
                    self.cond.wait(0.5)
        return not conn.closed

    async def await_credit(self, sent: int, conn) -> bool:
        while self._ahead(sent) and not conn.closed:
            if self.event is None:
                self.event = asyncio.Event()
            self.event.clear()
            try:
                await asyncio.wait_for(self.event.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        return not conn.closed


def _encode(value, nret: int, where: str, can_block: bool = True):
    if nret == 1:
        return _encode_result(value, where, can_block)
    return _encode_returns(value, nret, where, can_block)


_EXIT = -1  # an outcome kind: the method called sys.exit/exit_actor (never on the wire)


def _is_pending(ref) -> bool:
    e = ref._core.objects.get(ref.id) if ref._core is not None else None
    return e is not None and e.state == core_mod.PENDING


def _adopt_shipped(cache: ObjectCache):
    """Resolver for refs nested in call arguments: the caller shipped their objects."""
    def resolve(obj_id: bytes):
        segs = cache.raw(obj_id)
        if segs is None:
            return None
        return core_mod.get_core(auto=True).adopt(obj_id, core_mod.OK, segs)
    return resolve


class Executor:
    """Threads that run user code, in arrival order, off the event loop.

    ``submit(job)`` queues a job; a job runs on an execution thread and returns a
    callable (its *completion*, e.g. "send this reply") that then runs on the loop.
    Completions are handed back in batches: the loop is woken once per burst, not once
    per job, which keeps pipelined calls fast.
    """

    def __init__(self, loop, threads: int = 1, name: str = "ddlf-exec"):
        self._loop = loop
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: collections.deque = collections.deque()
        self._wake_pending = False
        self.stopped = False
        for i in range(threads):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def submit(self, job) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        jobs, done = self._jobs, self._done
        while True:
            job = jobs.get()
            if self.stopped:  # the actor is exiting: queued calls fail when it is gone
                return
            try:
                completion = job()
            except BaseException:  # jobs report their own errors; this is a bug guard
                traceback.print_exc()
                continue
            # Waiting for the next job must not keep this call's arguments (or result)
            # alive: they may be large, or map a shared-memory object its owner freed.
            job = None
            if completion is None:
                continue
            done.append(completion)
            completion = None
            # Same wake-once pattern as the client core: the loop clears the flag before
            # draining, so a completion appended after the drain schedules a new one.
            if not self._wake_pending:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop is closed: the process is exiting
                    return

    def _drain(self) -> None:
        self._wake_pending = False
        done = self._done
        while done:
            try:
                done.popleft()()
            except Exception:
                traceback.print_exc()


class Worker:
    """State of one worker process; also the RPC target for its node daemon."""

    def __init__(self, loop, node_id: str, worker_id: str, head_address: str, token: str):
        self.loop = loop
        self.background = TaskGroup(loop, "worker")
        self.objects = ObjectCache()
        set_default_resolver(_adopt_shipped(self.objects))
        self.functions: dict[bytes, list] = {}   # function id -> segments, then loaded fn
        self.loaded: dict[bytes, object] = {}
        self.is_actor = False
        self.exit_status = None
        self.callers: set = set()     # open caller connections, flushed before an exit
        self.instance = None
        self.actor_name = ""
        self.methods: dict[str, tuple] = {}
        self.semaphore: asyncio.Semaphore | None = None
        # Task workers get one execution thread; an actor's count is set by its
        # max_concurrency when it starts (threads are cheap until they run).
        self.executor: Executor | None = None
        self.node_conn = None
        self.server = None
        # (caller connection, message id) -> CallContext, from a call's arrival to its reply.
        self.calls: dict[tuple, context.CallContext] = {}
        self._seq = 0
        context.current = context.WorkerContext(head_address, token, node_id, worker_id)

    def _exec(self) -> Executor:
        if self.executor is None:
            self.executor = Executor(self.loop, 1)
        return self.executor

    # -- control plane (from the node daemon) ------------------------------------------------
    def rpc_handlers(self) -> dict:
        """What this worker's node daemon may ask of it."""
        return {"setup_env": self.rpc_setup_env, "start_actor": self.rpc_start_actor}

    def rpc_setup_env(self, conn, setup: dict):
        """A task worker's runtime env, set once, before its first task arrives."""
        _apply_env(setup)
        return None

    async def rpc_start_actor(self, conn, creation: dict):
        """Become the actor ``creation`` (an :class:`ActorCreation`) describes; return an
        :class:`ActorStarted` (with its init error if that failed).

        An ``async def __init__`` is awaited on this loop, where the actor's async
        methods run (as in Ray); an error in it is a creation error like a sync one's.
        """
        creation = ActorCreation.from_wire(creation)
        self.is_actor = True
        _apply_env(creation.env_setup)
        apply_sys_path(creation.sys_path, creation.cwd)
        ctx = context.current
        ctx.actor_id = creation.actor_id
        ctx.job_id = creation.job_id
        sched = creation.scheduling or {}
        if sched.get("group_id"):
            ctx.placement = {"group_id": sched["group_id"], "bundles": sched.get("bundles"),
                             "capture": bool(sched.get("capture"))}
        ctx.actor_info = {"name": creation.name, "class_name": creation.class_name,
                          "methods": creation.methods, "resources": creation.resources}
        self.actor_name = creation.class_name
        _log_marker(f"actor:{self.actor_name}:{ctx.job_id or ''}")
        for obj_id, segs in (creation.objects or {}).items():
            self.objects.add(obj_id, segs)
        max_conc = int(creation.max_concurrency or 1)
        self.semaphore = asyncio.Semaphore(max_conc)
        self.executor = Executor(self.loop, max_conc, name="ddlf-actor")
        done = self.loop.create_future()

        def construct():
            # Unpickling the class may import heavy modules and __init__ may build a
            # model: both run here, so the loop keeps answering the node meanwhile.
            where = f"loading {self.actor_name} (pid {_pid})"
            try:
                cls = loads(creation.class_segments)
                args, kwargs = loads(creation.args_segments)
                args, kwargs = resolve_args(args, kwargs, self.objects)
                where = f"{self.actor_name}.__init__ (pid {_pid})"
                if inspect.iscoroutinefunction(getattr(cls, "__init__", None)):
                    instance = cls.__new__(cls)
                    init = instance.__init__(*args, **kwargs)
                    return lambda: self.background.spawn(finish_async(instance, init, where))
                self.instance = cls(*args, **kwargs)
                reply = ActorStarted(True).to_wire()
            except BaseException as e:
                reply = _init_failed(e, where)
            return lambda: done.done() or done.set_result(reply)

        async def finish_async(instance, init, where):
            try:
                await init
                self.instance = instance
                reply = ActorStarted(True).to_wire()
            except BaseException as e:
                reply = _init_failed(e, where)
            if not done.done():
                done.set_result(reply)

        self.executor.submit(construct)
        return await done

    def on_push(self, conn, event, data):
        pass

    def on_closed(self, conn, exc):
        # The node daemon is gone (or shut us down): never outlive it.
        os._exit(0)

    # -- data plane (from callers) -------------------------------------------------------------
    def frame_received(self, conn, segs):
        kind, msg_id = protocol.parse_header(segs[0])
        if kind == protocol.CALL:
            if self.exit_status is not None:
                return  # exiting: the connection closes soon, failing this call
            if self.is_actor:
                self._actor_call(conn, msg_id, segs)
            else:
                self._task_call(conn, msg_id, segs)
        elif kind == protocol.OBJ:
            obj_id = bytes(segs[1])
            self.objects.add(obj_id, segs[2:])
            conn.info.setdefault("objects", set()).add(obj_id)
        elif kind == protocol.FREE:
            ids = bytes(segs[1])
            owned = conn.info.get("objects", set())
            for i in range(0, len(ids), 16):
                obj_id = ids[i : i + 16]
                self.objects.drop(obj_id)
                owned.discard(obj_id)
        elif kind == protocol.FUNC:
            self.functions[bytes(segs[1])] = segs[2:]
        elif kind == protocol.PUSH:
            event, data = loads(segs[1:])
            if event == "hello":
                apply_sys_path(data.get("sys_path", ()), data.get("cwd"))
                conn.info["demand"] = data.get("demand")   # a lease's resources, for tasks
                conn.info["shm_peer"] = shm_store.same_host(data.get("shm"))
                shm_store.send_hello(conn)   # the caller waits for ours before its first call
        elif kind == protocol.OBJ_SHM:
            obj_id, obj_segs = shm_store.worker_object(conn, segs)
            if obj_segs is not None:
                self.objects.add(obj_id, obj_segs)
                conn.info.setdefault("objects", set()).add(obj_id)
        elif kind == protocol.SHM_ACK:
            shm_store.on_ack(conn, segs)
        elif kind == protocol.STREAM_ITEM:   # a caller's backpressure credit
            out = conn.info.get("streams", {}).get(msg_id)
            try:
                consumed = protocol.STREAM_CREDIT.unpack(segs[1])[0]
            except Exception:
                conn.abort()
                return
            if out is not None:
                out.credit(consumed)
        elif kind == protocol.FETCH:
            oob.serve_fetch(conn, msg_id, segs, self.loop)
        elif kind == protocol.CANCEL:
            self._cancel(conn, msg_id, bytes(segs[1])[0] if len(segs) > 1 and len(segs[1]) else 0)
        else:
            conn.abort()

    def connection_closed(self, conn, exc):
        self.callers.discard(conn)
        for out in conn.info.get("streams", {}).values():
            out.credit(-1)   # wake paused generators: they see the caller is gone and stop
        for obj_id in conn.info.get("objects", ()):
            self.objects.drop(obj_id)
        conn.info.pop("shm_pins", None)

    def _outcome(self, fn, args, kwargs, where: str, nret: int = 1):
        """Run ``fn`` and serialize what it returns or raises: (frame kind, segments).

        Runs on an execution thread, so a large result is pickled off the loop too.
        """
        try:
            result = fn(*args, **kwargs)
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                return _encode_yielded(_as_iterator(result, where), nret, where)
        except SystemExit as e:
            if self.is_actor:
                self.executor.stopped = True  # run nothing after the exit
                return _EXIT, self._begin_exit(e, where)
            return protocol.RESULT_ERR, encode_error(e, where)
        except BaseException as e:
            if type(e) is KeyboardInterrupt:
                call = context.current_call()
                if call is not None and call.interrupted:   # ddlf.cancel's: Ray raises this
                    err = TaskCancelledError(f"task {call.name} was cancelled with "
                                             "ddlf.cancel() while it ran")
                    err.__cause__ = e
                    e = err
            return protocol.RESULT_ERR, encode_error(e, where)
        return _encode(result, nret, where)

    def _begin_exit(self, e: SystemExit, where: str) -> list:
        """``sys.exit`` or ``exit_actor()`` in an actor method: end this process, as in Ray.

        The calling method gets an ``ActorDiedError`` naming the exit; the process then
        exits with the same status, so the head restarts it (``max_restarts``) only when
        that status is non-zero. ``exit_actor()`` exits with 0: on purpose, no restart.
        """
        intended = isinstance(e, ActorExit)
        code = e.code
        status = 0 if code is None else code if isinstance(code, int) else 1
        if isinstance(code, str):
            print(code, file=sys.stderr)  # what the interpreter prints for sys.exit("msg")
        how = "exit_actor()" if intended else f"sys.exit({code!r})"
        then = ("it is not restarted" if status == 0 else
                "this counts as a crash: it is restarted if max_restarts allows")
        err = ActorDiedError(
            f"actor {self.actor_name} ({context.current.actor_id}) exited: {where} called "
            f"{how}, exit status {status}; {then}")
        self.exit_status = status
        return encode_error(err, where)

    def _exit_reply(self, conn, msg_id, segs) -> None:
        """On the loop: warn every caller, answer the exiting call, then exit.

        The "exiting" push goes out before the reply, so a caller has stopped sending on
        this connection by the time its user code sees the ActorDiedError: a call made
        next waits for the restarted actor (or fails as dead) instead of being lost here.
        """
        note = dumps(("exiting", {"status": self.exit_status}))
        for c in self.callers:
            if not c.closed and c is not conn:
                c.send_msg(protocol.PUSH, 0, note)
        if not conn.closed:
            # The caller may retry the very call that exited (max_task_retries).
            conn.send_msg(protocol.PUSH, 0, dumps(
                ("exiting", {"status": self.exit_status, "msg_id": msg_id})))
        if not conn.closed:
            conn.send_msg(protocol.RESULT_ERR, msg_id, segs)
        if self.exit_status == 0 and self.node_conn is not None and not self.node_conn.closed:
            # Status 0 alone does not mean "on purpose" (os._exit(0) is a crash, as in
            # Ray): say so to the node, which tells the head not to restart us.
            rpc.push(self.node_conn, "exiting_on_purpose", {})
        self._exit_after_replies()

    def _exit_after_replies(self) -> None:
        """Flush replies already queued, then exit with the status ``sys.exit`` gave."""
        deadline = time.monotonic() + 2.0

        def check():
            for c in [*self.callers, self.node_conn]:
                if c is not None and not c.closed:
                    c.flush()
            busy = [c for c in [*self.callers, self.node_conn] if c is not None
                    and c.transport is not None
                    and not c.transport.is_closing() and c.transport.get_write_buffer_size()]
            if busy and time.monotonic() < deadline:
                self.loop.call_later(0.01, check)
                return
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(self.exit_status)

        # Let completions already handed to the loop (the exiting call's reply) go first.
        self.loop.call_soon(check)

    def _new_call(self, conn, msg_id, name: str, fn, is_async: bool) -> context.CallContext:
        self._seq += 1
        call = self.calls[(conn, msg_id)] = context.CallContext(self._seq, name, fn, conn, is_async)
        return call

    def _run_job(self, conn, msg_id, fn, args, kwargs, where: str, nret: int,
                 call: context.CallContext):
        """An executor job: run the call, then send its outcome from the loop."""
        def job():
            if not call.claim():
                return None   # cancelled while queued here: already answered
            context.set_current_call(call)
            call.thread = threading.get_ident()
            call.state = CallState.RUNNING
            kind = segs = None
            try:
                # cancel() sets .cancelled before it reads .state: one of us sees the other.
                if not call.cancelled:
                    kind, segs = self._outcome(fn, args, kwargs, where, nret)
            except KeyboardInterrupt:
                kind = None   # a cancel's interrupt that landed in our code, not the user's
            while True:   # at most one interrupt is ever sent: this loop ends
                try:
                    _settle(call)
                    break
                except KeyboardInterrupt:
                    pass
            context.set_current_call(None)
            self.calls.pop((conn, msg_id), None)
            if kind is None or (call.cancelled and self.is_actor and kind != _EXIT):
                # As in Ray, a call the cancel reached while it ran has no other outcome.
                kind, segs = protocol.RESULT_ERR, encode_error(TaskCancelledError(
                    f"{call.name} was cancelled with ddlf.cancel() while it ran"), where)
            if kind == _EXIT:
                return lambda: self._exit_reply(conn, msg_id, segs)
            kind, segs = shm_store.wrap_result(conn, kind, segs)
            return lambda: conn.closed or conn.send_msg(kind, msg_id, segs)
        return job

    # -- generator calls (num_returns="streaming"/"dynamic") ------------------------------------
    def _open_stream(self, conn, msg_id, limit: int) -> _StreamOut:
        out = _StreamOut(limit)
        conn.info.setdefault("streams", {})[msg_id] = out
        return out

    def _send_item(self, conn, msg_id, index: int, kind: int, segs) -> None:
        if not conn.closed:
            conn.send_msg(protocol.STREAM_ITEM, msg_id,
                          [protocol.STREAM_ITEM_HEAD.pack(index, kind), *segs])

    def _end_stream(self, conn, msg_id, count: int) -> None:
        conn.info.get("streams", {}).pop(msg_id, None)
        if not conn.closed:
            conn.send_msg(protocol.STREAM_END, msg_id, [protocol.STREAM_COUNT.pack(count)])

    def _stream_job(self, conn, msg_id, fn, args, kwargs, where: str, out: _StreamOut,
                    enter=None):
        """An executor job: run a generator, sending each value as it is yielded.

        Items are handed to the loop with ``call_soon_threadsafe`` in yield order, the end
        too, so the end can never overtake an item.
        """
        post = self.loop.call_soon_threadsafe

        def job():
            if enter is not None:
                enter()
                context.set_running_task(True)
            index = 0
            try:
                items = _as_iterator(fn(*args, **kwargs), where)
                for item in items:
                    kind, segs = shm_store.wrap_result(conn, *_encode_result(item, where))
                    post(self._send_item, conn, msg_id, index, kind, segs)
                    index += 1
                    item = segs = None   # a paused generator must not pin the last value
                    if kind == protocol.RESULT_ERR or not out.wait_credit(index, conn):
                        items.close()   # unpicklable value, or the caller is gone
                        break
            except SystemExit as e:
                if self.is_actor:
                    self.executor.stopped = True
                    post(self._exit_reply, conn, msg_id, self._begin_exit(e, where))
                    return None
                post(self._send_item, conn, msg_id, index, protocol.RESULT_ERR,
                     encode_error(e, where))
                index += 1
            except BaseException as e:
                post(self._send_item, conn, msg_id, index, protocol.RESULT_ERR,
                     encode_error(e, where))
                index += 1
            finally:
                if enter is not None:
                    context.set_running_task(False)
            post(self._end_stream, conn, msg_id, index)
            return None
        return job

    async def _run_async_stream(self, conn, msg_id, fn, args, kwargs, where: str,
                                out: _StreamOut):
        """An ``async def ... yield`` method of an async actor, on the loop."""
        index = 0
        async with self.semaphore:
            try:
                agen = fn(*args, **kwargs)
                while True:
                    try:
                        item = await agen.__anext__()
                    except StopAsyncIteration:
                        break
                    enc = _encode_result(item, where, can_block=False)
                    if enc is None:   # it holds refs still pending: wait off the loop
                        enc = await self.loop.run_in_executor(None, _encode_result, item, where)
                    kind, segs = shm_store.wrap_result(conn, *enc)
                    self._send_item(conn, msg_id, index, kind, segs)
                    index += 1
                    item = segs = enc = None
                    if kind == protocol.RESULT_ERR or not await out.await_credit(index, conn):
                        await agen.aclose()
                        break
            except SystemExit as e:
                if self.executor is not None:
                    self.executor.stopped = True
                self._exit_reply(conn, msg_id, self._begin_exit(e, where))
                return
            except BaseException as e:
                self._send_item(conn, msg_id, index, protocol.RESULT_ERR, encode_error(e, where))
                index += 1
        self._end_stream(conn, msg_id, index)

    def _cancel(self, conn, msg_id: int, flags: int) -> None:
        """A CANCEL frame: drop the call if it is queued here; else interrupt it.

        A sync task gets a ``KeyboardInterrupt`` in its thread (or, with force, this
        process exits); an async task or method has its asyncio task cancelled; a
        running sync actor method only sees ``is_canceled()`` turn True, as in Ray.
        """
        call = self.calls.get((conn, msg_id))
        if call is None:
            return   # already finished: nothing to do
        force = bool(flags & protocol.CANCEL_FORCE) and not self.is_actor
        call.cancelled = True
        if call.claim():   # not started: it never will
            self.calls.pop((conn, msg_id), None)
            if call.atask is not None:
                call.atask.cancel()   # before its first step: none of its code runs
            what = call.name if self.is_actor else f"task {call.name}"
            self._reply_error(conn, msg_id, TaskCancelledError(
                f"{what} was cancelled with ddlf.cancel() while queued on its worker"),
                f"{what} (pid {_pid})")
            return
        if flags & protocol.CANCEL_RECURSIVE and call.children:
            core = core_mod.get_core(auto=False)
            if core is not None:
                ids = list(call.children)
                if force:   # this process exits next: send the cancels first
                    core.cancel_and_flush(ids, True, True)
                else:
                    core.submit_io(core.cancel_ids, ids, False, True)
        if force:
            _exit_now(1)
        if call.atask is not None:
            call.atask.cancel()
        elif not self.is_actor:
            _interrupt(call)

    def _reply(self, conn, msg_id, value, where: str, nret: int = 1):
        if conn.closed:
            return
        out = _encode(value, nret, where, can_block=False)
        if out is not None:
            kind, segs = shm_store.wrap_result(conn, *out)
            conn.send_msg(kind, msg_id, segs)
            return
        # The value holds refs still pending: wait for them off the loop.
        fut = self.loop.run_in_executor(None, _encode, value, nret, where)

        def send(f):
            if not conn.closed:
                kind, segs = shm_store.wrap_result(conn, *f.result())
                conn.send_msg(kind, msg_id, segs)

        fut.add_done_callback(send)

    def _reply_error(self, conn, msg_id, exc, where):
        if not conn.closed:
            conn.send_msg(protocol.RESULT_ERR, msg_id, encode_error(exc, where))

    def _actor_call(self, conn, msg_id, segs):
        # Arguments are resolved here, on the loop, in frame order: a FREE frame that
        # follows this call on the connection must not drop an object it still needs.
        try:
            spec = CallSpec.from_wire(loads(segs[1:]))
            name, nret, limit = spec.method, spec.num_returns, spec.backpressure
            args, kwargs = resolve_args(spec.args, spec.kwargs, self.objects)
            if self.instance is None:
                raise RuntimeError(f"actor {self.actor_name} is not constructed")
            entry = self.methods.get(name)
            if entry is None:
                fn = getattr(self.instance, name)
                entry = self.methods[name] = (fn, inspect.iscoroutinefunction(fn))
            fn, is_async = entry
        except BaseException as e:
            self._reply_error(conn, msg_id, e, f"{self.actor_name} (pid {_pid})")
            return
        if isinstance(nret, str):
            where = f"{self.actor_name}.{name} (pid {_pid})"
            out = self._open_stream(conn, msg_id, limit)
            if inspect.isasyncgenfunction(fn):
                self.background.spawn(
                    self._run_async_stream(conn, msg_id, fn, args, kwargs, where, out))
            else:
                self.executor.submit(
                    self._stream_job(conn, msg_id, fn, args, kwargs, where, out))
            return
        call = self._new_call(conn, msg_id, f"{self.actor_name}.{name}", fn, is_async)
        if is_async:
            call.atask = self.background.spawn(
                self._run_async(conn, msg_id, fn, args, kwargs, name, nret, call))
        else:
            self.executor.submit(self._run_job(
                conn, msg_id, fn, args, kwargs, f"{self.actor_name}.{name} (pid {_pid})", nret,
                call))

    async def _run_async(self, conn, msg_id, fn, args, kwargs, name, nret, call):
        where = f"{self.actor_name}.{name} (pid {_pid})"
        call.claim()   # started: from now on a cancel is answered here
        context.set_current_call(call)   # this asyncio task's own context
        try:
            async with self.semaphore:
                call.state = CallState.RUNNING
                try:
                    result = await fn(*args, **kwargs)
                except SystemExit as e:
                    if self.executor is not None:
                        self.executor.stopped = True
                    self._exit_reply(conn, msg_id, self._begin_exit(e, where))
                    return
                except asyncio.CancelledError:
                    raise
                except BaseException as e:
                    if not call.cancelled:
                        self._reply_error(conn, msg_id, e, where)
                        return
        except asyncio.CancelledError:
            if not call.cancelled:
                raise   # not ours (the loop is closing)
        finally:
            self.calls.pop((conn, msg_id), None)
        if call.cancelled:
            # As in Ray, even when the method caught the CancelledError and returned.
            self._reply_error(conn, msg_id, TaskCancelledError(
                f"{call.name} was cancelled with ddlf.cancel()"), where)
            return
        self._reply(conn, msg_id, result, where, nret)

    async def _run_async_task(self, conn, msg_id, fn, args, kwargs, where, nret, call, enter):
        call.claim()   # started: from now on a cancel is answered here
        context.set_current_call(call)
        call.state = CallState.RUNNING
        try:
            enter()
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError:
            if not call.cancelled:
                raise
        except BaseException as e:
            if not call.cancelled:
                self._reply_error(conn, msg_id, e, where)
                return
        finally:
            self.calls.pop((conn, msg_id), None)
        if call.cancelled:
            self._reply_error(conn, msg_id, TaskCancelledError(
                f"task {call.name} was cancelled with ddlf.cancel()"), where)
            return
        self._reply(conn, msg_id, result, where, nret)

    def _task_call(self, conn, msg_id, segs):
        fn_name = "task"
        try:
            spec = TaskSpec.from_wire(loads(segs[1:]))
            fn_id, fn_name, job_id = spec.fn_id, spec.fn_name, spec.job_id
            nret, limit, group = spec.num_returns, spec.backpressure, spec.placement
            fn = self.loaded.get(fn_id)
            if fn is None:
                code = self.functions.get(fn_id)
                if code is None:
                    raise RuntimeError(f"task code {fn_id.hex()} was never shipped to this worker")
                fn = self.loaded[fn_id] = loads(code)
            args, kwargs = resolve_args(spec.args, spec.kwargs, self.objects)
        except BaseException as e:
            self._reply_error(conn, msg_id, e, f"task {fn_name} (pid {_pid})")
            return
        where = f"task {fn_name} (pid {_pid})"

        def enter():
            # Whose output follows: the node's log tailer prefixes lines by this marker.
            context.current.job_id = job_id
            context.current.placement = group
            _log_marker(f"task:{fn_name}:{job_id or ''}")

        if isinstance(nret, str):
            out = self._open_stream(conn, msg_id, limit)
            self._exec().submit(
                self._stream_job(conn, msg_id, fn, args, kwargs, where, out, enter))
            return

        if inspect.iscoroutinefunction(fn):
            call = self._new_call(conn, msg_id, fn_name, fn, True)
            call.atask = self.background.spawn(self._run_async_task(
                conn, msg_id, fn, args, kwargs, where, nret, call, enter))
            return
        call = self._new_call(conn, msg_id, fn_name, fn, False)

        def run(*a, **kw):
            enter()
            context.set_running_task(True)
            try:
                return fn(*a, **kw)
            finally:
                context.set_running_task(False)

        self._exec().submit(self._run_job(conn, msg_id, run, args, kwargs, where, nret, call))


# -- interrupting a running task (ddlf.cancel) ----------------------------------------------
# Held while a cancel decides to interrupt a thread and while that thread marks its call
# done, so an interrupt never reaches the next call that thread runs.
_interrupt_lock = threading.Lock()
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)


def _init_failed(e: BaseException, where: str) -> dict:
    return ActorStarted(False, [bytes(s) for s in encode_error(e, where)]).to_wire()


def _interrupt(call: context.CallContext) -> None:
    """Raise KeyboardInterrupt in the thread running ``call``, as Ray does for a task.

    It lands at the thread's next Python instruction: a thread blocked in a C call
    (``time.sleep``, a socket read) sees it when that call returns.
    """
    with _interrupt_lock:
        if call.state == CallState.RUNNING and not call.interrupted:
            call.interrupted = True
            _set_async_exc(call.thread, KeyboardInterrupt)


def _settle(call: context.CallContext) -> None:
    """On the call's own thread: mark it done, and withdraw an interrupt not yet raised.

    Lock-free unless cancelled: cancel() sets ``.cancelled`` before it reads ``.state``,
    so if we read ``.cancelled`` False after writing DONE, it will read DONE.
    """
    call.state = CallState.DONE
    if call.cancelled:
        with _interrupt_lock:   # waits out a cancel() that is sending the interrupt now
            if call.interrupted:
                _clear_async_exc(call.thread, None)


# The same C function, typed to pass NULL (clear) where py_object would pass None.
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


def _exit_now(status: int) -> None:
    """ddlf.cancel(force=True) of a running task: end this worker, as Ray does."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status)


def _log_marker(text: str) -> None:
    """Tell the node's log tailer whose output follows (Ray does the same with magic lines)."""
    line = f"\x00ddlf:{text}\n"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            stream.write(line)
            stream.flush()
        except Exception:
            pass


def _redirect_output(log_prefix: str | None) -> None:
    """Send fds 1 and 2 to per-worker files that the node daemon tails and forwards."""
    if not log_prefix:
        return
    for fd, suffix in ((1, ".out"), (2, ".err")):
        f = os.open(log_prefix + suffix, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(f, fd)
        os.close(f)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except Exception:
            pass


def _watch_node(node_pid: int) -> None:
    """Exit as soon as the node daemon is gone.

    The control connection's close would tell the event loop too, but an ``async``
    method may hold the loop: this thread cannot be blocked that way. It must also cost
    next to nothing, since a node may hold hundreds of idle actors: the kernel kills us
    when our parent (the node's forkserver, which exits with the node) dies
    (``PR_SET_PDEATHSIG``, Linux), a ``getppid`` check every half second covers the
    race before that was set and other systems, and the node's own pid is checked
    every few seconds in case the forkserver outlives it. ``is_running`` compares
    start times, so a reused pid does not fool it.
    """
    parent = os.getppid()
    _die_with_parent()
    try:
        node = psutil.Process(node_pid)
    except psutil.Error:
        os._exit(1)
    ticks = 0
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)
        ticks += 1
        if ticks % 10 == 0 and (not node.is_running() or node.status() == psutil.STATUS_ZOMBIE):
            os._exit(1)


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass  # the getppid poll still catches it


def worker_main(node_host: str, node_port: int, token: str, node_id: str, worker_id: str,
                head_address: str, listen_host: str, log_prefix: str | None, env: dict,
                node_pid: int) -> None:
    """Entry point of a worker process (started by the node daemon's forkserver)."""
    threading.Thread(target=_watch_node, args=(node_pid,), name="ddlf-lifeline", daemon=True).start()
    os.environ.update(env)
    _redirect_output(log_prefix)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the driver's terminal is the driver's
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    worker = Worker(loop, node_id, worker_id, head_address, token)

    async def start():
        # Callers are tracked once, when they authenticate, not on every call.
        worker.server = await serve(listen_host, 0, token, worker, on_open=worker.callers.add)
        port = worker.server.sockets[0].getsockname()[1]
        context.current.address = f"{listen_host}:{port}"   # named by out-of-band refs
        worker.node_conn = await connect(node_host, node_port, token,
                                         rpc.RpcHandler(worker, worker.rpc_handlers()))
        await rpc.call(worker.node_conn, "worker_ready", worker_id, _pid_now(), port)

    try:
        loop.run_until_complete(start())
    except Exception as e:
        print(f"ddlf worker {worker_id} failed to start: {e!r}", file=sys.stderr)
        os._exit(1)
    loop.run_forever()


def _pid_now() -> int:
    global _pid
    _pid = os.getpid()
    return _pid
