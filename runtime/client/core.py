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
a result that returns refs) keeps their entries alive in ``Entry.contained``.

Core is the façade the API layer uses; the work is done by parts it wires together and
hands to each other, as in Ray's core worker (none calls another's private methods):

* ``object_store.ObjectStore``: the objects, their refcounts, waiters and callbacks;
* ``dependencies``: a call's argument refs, shipped once per connection;
* ``actor_submitter.ActorClient``: calls to one actor, in order;
* ``task_submitter.TaskPool``: tasks of one kind, on leased workers;
* ``streams.Streams``: the items of generator calls.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from .. import context, placement, process, runtime_env, shm_store
from ..errors import ActorDiedError, DDLFError, HeadUnreachableError, UnschedulableError
from ..scheduling import Scheduling
from ..wire import rpc
from ..wire.address import split_address
from ..wire.callspec import CallSpec, TaskSpec
from ..wire.connection import connect
from ..wire.eventloop import LoopThread
from ..wire.messages import ActorCreation, ActorLost, LogBatch
from ..wire.serialization import dumps
from ..wire.taskgroup import TaskGroup
from . import oob
from .actor_submitter import ActorCall, ActorClient, ActorCreations
from .dependencies import split_refs, with_nested
from .generators import DYNAMIC, STREAMING
from .object_ref import ObjectRef
from .object_store import (
    OK,
    PENDING,
    ObjectStore,
    dumps_with_refs,
)
from .streams import Streams
from .task_submitter import Task, TaskPool

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["Core", "ActorSpec", "check_backpressure", "join_worker_cluster", "ref_from_async"]

log = logging.getLogger("ddlf.core")


class ActorSpec:
    """What the driver knows about an actor class (shipped once per class)."""

    def __init__(self, class_name: str, class_segments: list, methods: dict):
        self.class_name = class_name
        self.class_segments = class_segments
        self.methods = methods



def _unreachable(address: str, error: OSError, timeout: float) -> HeadUnreachableError:
    """The error for a head that does not answer at ``address``, naming why and the fix."""
    import socket

    host, port = split_address(address)
    if isinstance(error, ConnectionRefusedError):
        why = "the connection was refused (nothing listens on that port)"
    elif isinstance(error, socket.gaierror):
        why = f"the host name {host!r} cannot be resolved"
    elif isinstance(error, TimeoutError):
        why = f"it did not answer within {timeout:g} s"
    else:
        why = error.strerror or str(error) or type(error).__name__
    loopback = host in ("127.0.0.1", "localhost", "::1")
    start = (f"ddlf-node start --head --port {port}" if loopback else
             f"ddlf-node start --head --host {host} --port {port}")
    where = "" if loopback else f" (on {host})"
    return HeadUnreachableError(
        f"could not reach a DDLF head at {address}: {why}. Start one there with "
        f"`{start}`{where}, or give the address a running head printed (with no address, "
        "DDLF starts a local cluster instead).", address)


def _print_log_batch(core: Core, batch: LogBatch) -> None:
    """Print worker output the head forwarded, each line prefixed with whose it is."""
    # Like Ray: name the node only when there is more than one to tell apart.
    where = ""
    if len(core.node_totals) > 1:
        host = batch.host or ""
        where = f", ip={host}" if host not in ("127.0.0.1", "localhost") else ""
        where += f", node={(batch.node_id or '')[:6]}"
    for _job, name, pid, stream, line in batch.records:
        out = sys.stderr if stream == "err" else sys.stdout
        try:
            print(f"({name} pid={pid}{where}) {line}", file=out, flush=True)
        except Exception as e:
            # The driver's own stdout/stderr is closed or broken (a closed pipe): a
            # worker's line cannot be shown, and failing here would stop the head link.
            log.debug("printing a worker's output line: %r", e)


