"""The client core: what a driver (or a worker that calls other actors) runs.

One I/O thread runs an event loop that owns every connection: to the head, to each
actor, and to leased task workers. User threads never touch a socket: they serialize
arguments, append the call to a queue and wake the loop once per burst, so a burst of
``.remote()`` calls leaves in a single ``writev``. Results are kept as raw frame
segments and deserialized in the thread that calls ``get``.

Ownership: every ``ObjectRef`` is owned by the core that made it. Its value lives
here; when it is passed as a top-level argument it is shipped once per connection
(an ``OBJ`` frame) and the callee caches it until the last local ref is dropped (a
``FREE`` frame).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import sys
import threading
import time

from . import __version__, protocol, rpc, shm_store
from .connection import connect
from .errors import (
    ActorDiedError,
    DDLFError,
    GetTimeoutError,
    UnschedulableError,
    WorkerCrashedError,
)
from .eventloop import LoopThread
from .object_ref import ForeignObjectRef, ObjectRef
from .refs import ArgRef
from .remote_error import decode_error
from .serialization import dumps, loads, snapshot

__all__ = ["Core", "get_core", "set_core", "ActorSpec"]

log = logging.getLogger("ddlf.core")

PENDING, OK, ERR, LOCAL_ERR = 0, 1, 2, 3
_TASK_DEPTH = 16          # tasks pipelined to one leased worker
_LEASE_IDLE_S = 0.5       # an idle lease is returned after this long
_RECONNECT_TRIES = 5


class _Entry:
    __slots__ = ("state", "segments", "value", "has_value", "refs", "sent_to", "callbacks")

    def __init__(self):
        self.state = PENDING
        self.segments = None
        self.value = None
        self.has_value = False
        self.refs = 0
        self.sent_to = None
        self.callbacks = None


class ActorSpec:
    """What the driver knows about an actor class (shipped once per class)."""

    def __init__(self, class_name: str, class_segments: list, methods: dict, options: dict):
        self.class_name = class_name
        self.class_segments = class_segments
        self.methods = methods
        self.options = options


def _split_refs(args, kwargs):
    """Replace top-level ObjectRefs by ArgRef placeholders; return (args, kwargs, refs)."""
    refs = None
    if any(type(a) is ObjectRef for a in args):
        refs = [a for a in args if type(a) is ObjectRef]
        args = tuple(ArgRef(a.id) if type(a) is ObjectRef else a for a in args)
    if kwargs and any(type(v) is ObjectRef for v in kwargs.values()):
        refs = (refs or []) + [v for v in kwargs.values() if type(v) is ObjectRef]
        kwargs = {k: ArgRef(v.id) if type(v) is ObjectRef else v for k, v in kwargs.items()}
    return args, kwargs, refs


class Core:
    def __init__(self, head_address: str, token: str, *, is_driver: bool = True,
                 job_id: str | None = None, cluster=None):
        self.head_address = head_address
        self.token = token
        self.is_driver = is_driver
        self.cluster = cluster          # the embedded cluster we started, if any
        self.io = LoopThread()
        self.loop = self.io.loop
        self.objects: dict[bytes, _Entry] = {}
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0
        self._cb_lock = threading.Lock()
        self._q: collections.deque = collections.deque()
        self._wake_pending = False
        self._prefix = os.urandom(8)
        self._counter = itertools.count(1)
        self._msg_ids = itertools.count(1)
        self.actors: dict[str, _ActorClient] = {}
        self.pools: dict[tuple, _TaskPool] = {}
        self.head = None
        self.job_id = job_id
        self.node_totals: list[dict] = []
        self.closed = False
        self.closing = False
        self.hello = {"sys_path": list(sys.path), "cwd": os.getcwd()}
        self.hello["shm"] = shm_store.local_info()   # same host: objects go through shared memory

    # -- connection to the head ------------------------------------------------------------
    def connect(self, timeout: float = 30.0) -> None:
        self.io.run(self._connect(timeout), timeout + 5)

    async def _connect(self, timeout):
        host, port = self.head_address.rsplit(":", 1)
        self.head = await connect(host, int(port), self.token, rpc.RpcHandler(self), timeout=timeout)
        info = await rpc.call(self.head, "hello_driver", {
            "version": __version__, "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "is_driver": self.is_driver, "job_id": self.job_id, "pid": os.getpid(),
        }, timeout=timeout)
        self.job_id = info["job_id"]
        self.node_totals = info["node_totals"]

    def head_call(self, method: str, *args, timeout: float | None = 60.0):
        """Call the head from a user thread and return its reply."""
        self._check_open()
        return self.io.run(rpc.call(self.head, method, *args), timeout)

    def on_push(self, conn, event, data):
        if event == "logs":
            self._print_logs(data)
        elif event == "nodes_changed":
            self.node_totals = data
        elif event == "actor_lost":
            client = self.actors.get(data["actor_id"])
            if client is not None and client.conn is not None and client.epoch <= data["epoch"]:
                client.conn.abort(ActorDiedError(data["why"]))
        elif event == "node_dead":
            for pool in self.pools.values():
                for lease in list(pool.leases):
                    if lease.node_id == data["node_id"] and lease.conn is not None:
                        lease.conn.abort()

    def on_closed(self, conn, exc):
        if not (self.closed or self.closing):
            log.warning("lost the connection to the DDLF head at %s", self.head_address)

    def _print_logs(self, data):
        if not self.is_driver:
            return
        # Like Ray: name the node only when there is more than one to tell apart.
        where = ""
        if len(self.node_totals) > 1:
            host = data.get("host", "")
            where = f", ip={host}" if host not in ("127.0.0.1", "localhost") else ""
            where += f", node={(data.get('node_id') or '')[:6]}"
        for _job, name, pid, stream, line in data["records"]:
            out = sys.stderr if stream == "err" else sys.stdout
            try:
                print(f"({name} pid={pid}{where}) {line}", file=out, flush=True)
            except Exception:
                pass

    def _check_open(self):
        if self.closed:
            raise DDLFError("DDLF has been shut down; call ddlf.init() again")

    # -- cross-thread queue ----------------------------------------------------------------
    def _submit(self, fn, *args) -> None:
        self._q.append((fn, args))
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                raise DDLFError("DDLF has been shut down; call ddlf.init() again") from None

    def _drain(self) -> None:
        self._wake_pending = False
        q = self._q
        while q:
            fn, args = q.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("internal error in the DDLF I/O thread")

    # -- object registry -------------------------------------------------------------------
    def new_ref(self) -> ObjectRef:
        obj_id = self._prefix + next(self._counter).to_bytes(8, "big")
        self.objects[obj_id] = _Entry()
        return ObjectRef(obj_id, self)

    def incref(self, obj_id: bytes) -> None:
        e = self.objects.get(obj_id)
        if e is not None:
            e.refs += 1

    def decref(self, obj_id: bytes) -> None:
        e = self.objects.get(obj_id)
        if e is None:
            return
        e.refs -= 1
        if e.refs <= 0:
            self.objects.pop(obj_id, None)
            if e.sent_to and not self.closed:
                self._submit(self._send_free, obj_id, e.sent_to)

    def _send_free(self, obj_id: bytes, conns) -> None:
        for conn in conns:
            if not conn.closed:
                conn.send_msg(protocol.FREE, 0, [obj_id])

    def put(self, value) -> ObjectRef:
        self._check_open()
        if isinstance(value, ObjectRef):
            raise TypeError("ddlf.put() of an ObjectRef is not allowed: pass the ref itself")
        # put() snapshots the value, as Ray's does: later changes to the caller's array
        # must not leak into what workers receive. Large buffers are copied into shared
        # memory instead (that copy is the snapshot), unless it is off or full.
        segs = dumps(value)
        segs = shm_store.store(segs) or snapshot(segs)
        ref = self.new_ref()
        e = self.objects[ref.id]
        e.segments = segs
        e.state = OK
        return ref

    def _complete(self, obj_id: bytes, state: int, segments=None, value=None) -> None:
        e = self.objects.get(obj_id)
        if e is None:
            return  # the caller dropped every ref to it
        e.segments = segments
        if state == LOCAL_ERR:
            e.value = value
        with self._cb_lock:
            e.state = state
            callbacks, e.callbacks = e.callbacks, None
        if callbacks:
            for cb in callbacks:
                try:
                    cb()
                except Exception:
                    log.exception("error in an ObjectRef callback")
        if self.waiters:
            with self.cond:
                self.cond.notify_all()

    def _fail(self, obj_id: bytes, exc: BaseException) -> None:
        self._complete(obj_id, LOCAL_ERR, value=exc)

    def _copy_outcome(self, obj_id: bytes, src: _Entry) -> None:
        self._complete(obj_id, src.state, src.segments, src.value)

    def _on_done(self, entry: _Entry, cb) -> bool:
        """Register ``cb`` (run on the I/O thread). Return False if already done."""
        with self._cb_lock:
            if entry.state != PENDING:
                return False
            if entry.callbacks is None:
                entry.callbacks = []
            entry.callbacks.append(cb)
            return True

    def _entry(self, ref) -> _Entry:
        if type(ref) is ForeignObjectRef:
            raise DDLFError(
                f"ObjectRef {ref.id.hex()} is owned by another process. DDLF resolves ObjectRefs "
                "only when they are top-level arguments of a remote call: pass it as f.remote(ref) "
                "instead of inside a list or dict.")
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"expected an ObjectRef, got {type(ref).__name__}: {ref!r}")
        if ref._core is not self:
            raise DDLFError(f"{ref!r} belongs to an earlier ddlf session that was shut down")
        e = self.objects.get(ref.id)
        if e is None:
            raise DDLFError(f"{ref!r} is unknown to this process")
        return e

    def _value(self, e: _Entry):
        state = e.state
        if state == OK:
            if not e.has_value:
                e.value = loads(e.segments)
                e.has_value = True
            return e.value
        if state == ERR:
            raise decode_error(e.segments)
        raise e.value

    # -- get / wait / await ----------------------------------------------------------------
    def get(self, refs, timeout: float | None = None):
        entries = [self._entry(r) for r in refs]
        if any(e.state == PENDING for e in entries):
            self._wait_until(lambda: all(e.state != PENDING for e in entries), timeout,
                             lambda: sum(e.state == PENDING for e in entries), len(entries))
        return [self._value(e) for e in entries]

    def wait(self, refs, num_returns: int, timeout: float | None):
        entries = [self._entry(r) for r in refs]

        def enough():
            return sum(e.state != PENDING for e in entries) >= num_returns

        if not enough():
            try:
                self._wait_until(enough, timeout, None, 0)
            except GetTimeoutError:
                pass
        ready, not_ready = [], []
        for r, e in zip(refs, entries):
            (ready if e.state != PENDING and len(ready) < num_returns else not_ready).append(r)
        return ready, not_ready

    def _wait_until(self, predicate, timeout, pending_count, total) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            self.waiters += 1
            try:
                while not predicate():
                    if self.closed:
                        raise DDLFError("DDLF was shut down while waiting for results")
                    if deadline is None:
                        self.cond.wait(1.0)
                    else:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            n = pending_count() if pending_count else 0
                            raise GetTimeoutError(
                                f"ddlf.get timed out after {timeout} s with {n} of {total} "
                                "objects still pending")
                        self.cond.wait(min(left, 1.0))
            finally:
                self.waiters -= 1

    async def await_ref(self, ref):
        e = self._entry(ref)
        if e.state == PENDING:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()

            def wake():
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

            if self._on_done(e, wake):
                await fut
        return self._value(e)

    def concurrent_future(self, ref):
        import concurrent.futures

        f = concurrent.futures.Future()
        e = self._entry(ref)

        def settle():
            try:
                f.set_result(self._value(e))
            except BaseException as exc:
                f.set_exception(exc)

        if not self._on_done(e, settle):
            settle()
        return f

    # -- actors ----------------------------------------------------------------------------
    def create_actor(self, actor_id: str, spec: ActorSpec, args, kwargs, options: dict) -> None:
        self._check_open()
        demand = _demand(options, default_cpus=0.0)
        if self.node_totals and not any(_fits(demand, t) for t in self.node_totals):
            raise UnschedulableError(
                f"actor {spec.class_name} asks for {demand}, more than any node has "
                f"(nodes: {self.node_totals}). Lower its num_cpus/resources, or add a node.")
        args, kwargs, refs = _split_refs(args, kwargs)
        args_segments = [bytes(s) for s in dumps((args, kwargs))]
        wire = {
            "actor_id": actor_id, "class_name": spec.class_name,
            "class_segments": spec.class_segments, "args_segments": args_segments,
            "resources": demand, "max_restarts": options.get("max_restarts", 0),
            "max_concurrency": options.get("max_concurrency", 1), "name": options.get("name"),
            "detached": options.get("lifetime") == "detached", "node_id": options.get("node_id"),
            "methods": spec.methods, "sys_path": self.hello["sys_path"], "cwd": self.hello["cwd"],
            "job_id": self.job_id,
        }
        if wire["name"]:
            # As in Ray, a name belongs to the actor once .remote() returns: reserve it
            # now, so a duplicate fails here and get_actor(name) works right away.
            self.head_call("reserve_name", wire["name"], actor_id, spec.class_name, spec.methods)
        client = _ActorClient(self, actor_id, spec.class_name)
        self.actors[actor_id] = client
        self._submit(client.create, wire, refs)

    def submit_actor_call(self, actor_id: str, class_name: str, method: str, args, kwargs) -> ObjectRef:
        self._check_open()
        args, kwargs, refs = _split_refs(args, kwargs)
        payload = dumps((method, args, kwargs))
        ref = self.new_ref()
        self._submit(self._route_call, actor_id, class_name, ref.id, method, payload, refs)
        return ref

    def _route_call(self, actor_id, class_name, obj_id, method, payload, refs):
        client = self.actors.get(actor_id)
        if client is None:
            client = self.actors[actor_id] = _ActorClient(self, actor_id, class_name)
            client.resolve(0)
        client.enqueue(_Call(obj_id, method, payload, refs))

    def kill_actor(self, actor_id: str, no_restart: bool = True) -> None:
        self.head_call("kill_actor", actor_id, no_restart)
        if no_restart:
            # The head kills the process asynchronously; without this, a call made right
            # after kill() could still reach the old process over our open connection.
            # Looked up on the I/O thread, after calls submitted before kill() have been
            # routed (which may create the client).
            self._submit(self._killed_here, actor_id)

    def _killed_here(self, actor_id: str) -> None:
        client = self.actors.get(actor_id)
        if client is not None:
            client.killed()

    # -- tasks -----------------------------------------------------------------------------
    def submit_task(self, fn_id: bytes, fn_segments: list, fn_name: str, args, kwargs,
                    options: dict) -> ObjectRef:
        self._check_open()
        demand = _demand(options, default_cpus=1.0)
        if self.node_totals and not any(_fits(demand, t) for t in self.node_totals):
            raise UnschedulableError(
                f"task {fn_name} asks for {demand}, more than any node has "
                f"(nodes: {self.node_totals}). Lower its num_cpus/resources, or add a node.")
        args, kwargs, refs = _split_refs(args, kwargs)
        payload = dumps((fn_id, fn_name, self.job_id, args, kwargs))
        ref = self.new_ref()
        key = tuple(sorted(demand.items()))
        task = _Task(ref.id, fn_id, fn_segments, fn_name, payload, refs,
                     int(options.get("max_retries", 3)))
        self._submit(self._route_task, key, demand, task)
        return ref

    def _route_task(self, key, demand, task):
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = _TaskPool(self, demand)
        pool.add(task)

    # -- shutdown --------------------------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        self.closing = True
        try:
            self.io.run(self._close(), 15)
        except Exception as e:
            log.debug("error while closing: %s", e)
        self.closed = True
        with self.cond:
            self.cond.notify_all()
        self.io.stop()
        shm_store.release_all()

    async def _close(self):
        for pool in self.pools.values():
            pool.close()
        for client in self.actors.values():
            client.close()
        if self.head is not None and not self.head.closed:
            self.head.close()
        await asyncio.sleep(0)


def _demand(options: dict, default_cpus: float) -> dict:
    demand = {"CPU": float(options["num_cpus"]) if options.get("num_cpus") is not None else default_cpus}
    for k, v in (options.get("resources") or {}).items():
        demand[k] = float(v)
    return {k: v for k, v in demand.items() if v > 0}


def _fits(demand: dict, total: dict) -> bool:
    return all(total.get(k, 0.0) + 1e-9 >= v for k, v in demand.items())


def _ship_deps(core: Core, conn, refs) -> None:
    """Send each dependency's value on ``conn`` unless it was sent there already."""
    for ref in refs:
        e = core.objects.get(ref.id)
        if e is None:
            continue
        if e.sent_to is None:
            e.sent_to = set()
        if conn not in e.sent_to:
            if not shm_store.ship(conn, ref.id, e.segments):
                conn.send_msg(protocol.OBJ, 0, [ref.id, *e.segments])
            e.sent_to.add(conn)


