"""The worker process: becomes one actor, or runs tasks from a pool.

A node daemon starts workers ahead of need (through a forkserver that has already
imported this module, numpy and cloudpickle), so creating an actor only costs handing
its class to an idle worker. Callers connect to the worker directly; the data path
never relays through the node or the head.

Execution model:

* Sync methods run inline on the event loop thread, in the order frames arrive on
  each connection, so calls from one caller run in submission order. With
  ``max_concurrency > 1`` they run on a thread pool of that size instead.
* ``async def`` methods run as tasks on the loop, at most ``max_concurrency`` at once.
* Objects (``OBJ`` frames) and task code (``FUNC`` frames) arrive once per connection
  and are cached until the owner frees them or the connection closes.

A worker exits as soon as its connection to the node daemon closes, so a node that
dies (even by SIGKILL) leaves no orphaned workers behind.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import psutil

from . import context, protocol, rpc
from .connection import connect, serve
from .errors import SerializationError
from .eventloop import new_event_loop
from .refs import ArgRef
from .serialization import dumps, loads

__all__ = ["worker_main", "apply_sys_path"]

_pid = os.getpid()


def apply_sys_path(paths, cwd: str | None = None) -> None:
    """Put the caller's ``sys.path`` entries in front of ours, skipping ones absent here.

    This mirrors Ray: classes and functions defined in the driver's own modules (test
    files, scripts in the current folder) unpickle on workers of the same host.
    """
    new = []
    for p in paths:
        if p == "" and cwd:
            p = cwd
        if p and p not in sys.path and p not in new and os.path.isdir(p):
            new.append(p)
    if new:
        sys.path[:0] = new


class ObjectCache:
    """Objects shipped by callers, keyed by 16-byte id, deserialized on first use."""

    def __init__(self):
        self._raw: dict[bytes, list] = {}
        self._values: dict[bytes, object] = {}

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


def _resolve(args, kwargs, cache: ObjectCache):
    if any(type(a) is ArgRef for a in args):
        args = tuple(cache.get(a.obj_id) if type(a) is ArgRef else a for a in args)
    if kwargs and any(type(v) is ArgRef for v in kwargs.values()):
        kwargs = {k: cache.get(v.obj_id) if type(v) is ArgRef else v for k, v in kwargs.items()}
    return args, kwargs


def _error_segments(exc: BaseException, where: str) -> list:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        return dumps((exc, type(exc).__name__, tb, where))
    except Exception:  # the exception itself cannot be pickled: keep its text
        return dumps((None, type(exc).__name__, tb, where))


class Worker:
    """State of one worker process; also the RPC target for its node daemon."""

    def __init__(self, loop, node_id: str, worker_id: str, head_address: str, token: str):
        self.loop = loop
        self.node_id = node_id
        self.worker_id = worker_id
        self.token = token
        self.objects = ObjectCache()
        self.functions: dict[bytes, list] = {}   # function id -> segments, then loaded fn
        self.loaded: dict[bytes, object] = {}
        self.instance = None
        self.actor_name = ""
        self.methods: dict[str, tuple] = {}
        self.semaphore: asyncio.Semaphore | None = None
        self.threads: ThreadPoolExecutor | None = None
        self.node_conn = None
        self.server = None
        context.current = context.WorkerContext(head_address, token, node_id, worker_id)

    # -- control plane (from the node daemon) ------------------------------------------------
    def rpc_start_actor(self, conn, spec: dict):
        """Become the actor described by ``spec``; return ``None`` or raise its init error."""
        apply_sys_path(spec.get("sys_path", ()), spec.get("cwd"))
        ctx = context.current
        ctx.actor_id = spec["actor_id"]
        ctx.job_id = spec.get("job_id")
        self.actor_name = spec["class_name"]
        _log_marker(f"actor:{self.actor_name}:{ctx.job_id or ''}")
        for obj_id, segs in spec.get("objects", {}).items():
            self.objects.add(obj_id, segs)
        try:
            cls = loads(spec["class_segments"])
            args, kwargs = loads(spec["args_segments"])
            args, kwargs = _resolve(args, kwargs, self.objects)
        except BaseException as e:
            where = f"loading {self.actor_name} (pid {_pid})"
            return {"ok": False, "error": [bytes(s) for s in _error_segments(e, where)]}
        max_conc = int(spec.get("max_concurrency") or 1)
        self.semaphore = asyncio.Semaphore(max_conc)
        if max_conc > 1:
            self.threads = ThreadPoolExecutor(max_conc, thread_name_prefix="ddlf-actor")
        try:
            self.instance = cls(*args, **kwargs)
        except BaseException as e:
            return {"ok": False, "error": [bytes(s) for s in _error_segments(e, f"{self.actor_name}.__init__ (pid {_pid})")]}
        return {"ok": True}

    def rpc_ping(self, conn):
        return _pid

    def on_push(self, conn, event, data):
        pass

    def on_closed(self, conn, exc):
        # The node daemon is gone (or shut us down): never outlive it.
        os._exit(0)

    # -- data plane (from callers) -------------------------------------------------------------
    def frame_received(self, conn, segs):
        kind, msg_id = protocol.parse_header(segs[0])
        if kind == protocol.CALL:
            if self.instance is not None:
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
        else:
            conn.abort()

    def connection_closed(self, conn, exc):
        for obj_id in conn.info.get("objects", ()):
            self.objects.drop(obj_id)

    def _reply(self, conn, msg_id, value):
        if conn.closed:
            return
        try:
            segs = dumps(value)
        except SerializationError as e:
            conn.send_msg(protocol.RESULT_ERR, msg_id, _error_segments(e, self.actor_name or "task"))
            return
        conn.send_msg(protocol.RESULT_OK, msg_id, segs)

    def _reply_error(self, conn, msg_id, exc, where):
        if not conn.closed:
            conn.send_msg(protocol.RESULT_ERR, msg_id, _error_segments(exc, where))

    def _actor_call(self, conn, msg_id, segs):
        try:
            name, args, kwargs = loads(segs[1:])
            args, kwargs = _resolve(args, kwargs, self.objects)
            entry = self.methods.get(name)
            if entry is None:
                fn = getattr(self.instance, name)
                entry = self.methods[name] = (fn, inspect.iscoroutinefunction(fn))
            fn, is_async = entry
        except BaseException as e:
            self._reply_error(conn, msg_id, e, f"{self.actor_name} (pid {_pid})")
            return
        if is_async:
            self.loop.create_task(self._run_async(conn, msg_id, fn, args, kwargs, name))
        elif self.threads is not None:
            fut = self.loop.run_in_executor(self.threads, lambda: fn(*args, **kwargs))
            fut.add_done_callback(lambda f: self._finish_future(conn, msg_id, f, name))
        else:
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                self._reply_error(conn, msg_id, e, f"{self.actor_name}.{name} (pid {_pid})")
                return
            self._reply(conn, msg_id, result)

    async def _run_async(self, conn, msg_id, fn, args, kwargs, name):
        async with self.semaphore:
            try:
                result = await fn(*args, **kwargs)
            except BaseException as e:
                self._reply_error(conn, msg_id, e, f"{self.actor_name}.{name} (pid {_pid})")
                return
        self._reply(conn, msg_id, result)

    async def _finish_async_task(self, conn, msg_id, awaitable, fn_name):
        try:
            result = await awaitable
        except BaseException as e:
            self._reply_error(conn, msg_id, e, f"task {fn_name} (pid {_pid})")
            return
        self._reply(conn, msg_id, result)

    def _finish_future(self, conn, msg_id, fut, name):
        exc = fut.exception()
        if exc is not None:
            self._reply_error(conn, msg_id, exc, f"{self.actor_name}.{name} (pid {_pid})")
        else:
            self._reply(conn, msg_id, fut.result())

    def _task_call(self, conn, msg_id, segs):
        fn_name = "task"
        try:
            fn_id, fn_name, job_id, args, kwargs = loads(segs[1:])
            fn = self.loaded.get(fn_id)
            if fn is None:
                code = self.functions.get(fn_id)
                if code is None:
                    raise RuntimeError(f"task code {fn_id.hex()} was never shipped to this worker")
                fn = self.loaded[fn_id] = loads(code)
            args, kwargs = _resolve(args, kwargs, self.objects)
            context.current.job_id = job_id
            _log_marker(f"task:{fn_name}:{job_id or ''}")
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                self.loop.create_task(self._finish_async_task(conn, msg_id, result, fn_name))
                return
        except BaseException as e:
            self._reply_error(conn, msg_id, e, f"task {fn_name} (pid {_pid})")
            return
        self._reply(conn, msg_id, result)


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

    The control connection's close would tell the event loop too, but user code may
    hold the loop for minutes (a sync method training a model): this thread cannot be
    blocked that way. ``is_running`` also compares start times, so a reused pid does
    not fool it.
    """
    try:
        node = psutil.Process(node_pid)
    except psutil.Error:
        os._exit(1)
    while True:
        time.sleep(0.25)
        if not node.is_running() or node.status() == psutil.STATUS_ZOMBIE:
            os._exit(1)


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
        worker.server = await serve(listen_host, 0, token, worker)
        port = worker.server.sockets[0].getsockname()[1]
        worker.node_conn = await connect(node_host, node_port, token, rpc.RpcHandler(worker))
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
