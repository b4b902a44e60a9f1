"""The client core: what a driver (or a worker that calls other actors) runs.

One I/O thread runs an event loop that owns every connection: to the head, to each
actor, and to leased task workers. User threads never touch a socket: they serialize
arguments, append the call to a queue and wake the loop once per burst, so a burst of
``.remote()`` calls leaves in a single ``writev``. Results are kept as raw frame
segments and deserialized in the thread that calls ``get``.

Ownership: every ``ObjectRef`` is owned by the core that made it. Its value lives
here; when it is passed as an argument it is shipped once per connection (an ``OBJ``
frame) and the callee caches it until the last local ref is dropped (a ``FREE``
frame). A top-level argument ref is replaced by its value; a ref nested in an
argument stays a ref, and the callee adopts a copy of its object into its own core
(so ``ddlf.get`` works there). A value that contains refs (a ``put`` of a list of refs,
a result that returns refs) keeps their entries alive in ``Entry.contained`` (runtime/object_store.py).
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

from . import config, context, oob, placement, process, protocol, rpc, runtime_env, shm_store
from .address import split_address
from .connection import connect
from .dependencies import (
    await_deps,
    deps_objects,
    deps_state,
    ship_deps,
    split_refs,
    with_nested,
)
from .errors import (
    ActorDiedError,
    ActorPlacementGroupRemovedError,
    DDLFError,
    PlacementGroupRemovedError,
    TaskCancelledError,
    UnschedulableError,
    WorkerCrashedError,
)
from .eventloop import LoopThread
from .generators import DYNAMIC, STREAMING
from .object_ref import ObjectRef
from .object_store import (
    ERR,
    LOCAL_ERR,
    OK,
    PENDING,
    Entry,
    ObjectStore,
    bundle_refs,
    dumps_with_refs,
    unbundle_refs,
)
from .remote_error import decode_error
from .serialization import dumps, loads
from .streams import Streams
from .taskgroup import TaskGroup

# The object store's names are re-exported: callers imported them from here before the
# store had a module of its own.
__all__ = ["Core", "get_core", "set_core", "ActorSpec", "dumps_with_refs", "bundle_refs",
           "unbundle_refs", "check_backpressure", "PENDING", "OK", "ERR", "LOCAL_ERR"]

log = logging.getLogger("ddlf.core")

class ActorSpec:
    """What the driver knows about an actor class (shipped once per class)."""

    def __init__(self, class_name: str, class_segments: list, methods: dict):
        self.class_name = class_name
        self.class_segments = class_segments
        self.methods = methods


class Core:
    def __init__(self, head_address: str, token: str, *, is_driver: bool = True,
                 job_id: str | None = None, cluster=None):
        self.head_address = head_address
        self.token = token
        self.is_driver = is_driver
        self.cluster = cluster          # the embedded cluster we started, if any
        self.io = LoopThread()
        self.loop = self.io.loop
        self.background = TaskGroup(self.loop, "core")
        self._q: collections.deque = collections.deque()
        self._wake_pending = False
        self.store = ObjectStore(self, self.submit_io, self._lend_cpu, self._take_cpu_back)
        self.objects = self.store.objects
        # Bound once: every ObjectRef made or dropped calls these, so no per-call hop.
        self.incref = self.store.incref
        self.decref = self.store.decref
        self.streams = Streams(self.store, self.submit_io)   # generator calls still running
        self.msg_ids = itertools.count(1)   # CALL frame ids, unique over all connections
        self.actors: dict[str, _ActorClient] = {}
        self.pools: dict[tuple, _TaskPool] = {}
        self.head = None
        self.job_id = job_id
        self.node_totals: list[dict] = []
        self.closed = False
        self.closing = False
        self.hello = {"sys_path": list(sys.path), "cwd": os.getcwd()}
        self.runtime_env: dict | None = None   # the job's, set by init (wire form)
        self.hello["shm"] = shm_store.local_info()   # same host: objects go through shared memory

    # -- connection to the head ------------------------------------------------------------
    def connect(self, timeout: float = 30.0) -> None:
        self.io.run(self._connect(timeout), timeout + 5)

    async def _connect(self, timeout):
        host, port = split_address(self.head_address)
        self.head = await connect(host, port, self.token, rpc.RpcHandler(self), timeout=timeout)
        info = await rpc.call(self.head, "hello_driver", {
            **process.versions(), "is_driver": self.is_driver, "job_id": self.job_id, "pid": os.getpid(),
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
    def submit_io(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the I/O thread, after what was submitted before it."""
        self._q.append((fn, args))
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                raise DDLFError("DDLF has been shut down; call ddlf.init() again") from None
            except BaseException:
                # ddlf.cancel's KeyboardInterrupt landed here, in a task's thread: a flag
                # left set with no drain scheduled would stall every later submission.
                self._wake_pending = False
                raise

    def _drain(self) -> None:
        self._wake_pending = False
        q = self._q
        while q:
            fn, args = q.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("internal error in the DDLF I/O thread")

    # -- objects (see object_store.py) -------------------------------------------------------
    def new_ref(self, origin=None) -> ObjectRef:
        return self.store.new_ref(origin)

    def put(self, value) -> ObjectRef:
        self._check_open()
        return self.store.put(value)

    def adopt(self, obj_id: bytes, state: int, segments) -> ObjectRef:
        """A ref of this core for an object another process shipped with a value."""
        return self.store.adopt(obj_id, state, segments)

    def get(self, refs, timeout: float | None = None):
        return self.store.get(refs, timeout)

    def wait(self, refs, num_returns: int, timeout: float | None):
        return self.store.wait(refs, num_returns, timeout)

    async def await_ref(self, ref):
        return await self.store.await_ref(ref)

    def concurrent_future(self, ref):
        return self.store.concurrent_future(ref)

    def _lend_cpu(self) -> bool:
        """In a task about to wait: let the head lend its resources to other work.

        Without this, a task that waits for tasks it submitted holds its CPU while they
        queue for one: with 2 CPUs, ``top -> 2 x mid -> leaf`` deadlocks. The head lends
        at most a bounded number per node (``config.MAX_LENT_TASKS_PER_NODE``).
        """
        if not context.running_task() or self.head is None or context.current is None:
            return False
        self.submit_io(self._push_head, "task_blocked", {"worker_id": context.current.worker_id})
        return True

    def _take_cpu_back(self) -> None:
        # As in Ray, the task resumes at once; its node may run over its CPU count until
        # the work started meanwhile finishes.
        self.submit_io(self._push_head, "task_unblocked",
                     {"worker_id": context.current.worker_id})

    def _push_head(self, event, data) -> None:
        if self.head is not None and not self.head.closed:
            rpc.push(self.head, event, data)

    # -- actors ----------------------------------------------------------------------------
    def create_actor(self, actor_id: str, spec: ActorSpec, args, kwargs, options: dict) -> None:
        self._check_open()
        demand = _demand(options, default_cpus=0.0)
        sched = options.get("scheduling")
        if sched and sched.get("group_id"):
            # Its demand comes out of a bundle, which must be able to hold it.
            placement.check_bundle_fit(demand, sched["bundles"], sched.get("bundle_index", -1),
                                       f"actor {spec.class_name}")
        elif self.node_totals and not any(_fits(demand, t) for t in self.node_totals):
            raise UnschedulableError(
                f"actor {spec.class_name} asks for {demand}, more than any node has "
                f"(nodes: {self.node_totals}). Lower its num_cpus/resources, or add a node.")
        env = runtime_env.for_call(self, options.get("runtime_env"))
        args, kwargs, refs = split_refs(args, kwargs)
        args_segments, nested = dumps_with_refs((args, kwargs))
        args_segments = [bytes(s) for s in args_segments]
        refs = with_nested(refs, nested)
        wire = {
            "actor_id": actor_id, "class_name": spec.class_name,
            "class_segments": spec.class_segments, "args_segments": args_segments,
            "resources": demand, "max_restarts": options.get("max_restarts", 0),
            "max_concurrency": options.get("max_concurrency", 1), "name": options.get("name"),
            "max_task_retries": options.get("max_task_retries", 0),
            "detached": options.get("lifetime") == "detached", "node_id": options.get("node_id"),
            "scheduling": sched,
            "methods": spec.methods, "sys_path": self.hello["sys_path"], "cwd": self.hello["cwd"],
            "job_id": self.job_id, "runtime_env": env,
        }
        if wire["name"]:
            # As in Ray, a name belongs to the actor once .remote() returns: reserve it
            # now, so a duplicate fails here and get_actor(name) works right away.
            self.head_call("reserve_name", wire["name"], actor_id, spec.class_name, spec.methods)
        client = _ActorClient(self, actor_id, spec.class_name)
        self.actors[actor_id] = client
        self.submit_io(client.create, wire, refs)

    def submit_actor_call(self, actor_id: str, class_name: str, method: str, args, kwargs,
                          num_returns: int | str = 1, backpressure: int = -1):
        """Submit a method call; its ref, a list of ``num_returns`` refs, or for a
        generator method an ``ObjectRefGenerator`` (``"streaming"``) or the ref of a
        ``DynamicObjectRefGenerator`` (``"dynamic"``)."""
        self._check_open()
        what = f"{class_name}.{method}"
        nret = _check_num_returns(num_returns, what)
        backpressure = check_backpressure(backpressure, what) if nret == STREAMING else -1
        args, kwargs, refs = split_refs(args, kwargs)
        body = (method, args, kwargs) if nret == 1 else (method, args, kwargs, nret, backpressure)
        payload, nested = dumps_with_refs(body)
        refs = with_nested(refs, nested)
        ref = self.new_ref(actor_id)
        out = self._returns(ref, nret, backpressure)
        self.submit_io(self._route_call, actor_id, class_name, ref.id, payload, refs)
        return out

    def _returns(self, ref: ObjectRef, nret, backpressure: int):
        """What ``.remote()`` gives back for a call whose reply settles ``ref``."""
        if nret == 1:
            return ref
        if type(nret) is int:
            return self.store.split_returns(ref, nret)
        return self.streams.open(ref, nret, backpressure)

    def _route_call(self, actor_id, class_name, obj_id, payload, refs):
        client = self.actors.get(actor_id)
        if client is None:
            client = self.actors[actor_id] = _ActorClient(self, actor_id, class_name)
            client.resolve(0)
        client.enqueue(_Call(obj_id, payload, refs))

    def kill_actor(self, actor_id: str, no_restart: bool = True) -> None:
        self.head_call("kill_actor", actor_id, no_restart)
        if no_restart:
            # The head kills the process asynchronously; without this, a call made right
            # after kill() could still reach the old process over our open connection.
            # Looked up on the I/O thread, after calls submitted before kill() have been
            # routed (which may create the client).
            self.submit_io(self._killed_here, actor_id)

    def _killed_here(self, actor_id: str) -> None:
        client = self.actors.get(actor_id)
        if client is not None:
            client.killed()

    # -- cancel ----------------------------------------------------------------------------
    def cancel(self, ref, force: bool = False, recursive: bool = True) -> None:
        """Cancel the task or actor call that computes ``ref`` (see ``ddlf.cancel``).

        Returns at once; the outcome shows at ``get``. A finished call, a ``put`` object
        and a ref received from another process (a copy of a value) are left alone.
        """
        self._check_open()
        e = self.store.entry(ref)
        origin = e.origin
        if type(origin) is bytes:   # one of num_returns refs: cancel the call itself
            parent = self.objects.get(origin)
            origin = parent.origin if parent is not None else None
        if type(origin) is str and force:
            raise ValueError(
                "ddlf.cancel(force=True) is not supported for actor calls: killing the worker "
                "would kill the actor. Cancel without force, or end the actor with "
                "ddlf.kill(actor)")
        if origin is None or e.state != PENDING:
            return
        self.submit_io(self.cancel_ids, [ref.id], force, recursive)

    def cancel_ids(self, ids, force: bool, recursive: bool) -> None:
        """On the I/O thread: cancel the calls computing these objects, where still pending."""
        for obj_id in ids:
            e = self.objects.get(obj_id)
            if e is None or e.state != PENDING:
                continue
            origin = e.origin
            if type(origin) is bytes:
                obj_id, parent = origin, self.objects.get(origin)
                origin = parent.origin if parent is not None else None
            if type(origin) is str:
                client = self.actors.get(origin)
                if client is not None:
                    client.cancel(obj_id, recursive)
            elif type(origin) is tuple:
                pool = self.pools.get(origin)
                if pool is not None:
                    pool.cancel(obj_id, force, recursive)

    def cancel_and_flush(self, ids, force: bool, recursive: bool, timeout: float = 2.0) -> None:
        """From a user thread: cancel now and return once the cancel frames are written
        (a worker about to exit uses this for the calls its task submitted)."""
        async def run():
            self.cancel_ids(ids, force, recursive)
            for _ in range(2):   # connections flush on the next loop passes
                await asyncio.sleep(0)

        try:
            self.io.run(run(), timeout)
        except Exception as e:
            log.debug("could not cancel child calls: %s", e)

    # -- tasks -----------------------------------------------------------------------------
    def submit_task(self, fn_id: bytes, fn_segments: list, fn_name: str, args, kwargs,
                    options: dict) -> ObjectRef:
        self._check_open()
        demand = _demand(options, default_cpus=1.0)
        sched = options.get("scheduling")
        group = None
        if sched and sched.get("group_id"):
            placement.check_bundle_fit(demand, sched["bundles"], sched.get("bundle_index", -1),
                                       f"task {fn_name}")
            # What the worker needs for get_current_placement_group() and for capturing.
            group = {"group_id": sched["group_id"], "bundles": sched["bundles"],
                     "capture": bool(sched.get("capture"))}
        # A demand no node can meet is not refused here: as in Ray, .remote() returns a
        # ref; the head's UnschedulableError reaches the caller at get (at once).
        nret = _check_num_returns(options.get("num_returns", 1), fn_name)
        env = runtime_env.for_call(self, options.get("runtime_env"))
        # Only a streaming call has a reader to pace the generator by.
        backpressure = check_backpressure(
            options.get("_generator_backpressure_num_objects", -1), fn_name
        ) if nret == STREAMING else -1
        args, kwargs, refs = split_refs(args, kwargs)
        body = (fn_id, fn_name, self.job_id, args, kwargs)
        if group is not None:
            body = (*body, nret, backpressure, group)
        elif nret != 1:
            body = (*body, nret, backpressure)
        payload, nested = dumps_with_refs(body)
        refs = with_nested(refs, nested)
        # Tasks of one shape, placement and runtime env share leased workers; no others do.
        key = (tuple(sorted(demand.items())), _sched_key(sched), env["key"] if env else "")
        ref = self.new_ref(key)
        out = self._returns(ref, nret, backpressure)
        task = _Task(ref.id, fn_id, fn_segments, fn_name, payload, refs,
                     int(options.get("max_retries", 3)))
        retry_exc = options.get("retry_exceptions")
        if retry_exc:
            task.retry_exc = True if retry_exc is True else tuple(retry_exc)
        self.submit_io(self._route_task, key, demand, task, sched, env)
        return out

    def _route_task(self, key, demand, task, sched=None, env=None):
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = _TaskPool(self, demand, sched, env)
        pool.add(task)

    # -- refs settled by the I/O loop ------------------------------------------------------
    def ref_from_async(self, make_coro) -> ObjectRef:
        """A ref settled by the coroutine ``make_coro()`` run on the I/O loop: its return
        value, or the exception it raises (e.g. a placement group's ``ready()``)."""
        self._check_open()
        ref = self.new_ref()
        obj_id = ref.id

        async def run():
            try:
                value = await make_coro()
            except BaseException as e:
                self.store.fail(obj_id, e)
                return
            try:
                self.store.complete(obj_id, OK, dumps(value))
            except BaseException as e:
                self.store.fail(obj_id, e)

        self.submit_io(lambda: self.background.spawn(run()))
        return ref

    # -- shutdown --------------------------------------------------------------------------
    def stop_cluster(self, timeout: float = 15.0) -> None:
        """Ask the head to stop every node (so every worker) and then itself.

        Best effort, for the embedded cluster at shutdown: whoever started the processes
        stops them anyway afterwards. The head connection then closes on purpose, so its
        closing is not reported as lost.
        """
        self.closing = True
        try:
            self.head_call("shutdown", timeout=timeout)
        except Exception as e:
            log.debug("asking the head to shut down failed: %s", e)

    def close(self) -> None:
        """Close every connection and stop the I/O thread; safe after a failed connect()."""
        if self.closed:
            return
        self.closing = True
        try:
            self.io.run(self._close(), 15)
        except Exception as e:
            log.debug("error while closing: %s", e)
        self.closed = True
        self.store.close()
        self.io.stop()
        shm_store.release_all()

    async def _close(self):
        for pool in self.pools.values():
            pool.close()
        for client in self.actors.values():
            client.close()
        if self.head is not None and not self.head.closed:
            self.head.close()
        oob.close_driver_server(self)
        self.background.close()
        await asyncio.sleep(0)