def _deps_state(core: Core, refs):
    """Return (pending_entry, failed_entry) for the first dependency not yet ready/ok."""
    for ref in refs:
        e = core.objects.get(ref.id)
        if e is None:
            continue
        if e.state == PENDING:
            return e, None
        if e.state != OK:
            return None, e
    return None, None


class _Call:
    __slots__ = ("obj_id", "method", "payload", "refs")

    def __init__(self, obj_id, method, payload, refs):
        self.obj_id = obj_id
        self.method = method
        self.payload = payload
        self.refs = refs


class _ActorClient:
    """The caller's side of one actor: resolution, connection, ordered queue, in-flight calls."""

    def __init__(self, core: Core, actor_id: str, class_name: str):
        self.core = core
        self.actor_id = actor_id
        self.class_name = class_name
        self.state = "resolving"   # resolving | ready | dead
        self.conn = None
        self.queue: collections.deque = collections.deque()
        self.inflight: dict[int, bytes] = {}
        self.epoch = 0
        self.dead_error: BaseException | None = None
        self.blocked = False

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self, wire: dict, refs) -> None:
        self.core.loop.create_task(self._create(wire, refs))

    async def _create(self, wire, refs):
        try:
            if refs:
                await self._await_refs(refs)
                objects = {}
                for r in refs:
                    e = self.core.objects[r.id]
                    if e.state != OK:
                        self._die_with(self._dep_error(e))
                        self._release_name(wire)
                        return
                    objects[r.id] = e.segments
                wire["objects"] = objects
            view = await rpc.call(self.core.head, "create_actor", wire)
        except Exception as e:
            self._die_with(e if isinstance(e, DDLFError) else DDLFError(f"creating {self.class_name} failed: {e}"))
            self._release_name(wire)
            return
        await self._apply(view)

    def _release_name(self, wire: dict) -> None:
        """Give back a name reserved at .remote() for an actor that was never created."""
        if wire.get("name") and self.core.head is not None and not self.core.head.closed:
            rpc.push(self.core.head, "release_name", {"actor_id": self.actor_id})

    async def _await_refs(self, refs):
        for r in refs:
            e = self.core.objects.get(r.id)
            if e is not None and e.state == PENDING:
                fut = self.core.loop.create_future()
                if self.core._on_done(e, lambda f=fut: f.done() or f.set_result(None)):
                    await fut

    def _dep_error(self, e: _Entry) -> BaseException:
        try:
            self.core._value(e)
        except BaseException as exc:
            return exc
        return DDLFError("dependency failed")

    def resolve(self, after_epoch: int) -> None:
        self.state = "resolving"
        self.core.loop.create_task(self._resolve(after_epoch))

    async def _resolve(self, after_epoch):
        for _attempt in range(1000):
            try:
                view = await rpc.call(self.core.head, "wait_actor", self.actor_id, after_epoch)
            except Exception as e:
                self._die_with(ActorDiedError(
                    f"actor {self.class_name} ({self.actor_id}) is unreachable: the head did not "
                    f"answer ({e})"))
                return
            if view["state"] == "ALIVE" or view["state"] == "DEAD":
                await self._apply(view)
                return

    async def _apply(self, view: dict) -> None:
        if view["state"] == "DEAD":
            self._die_with(self._death_error(view))
            return
        if view["state"] != "ALIVE":
            self.resolve(self.epoch)
            return
        self.epoch = view["epoch"]
        host, port = view["address"].rsplit(":", 1)
        for attempt in range(_RECONNECT_TRIES):
            try:
                conn = await connect(host, int(port), self.core.token, self)
                break
            except (OSError, asyncio.TimeoutError, DDLFError) as e:
                last = e
                await asyncio.sleep(0.05 * (attempt + 1))
        else:
            log.debug("could not reach actor %s at %s: %s", self.actor_id, view["address"], last)
            self.resolve(self.epoch)
            return
        conn.send_msg(protocol.PUSH, 0, dumps(("hello", self.core.hello)))
        await shm_store.wait_hello(conn)
        if conn.closed:   # it went away while answering our hello
            self.resolve(self.epoch)
            return
        self.conn = conn
        self.state = "ready"
        self.pump()

    def _death_error(self, view: dict) -> BaseException:
        err = view.get("error") or {}
        reason = err.get("reason") or "it died"
        cause = None
        if err.get("creation_error"):
            try:
                cause = decode_error(err["creation_error"])
                reason = f"{reason}:\n{cause}"
            except Exception as e:
                reason = f"{reason} (its error could not be loaded here: {e})"
        if err.get("unschedulable"):
            return UnschedulableError(reason)
        return ActorDiedError(f"actor {self.class_name} ({self.actor_id}) is dead: {reason}", cause)

    def _die_with(self, exc: BaseException) -> None:
        self.state = "dead"
        self.dead_error = exc
        while self.queue:
            self.core._fail(self.queue.popleft().obj_id, exc)

    def killed(self) -> None:
        """ddlf.kill() from this process: fail queued, in-flight and later calls now."""
        err = ActorDiedError(f"actor {self.class_name} ({self.actor_id}) is dead: "
                             "it was killed with ddlf.kill()")
        self._die_with(err)
        if self.conn is not None:
            self.conn.abort(err)

    def close(self):
        if self.conn is not None:
            self.conn.close()

    # -- calls -------------------------------------------------------------------------------
    def enqueue(self, call: _Call) -> None:
        if self.state == "dead":
            self.core._fail(call.obj_id, self.dead_error)
            return
        self.queue.append(call)
        if self.state == "ready" and not self.blocked:
            self.pump()

    def pump(self) -> None:
        core = self.core
        conn = self.conn
        queue = self.queue
        inflight = self.inflight
        while queue and self.state == "ready":
            call = queue[0]
            if call.refs:
                pending, failed = _deps_state(core, call.refs)
                if pending is not None:
                    # Head-of-line wait keeps calls from one caller in submission order.
                    self.blocked = True
                    if not core._on_done(pending, self._unblock):
                        self.blocked = False
                        continue
                    return
                if failed is not None:
                    queue.popleft()
                    core._copy_outcome(call.obj_id, failed)
                    continue
                _ship_deps(core, conn, call.refs)
            queue.popleft()
            msg_id = next(core._msg_ids)
            inflight[msg_id] = call.obj_id
            conn.send_msg(protocol.CALL, msg_id, call.payload)

    def _unblock(self):
        self.blocked = False
        self.pump()

    def frame_received(self, conn, segs):
        kind, msg_id = protocol.parse_header(segs[0])
        if kind == protocol.PUSH or kind >= protocol.RESULT_SHM:
            kind, segs = shm_store.client_frame(conn, kind, segs)
            if kind is None:
                return
        obj_id = self.inflight.pop(msg_id, None)
        if obj_id is None:
            return
        self.core._complete(obj_id, OK if kind == protocol.RESULT_OK else ERR, segs[1:])

    def connection_closed(self, conn, exc):
        if conn is not self.conn:
            return
        self.conn = None
        inflight, self.inflight = self.inflight, {}
        if self.core.closed:
            return
        if inflight:
            why = str(exc) if isinstance(exc, ActorDiedError) else (
                "its connection closed (the process exited or was killed)")
            err = ActorDiedError(
                f"actor {self.class_name} ({self.actor_id}) died while running this call: {why}")
            for obj_id in inflight.values():
                self.core._fail(obj_id, err)
        if self.state != "dead":
            self.resolve(self.epoch)