class Core:
    """One process's client of a DDLF cluster: ``connect``, then submit and get."""

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
        self.actors: dict[str, ActorClient] = {}
        self.creations = ActorCreations(self)   # actors on their way to the head
        self.pools: dict[tuple, TaskPool] = {}
        self.head: Connection | None = None
        self.job_id = job_id
        self.node_totals: list[dict] = []
        self.closed = False
        self.closing = False
        self.hello: dict[str, Any] = {"sys_path": list(sys.path), "cwd": os.getcwd()}
        self.runtime_env: dict | None = None   # the job's, set by init (wire form)
        self.hello["shm"] = shm_store.local_info()   # same host: objects go through shared memory

    # -- connection to the head ------------------------------------------------------------
    def connect(self, timeout: float = 30.0) -> None:
        # A new head whose own node is still starting holds the hello up to another timeout.
        self.io.run(self._connect(timeout), 2 * timeout + 5)

    async def _connect(self, timeout):
        host, port = split_address(self.head_address)
        try:
            self.head = await connect(host, port, self.token, rpc.RpcHandler(self),
                                      timeout=timeout)
        except OSError as e:   # refused, unknown host, unreachable, timed out
            raise _unreachable(self.head_address, e, timeout) from e
        info = await rpc.call(self.head, "hello_driver", {
            **process.versions(), "is_driver": self.is_driver, "job_id": self.job_id,
            "pid": os.getpid(), "await_node_s": timeout}, timeout=2 * timeout)
        self.job_id = info["job_id"]
        self.node_totals = info["node_totals"]

    def head_call(self, method: str, *args, timeout: float | None = 60.0):
        """Call the head from a user thread and return its reply."""
        self._check_open()
        if self.head is None:   # connect() (which ddlf.init calls) has not run
            raise DDLFError(f"cannot call the head ({method}): call connect() first")
        return self.io.run(rpc.call(self.head, method, *args), timeout)

    def on_push(self, conn: Connection, event, data):
        # A malformed push raises MessageError, which the RPC handler logs and drops.
        if event == "logs":
            if self.is_driver:
                self._print_logs(LogBatch.from_wire(data))
        elif event == "actor_started":
            self.creations.started(data)
        elif event == "nodes_changed":
            self.node_totals = data
        elif event == "actor_lost":
            lost = ActorLost.from_wire(data)
            client = self.actors.get(lost.actor_id)
            if client is not None and client.conn is not None and client.epoch <= lost.epoch:
                client.conn.abort(ActorDiedError(lost.why))
        elif event == "node_dead":
            for pool in self.pools.values():
                for lease in list(pool.leases):
                    if lease.node_id == data["node_id"] and lease.conn is not None:
                        lease.conn.abort()

    def on_closed(self, conn: Connection, exc):
        # Only a head link that was up: one refused during connect() is reported as the
        # error connect() raises, not also as a lost connection.
        if conn is self.head and not (self.closed or self.closing):
            log.warning("lost the connection to the DDLF head at %s", self.head_address)
        self.creations.head_lost()

    _print_logs = _print_log_batch   # a method (a tool may replace it on an instance)

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
        if (ctx := context.current) is not None:   # None outside a worker: nothing was lent
            self.submit_io(self._push_head, "task_unblocked", {"worker_id": ctx.worker_id})

    def _push_head(self, event, data) -> None:
        if self.head is not None and not self.head.closed:
            rpc.push(self.head, event, data)

    def push_head(self, event: str, data) -> None:
        """Send the head a one-way message from any thread (nothing waits for a reply)."""
        self.submit_io(self._push_head, event, data)

    # -- actors ----------------------------------------------------------------------------
    def create_actor(self, actor_id: str, spec: ActorSpec, args, kwargs, options: dict) -> None:
        self._check_open()
        demand = _demand(options, default_cpus=0.0)
        sched: Scheduling | None = options.get("scheduling")
        if sched is not None and sched.in_group:
            # Its demand comes out of a bundle, which must be able to hold it.
            placement.check_bundle_fit(demand, list(sched.bundles), sched.bundle_index,
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
        creation = ActorCreation(
            actor_id=actor_id, class_name=spec.class_name,
            class_segments=spec.class_segments, args_segments=args_segments,
            resources=demand, max_restarts=options.get("max_restarts", 0),
            max_concurrency=options.get("max_concurrency", 1), name=options.get("name"),
            max_task_retries=options.get("max_task_retries", 0),
            detached=options.get("lifetime") == "detached", node_id=options.get("node_id"),
            scheduling=sched,
            methods=spec.methods, sys_path=self.hello["sys_path"], cwd=self.hello["cwd"],
            job_id=self.job_id, runtime_env=env,
        )
        if creation.name:
            # As in Ray, a name belongs to the actor once .remote() returns: reserve it
            # now, so a duplicate fails here and get_actor(name) works right away.
            self.head_call("reserve_name", creation.name, actor_id, spec.class_name,
                           spec.methods)
        client = ActorClient(self, actor_id, spec.class_name)
        self.actors[actor_id] = client
        self.submit_io(client.create, creation, refs)

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
        payload, nested = dumps_with_refs(
            CallSpec(method, args, kwargs, nret, backpressure).to_wire())
        refs = with_nested(refs, nested)
        ref = self.store.new_ref(actor_id)
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
            client = self.actors[actor_id] = ActorClient(self, actor_id, class_name)
            client.resolve(0)
        client.enqueue(ActorCall(obj_id, payload, refs))

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
        sched: Scheduling | None = options.get("scheduling")
        group = None
        if sched is not None and sched.in_group:
            placement.check_bundle_fit(demand, list(sched.bundles), sched.bundle_index,
                                       f"task {fn_name}")
            # What the worker needs for get_current_placement_group() and for capturing.
            group = sched.group_context()
        # A demand no node can meet is not refused here: as in Ray, .remote() returns a
        # ref; the head's UnschedulableError reaches the caller at get (at once).
        nret = _check_num_returns(options.get("num_returns", 1), fn_name)
        env = runtime_env.for_call(self, options.get("runtime_env"))
        # Only a streaming call has a reader to pace the generator by.
        backpressure = check_backpressure(
            options.get("_generator_backpressure_num_objects", -1), fn_name
        ) if nret == STREAMING else -1
        args, kwargs, refs = split_refs(args, kwargs)
        payload, nested = dumps_with_refs(
            TaskSpec(fn_id, fn_name, self.job_id, args, kwargs, nret, backpressure,
                     group).to_wire())
        refs = with_nested(refs, nested)
        # Tasks of one shape, placement and runtime env share leased workers; no others do.
        key = (tuple(sorted(demand.items())), sched.pool_key() if sched is not None else (),
               env["key"] if env else "")
        ref = self.store.new_ref(key)
        out = self._returns(ref, nret, backpressure)
        task = Task(ref.id, fn_id, fn_segments, fn_name, payload, refs,
                    int(options.get("max_retries", 3)))
        retry_exc = options.get("retry_exceptions")
        if retry_exc:
            task.retry_exc = True if retry_exc is True else tuple(retry_exc)
        self.submit_io(self._route_task, key, demand, task, sched, env)
        return out

    def _route_task(self, key, demand, task, sched=None, env=None):
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = TaskPool(self, demand, sched, env)
        pool.add(task)

    # -- refs pickled out of band (see oob.py) --------------------------------------------
    def pinned_objects_address(self) -> str | None:
        """Where this driver serves the objects it pinned by pickling refs out of band (its
        fetch server, started on first use), or None if it cannot serve them."""
        return oob.owner_address(self)

    def fetch_pinned(self, obj_id: bytes, owner: str) -> ObjectRef:
        """A pending ref for ``obj_id``, completed from the process at ``owner``."""
        ref = self.adopt(obj_id, PENDING, None)
        self.submit_io(oob.start_fetch, self, obj_id, owner)
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


def _fits(demand: dict, total: dict) -> bool:
    return all(total.get(k, 0.0) + 1e-9 >= v for k, v in demand.items())


def ref_from_async(core: Core, make_coro) -> ObjectRef:
    """A ref of ``core`` settled by the coroutine ``make_coro()`` run on its I/O loop: its
    return value, or the exception it raises (e.g. a placement group's ``ready()``)."""
    core._check_open()
    ref = core.new_ref()
    obj_id = ref.id

    async def run():
        try:
            value = await make_coro()
        except BaseException as e:
            core.store.fail(obj_id, e)
            return
        try:
            core.store.complete(obj_id, OK, dumps(value))
        except BaseException as e:
            core.store.fail(obj_id, e)

    core.submit_io(lambda: core.background.spawn(run()))
    return ref


# -- joining a worker's cluster --------------------------------------------------------------
def join_worker_cluster() -> Core | None:
    """A connected core for code running in this worker (what ``current.get_core`` calls on
    first use inside a worker); None when no worker context is set (it is read now, not
    when the worker installed this, so clearing ``context.current`` turns joining off)."""
    ctx = context.current
    if ctx is None:
        return None
    core = Core(ctx.head_address, ctx.token, is_driver=False, job_id=ctx.job_id)
    core.connect()
    return core