def _check_num_returns(n, what: str) -> int | str:
    if n == 1:
        return 1
    if n == STREAMING or n == DYNAMIC:
        return n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{what}: num_returns must be an int >= 1, 'streaming' or 'dynamic', "
                         f"got {n!r}")
    return n


def check_backpressure(n, what: str) -> int:
    """``_generator_backpressure_num_objects``: -1 (off, Ray's default) or an int >= 1."""
    if n is None or n == -1:
        return -1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"{what}: _generator_backpressure_num_objects must be an int >= 1 (how many "
            f"yielded values may wait unconsumed before the generator pauses) or -1 for no "
            f"limit; got {n!r} (0 is not allowed: the generator could never yield)")
    return n


def _demand(options: dict, default_cpus: float) -> dict:
    demand = {"CPU": float(options["num_cpus"]) if options.get("num_cpus") is not None else default_cpus}
    if options.get("num_gpus"):
        demand["GPU"] = float(options["num_gpus"])
    if options.get("memory"):
        demand["memory"] = float(options["memory"])
    for k, v in (options.get("resources") or {}).items():
        demand[k] = float(v)
    return {k: v for k, v in demand.items() if v > 0}


def _sched_key(sched: dict | None) -> tuple:
    """What separates task pools besides the demand: where their leases may come from."""
    if not sched:
        return ()
    return tuple(sorted((k, v) for k, v in sched.items() if k not in ("bundles", "capture")))