class _Task:
    __slots__ = ("obj_id", "fn_id", "fn_segments", "fn_name", "payload", "refs", "retries")

    def __init__(self, obj_id, fn_id, fn_segments, fn_name, payload, refs, retries):
        self.obj_id = obj_id
        self.fn_id = fn_id
        self.fn_segments = fn_segments
        self.fn_name = fn_name
        self.payload = payload
        self.refs = refs
        self.retries = retries


class _Lease:
    __slots__ = ("lease_id", "worker_id", "node_id", "conn", "inflight", "idle_timer")

    def __init__(self, lease_id, worker_id, node_id, conn):
        self.lease_id = lease_id
        self.worker_id = worker_id
        self.node_id = node_id
        self.conn = conn
        self.inflight: dict[int, _Task] = {}
        self.idle_timer = None


class _TaskPool:
    """Tasks of one resource shape: a queue, and the worker leases that run them."""

    def __init__(self, core: Core, demand: dict):
        self.core = core
        self.demand = demand
        self.queue: collections.deque = collections.deque()
        self.leases: list[_Lease] = []
        self.requesting = False
        self.retry_after = 0.0

    def add(self, task: _Task) -> None:
        if task.refs:
            pending, failed = _deps_state(self.core, task.refs)
            if failed is not None:
                self.core._copy_outcome(task.obj_id, failed)
                return
            if pending is not None:
                # Tasks have no ordering promise: park this one until its inputs exist.
                if self.core._on_done(pending, lambda: self.add(task)):
                    return
                return self.add(task)
        self.queue.append(task)
        self.pump()

    def pump(self) -> None:
        """Send queued tasks to leases.

        An idle lease takes a task at once. A busy lease takes more (pipelined, up to
        ``_TASK_DEPTH``) only once the head has said that no CPU is free: otherwise a
        fast task could queue behind a slow one while another CPU sits idle.
        """
        queue = self.queue
        while queue:
            best = None
            for lease in self.leases:
                if best is None or len(lease.inflight) < len(best.inflight):
                    best = lease
            if best is None:
                break
            if best.inflight:
                if not self._saturated():
                    self._maybe_request()
                    break
                if len(best.inflight) >= _TASK_DEPTH:
                    break
            self._send(best, queue.popleft())
        if queue and not self.leases:
            self._maybe_request()

    def _saturated(self) -> bool:
        """True while the head's last answer was "no free worker" (re-asked after a pause)."""
        return time.monotonic() < self.retry_after

    def _send(self, lease: _Lease, task: _Task) -> None:
        conn = lease.conn
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
            lease.idle_timer = None
        sent = conn.info.get("funcs")
        if sent is None:
            sent = conn.info["funcs"] = set()
        if task.fn_id not in sent:
            conn.send_msg(protocol.FUNC, 0, [task.fn_id, *task.fn_segments])
            sent.add(task.fn_id)
        if task.refs:
            _ship_deps(self.core, conn, task.refs)
        msg_id = next(self.core._msg_ids)
        lease.inflight[msg_id] = task
        conn.send_msg(protocol.CALL, msg_id, task.payload)

    def _maybe_request(self) -> None:
        if self.requesting or self.core.closed:
            return
        self.requesting = True
        self.core.loop.create_task(self._request(wait=not self.leases))

    async def _request(self, wait: bool):
        try:
            reply = await rpc.call(self.core.head, "lease_worker", self.demand, wait)
            if reply is None:
                self.retry_after = time.monotonic() + 0.05
                return
            host, port = reply["address"].rsplit(":", 1)
            lease = _Lease(reply["lease_id"], reply["worker_id"], reply.get("node_id"), None)
            handler = _LeaseHandler(self, lease)
            try:
                lease.conn = await connect(host, int(port), self.core.token, handler)
            except Exception:
                await rpc.call(self.core.head, "return_lease", lease.lease_id)
                raise
            lease.conn.send_msg(protocol.PUSH, 0, dumps(("hello", self.core.hello)))
            await shm_store.wait_hello(lease.conn)
            if lease.conn.closed:   # the worker went away while answering our hello
                await rpc.call(self.core.head, "return_lease", lease.lease_id)
                raise DDLFError("the leased worker closed its connection")
            self.leases.append(lease)
        except UnschedulableError as e:
            while self.queue:
                self.core._fail(self.queue.popleft().obj_id, e)
        except Exception as e:
            # With leases in hand, treat a failed request like "nothing free" so that
            # pump() pipelines instead of asking again at once.
            self.retry_after = time.monotonic() + 0.05
            if not self.leases:
                err = e if isinstance(e, DDLFError) else DDLFError(f"could not lease a worker: {e}")
                while self.queue:
                    self.core._fail(self.queue.popleft().obj_id, err)
        finally:
            self.requesting = False
        self.pump()

    def task_done(self, lease: _Lease) -> None:
        if self.queue:
            self.pump()
        elif not lease.inflight and lease.idle_timer is None:
            lease.idle_timer = self.core.loop.call_later(_LEASE_IDLE_S, self._return, lease)

    def _return(self, lease: _Lease) -> None:
        lease.idle_timer = None
        if lease.inflight or lease not in self.leases:
            return
        self.leases.remove(lease)
        lease.conn.close()
        self.core.loop.create_task(self._return_remote(lease.lease_id))

    async def _return_remote(self, lease_id):
        try:
            await rpc.call(self.core.head, "return_lease", lease_id)
        except Exception:
            pass

    def lost(self, lease: _Lease) -> None:
        if lease in self.leases:
            self.leases.remove(lease)
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
        inflight, lease.inflight = lease.inflight, {}
        if self.core.closed:
            return
        retry = []
        for task in inflight.values():
            if task.retries > 0:
                task.retries -= 1
                retry.append(task)
            else:
                self.core._fail(task.obj_id, WorkerCrashedError(
                    f"the worker process running task {task.fn_name} died before it finished "
                    "(it exited, was killed, or ran out of memory)"))
        self.queue.extendleft(reversed(retry))
        self.pump()

    def close(self):
        for lease in self.leases:
            if lease.idle_timer is not None:
                lease.idle_timer.cancel()
            if lease.conn is not None:
                lease.conn.close()


class _LeaseHandler:
    __slots__ = ("pool", "lease")

    def __init__(self, pool: _TaskPool, lease: _Lease):
        self.pool = pool
        self.lease = lease

    def frame_received(self, conn, segs):
        kind, msg_id = protocol.parse_header(segs[0])
        if kind == protocol.PUSH or kind >= protocol.RESULT_SHM:
            kind, segs = shm_store.client_frame(conn, kind, segs)
            if kind is None:
                return
        task = self.lease.inflight.pop(msg_id, None)
        if task is None:
            return
        self.pool.core._complete(task.obj_id, OK if kind == protocol.RESULT_OK else ERR, segs[1:])
        self.pool.task_done(self.lease)

    def connection_closed(self, conn, exc):
        self.pool.lost(self.lease)


# -- the process-wide core -----------------------------------------------------------------
_core: Core | None = None
_core_lock = threading.Lock()


def set_core(core: Core | None) -> None:
    global _core
    _core = core


def get_core(auto: bool = True) -> Core | None:
    """The current core; inside a worker, connect one on first use (as Ray workers are)."""
    if _core is not None or not auto:
        return _core
    from . import context

    ctx = context.current
    if ctx is None:
        return None
    with _core_lock:
        if _core is None:
            core = Core(ctx.head_address, ctx.token, is_driver=False, job_id=ctx.job_id)
            core.connect()
            set_core(core)
    return _core