def _fits(demand: dict, total: dict) -> bool:
    return all(total.get(k, 0.0) + 1e-9 >= v for k, v in demand.items())


class _Call:
    __slots__ = ("obj_id", "payload", "refs", "retries")

    def __init__(self, obj_id, payload, refs):
        self.obj_id = obj_id
        self.payload = payload
        self.refs = refs
        self.retries = None   # set from the actor's max_task_retries when first sent


class _ActorClient:
    """The caller's side of one actor: resolution, connection, ordered queue, in-flight calls."""

    def __init__(self, core: Core, actor_id: str, class_name: str):
        self.core = core
        self.actor_id = actor_id
        self.class_name = class_name
        self.state = "resolving"   # resolving | ready | dead
        self.conn = None
        self.queue: collections.deque = collections.deque()
        # msg id -> object id, or the _Call itself when the actor retries calls
        # (max_task_retries): only then is the payload kept until the reply.
        self.inflight: dict[int, object] = {}
        self.max_task_retries = 0
        self.epoch = 0
        self.dead_error: BaseException | None = None
        self.blocked = False
        self.cancelled: set = set()   # object ids of in-flight calls asked to cancel

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self, wire: dict, refs) -> None:
        self.core.background.spawn(self._create(wire, refs))

    async def _create(self, wire, refs):
        try:
            if refs:
                await await_deps(self.core.store, self.core.loop, refs)
                _, failed = deps_state(self.core.store, refs)
                if failed is not None:
                    self._die_with(self._dep_error(failed))
                    self._release_name(wire)
                    return
                wire["objects"] = deps_objects(self.core.store, refs, {})
            view = await rpc.call(self.core.head, "create_actor", wire)
        except Exception as e:
            self._die_with(e if isinstance(e, DDLFError) else DDLFError(f"creating {self.class_name} failed: {e}"))
            self._release_name(wire)
            return
        if self.state == "dead" and view.get("state") != "DEAD":
            # ddlf.kill() ran while the arguments were pending: the head did not know
            # the actor yet, so the kill must follow the creation.
            try:
                await rpc.call(self.core.head, "kill_actor", self.actor_id, True)
            except Exception as e:
                log.debug("could not kill actor %s created after its kill: %s", self.actor_id, e)
            return
        await self._apply(view)

    def _release_name(self, wire: dict) -> None:
        """Give back a name reserved at .remote() for an actor that was never created."""
        if wire.get("name") and self.core.head is not None and not self.core.head.closed:
            rpc.push(self.core.head, "release_name", {"actor_id": self.actor_id})

    def _dep_error(self, e: Entry) -> BaseException:
        return self.core.store.error_of(e)

    def resolve(self, after_epoch: int) -> None:
        self.state = "resolving"
        self.core.background.spawn(self._resolve(after_epoch))

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
        self.max_task_retries = view.get("max_task_retries") or 0
        host, port = split_address(view["address"])
        for attempt in range(config.ACTOR_CONNECT_TRIES):
            try:
                conn = await connect(host, port, self.core.token, self)
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
        if self.state == "dead":   # ddlf.kill() ran while we connected: stay dead
            conn.close()
            return
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
        if err.get("pg_removed"):
            return ActorPlacementGroupRemovedError(
                f"actor {self.class_name} ({self.actor_id}) is dead: {reason}", cause)
        return ActorDiedError(f"actor {self.class_name} ({self.actor_id}) is dead: {reason}", cause)

    def _die_with(self, exc: BaseException) -> None:
        self.state = "dead"
        self.dead_error = exc
        while self.queue:
            self.core.store.fail(self.queue.popleft().obj_id, exc)

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
            self.core.store.fail(call.obj_id, self.dead_error)
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
                pending, failed = deps_state(core.store, call.refs)
                if pending is not None:
                    # Head-of-line wait keeps calls from one caller in submission order.
                    self.blocked = True
                    if not core.store.on_done(pending, self._unblock):
                        self.blocked = False
                        continue
                    return
                if failed is not None:
                    queue.popleft()
                    core.store.copy_outcome(call.obj_id, failed)
                    continue
                ship_deps(core.store, conn, call.refs)
            queue.popleft()
            msg_id = next(core.msg_ids)
            if self.max_task_retries:
                if call.retries is None:
                    call.retries = self.max_task_retries
                inflight[msg_id] = call
            else:
                inflight[msg_id] = call.obj_id
            conn.send_msg(protocol.CALL, msg_id, call.payload)

    def _unblock(self):
        self.blocked = False
        self.pump()

    def cancel(self, obj_id: bytes, recursive: bool) -> None:
        """Drop a queued call, or ask the actor to cancel one it has (queued or running)."""
        for i, call in enumerate(self.queue):
            if call.obj_id == obj_id:
                del self.queue[i]
                self.core.store.fail_cancelled(obj_id, f"a call to actor {self.class_name}")
                if i == 0 and self.blocked:
                    # It held the queue waiting for its arguments: let the next one go.
                    self.blocked = False
                    if self.state == "ready":
                        self.pump()
                return
        for msg_id, call in self.inflight.items():
            if (call.obj_id if isinstance(call, _Call) else call) == obj_id:
                if isinstance(call, _Call):
                    call.retries = 0   # as in Ray, a cancelled call is never retried
                self.cancelled.add(obj_id)
                if self.conn is not None and not self.conn.closed:
                    flags = protocol.CANCEL_RECURSIVE if recursive else 0
                    self.conn.send_msg(protocol.CANCEL, msg_id, [bytes((flags,))])
                return

    def frame_received(self, conn, segs):
        kind, msg_id = protocol.parse_header(segs[0])
        if kind == protocol.PUSH:
            event, data = loads(segs[1:])
            if event != "exiting":
                shm_store.client_frame(conn, kind, segs)   # the worker's hello
                return
            if conn is self.conn:
                # The actor called sys.exit/exit_actor: its replies so far still arrive
                # here, but later calls wait for the head's next view of the actor
                # (restarted or dead), resolved when this connection closes.
                self.state = "resolving"
                if data.get("status") and data.get("msg_id") in self.inflight:
                    # A crash (non-zero exit) in a call the actor may retry: retry it
                    # on the restarted actor instead of taking the exit's error reply.
                    call = self.inflight[data["msg_id"]]
                    if isinstance(call, _Call) and call.retries != 0:
                        del self.inflight[data["msg_id"]]
                        self._retry([call])
            return
        if kind == protocol.STREAM_ITEM or kind == protocol.STREAM_END:
            entry = (self.inflight.get if kind == protocol.STREAM_ITEM else self.inflight.pop)(
                msg_id, None)
            if entry is not None:
                self.core.streams.frame(conn, kind, msg_id, entry.obj_id if isinstance(
                    entry, _Call) else entry, segs)
            return
        if kind >= protocol.RESULT_SHM:
            kind, segs = shm_store.client_frame(conn, kind, segs)
            if kind is None:
                return
        entry = self.inflight.pop(msg_id, None)
        if entry is None:
            return
        obj_id = entry.obj_id if isinstance(entry, _Call) else entry
        if self.cancelled:
            self.cancelled.discard(obj_id)
        self.core.store.complete_result(obj_id, kind, segs)

    def _retry(self, calls) -> None:
        """Queue calls lost with the actor's process again, ahead of newer ones."""
        for call in calls:
            if call.retries > 0:
                call.retries -= 1
        self.queue.extendleft(reversed(calls))

    def connection_closed(self, conn, exc):
        if conn is not self.conn:
            return
        self.conn = None
        inflight, self.inflight = self.inflight, {}
        if self.core.closed:
            return
        retry = [c for c in inflight.values() if isinstance(c, _Call) and c.retries != 0]
        # Chosen before _retry counts the attempt down: max_task_retries=1 retries once.
        lost = [c for c in inflight.values() if not (isinstance(c, _Call) and c.retries != 0)]
        if retry:
            self._retry(retry)
        if lost:
            why = str(exc) if isinstance(exc, ActorDiedError) else (
                "its connection closed (the process exited or was killed)")
            err = ActorDiedError(
                f"actor {self.class_name} ({self.actor_id}) died while running this call: {why}")
            cancelled, self.cancelled = self.cancelled, set()
            for c in lost:
                obj_id = c.obj_id if isinstance(c, _Call) else c
                if obj_id in cancelled:
                    self.core.store.fail(obj_id, TaskCancelledError(
                        f"a call to actor {self.class_name} ({self.actor_id}) was cancelled "
                        f"with ddlf.cancel(), and the actor's process then went away: {why}"))
                else:
                    self.core.store.fail(obj_id, err)
        if self.state != "dead":
            self.resolve(self.epoch)


class _Task:
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


class _Lease:
    __slots__ = ("lease_id", "worker_id", "node_id", "conn", "inflight", "idle_timer",
                 "force_cancel")

    def __init__(self, lease_id, worker_id, node_id, conn):
        self.lease_id = lease_id
        self.worker_id = worker_id
        self.node_id = node_id
        self.conn = conn
        self.inflight: dict[int, _Task] = {}
        self.idle_timer = None
        self.force_cancel = None   # the task cancelled with force=True: its worker may exit


class _TaskPool:
    """Tasks of one resource shape: a queue, and the worker leases that run them."""

    def __init__(self, core: Core, demand: dict, sched: dict | None = None,
                 runtime_env: dict | None = None):
        self.core = core
        self.demand = demand
        self.sched = sched
        self.runtime_env = runtime_env
        self.queue: collections.deque = collections.deque()
        self.leases: list[_Lease] = []
        self.requesting = False
        self.retry_after = 0.0
        self.parked: dict[bytes, _Task] = {}   # waiting for their arguments

    def add(self, task: _Task) -> None:
        if task.refs:
            pending, failed = deps_state(self.core.store, task.refs)
            if failed is not None:
                self.core.store.copy_outcome(task.obj_id, failed)
                return
            if pending is not None:
                # Tasks have no ordering promise: park this one until its inputs exist.
                self.parked[task.obj_id] = task
                if self.core.store.on_done(pending, lambda: self._unpark(task)):
                    return
                return self._unpark(task)
        self.queue.append(task)
        self.pump()

    def _unpark(self, task: _Task) -> None:
        if self.parked.pop(task.obj_id, None) is task:   # not cancelled meanwhile
            self.add(task)

    def cancel(self, obj_id: bytes, force: bool, recursive: bool) -> None:
        """Drop a task not yet sent, or ask its worker to cancel it (queued or running)."""
        task = self.parked.pop(obj_id, None)
        if task is not None:
            self.core.store.fail_cancelled(obj_id, f"task {task.fn_name}")
            return
        for i, task in enumerate(self.queue):
            if task.obj_id == obj_id:
                del self.queue[i]
                self.core.store.fail_cancelled(obj_id, f"task {task.fn_name}")
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
            ship_deps(self.core.store, conn, task.refs)
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
            host, port = split_address(reply["address"])
            lease = _Lease(reply["lease_id"], reply["worker_id"], reply.get("node_id"), None)
            handler = _LeaseHandler(self, lease)
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
                self.core.store.fail(self.queue.popleft().obj_id, e)
        except Exception as e:
            # With leases in hand, treat a failed request like "nothing free" so that
            # pump() pipelines instead of asking again at once.
            self.retry_after = time.monotonic() + 0.05
            if not self.leases:
                err = e if isinstance(e, DDLFError) else DDLFError(f"could not lease a worker: {e}")
                while self.queue:
                    self.core.store.fail(self.queue.popleft().obj_id, err)
        finally:
            self.requesting = False
        self.pump()
        if (lease is not None and lease in self.leases and not lease.inflight
                and lease.idle_timer is None):
            # It came after the queue drained: without a timer it would hold its CPU
            # (at the head) until this process disconnects.
            lease.idle_timer = self.core.loop.call_later(config.LEASE_IDLE_S, self._return, lease)

    def task_done(self, lease: _Lease) -> None:
        if self.queue:
            self.pump()
        elif not lease.inflight and lease.idle_timer is None:
            lease.idle_timer = self.core.loop.call_later(config.LEASE_IDLE_S, self._return, lease)

    def _return(self, lease: _Lease) -> None:
        lease.idle_timer = None
        if lease.inflight or lease not in self.leases:
            return
        self.leases.remove(lease)
        lease.conn.close()
        self.core.background.spawn(self._return_remote(lease.lease_id))

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
            if task.cancelled:
                how = ("ddlf.cancel(force=True) ended its worker process"
                       if lease.force_cancel is task else
                       "it was cancelled with ddlf.cancel(), then its worker process exited")
                self.core.store.fail(task.obj_id, TaskCancelledError(f"task {task.fn_name}: {how}"))
            elif lease.force_cancel is not None:
                # Queued behind a task that ddlf.cancel(force=True) killed: not their fault.
                retry.append(task)
            elif task.retries != 0:   # -1: unlimited, as in Ray
                if task.retries > 0:
                    task.retries -= 1
                retry.append(task)
            else:
                self.core.store.fail(task.obj_id, WorkerCrashedError(
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
        if kind == protocol.STREAM_ITEM or kind == protocol.STREAM_END:
            inflight = self.lease.inflight
            task = (inflight.get if kind == protocol.STREAM_ITEM else inflight.pop)(msg_id, None)
            if task is not None:
                self.pool.core.streams.frame(conn, kind, msg_id, task.obj_id, segs)
                if kind == protocol.STREAM_END:
                    self.pool.task_done(self.lease)
            return
        if kind == protocol.PUSH or kind >= protocol.RESULT_SHM:
            kind, segs = shm_store.client_frame(conn, kind, segs)
            if kind is None:
                return
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
        self.pool.core.store.complete_result(task.obj_id, kind, segs)
        self.pool.task_done(self.lease)

    def connection_closed(self, conn, exc):
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
    ctx = context.current
    if ctx is None:
        return None
    with _core_lock:
        if _core is None:
            core = Core(ctx.head_address, ctx.token, is_driver=False, job_id=ctx.job_id)
            core.connect()
            set_core(core)
    return _core
