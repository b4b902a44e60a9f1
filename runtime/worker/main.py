"""A worker process's entry point and its lifeline to the node daemon that started it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import sys
import threading
import time

import psutil

from .. import context
from ..wire import rpc
from ..wire.connection import connect, serve
from ..wire.eventloop import new_event_loop
from .output import redirect_output
from .worker import Worker

__all__ = ["worker_main"]

log = logging.getLogger("ddlf.worker")


def worker_main(node_host: str, node_port: int, token: str, node_id: str, worker_id: str,
                head_address: str, listen_host: str, log_prefix: str | None, env: dict,
                node_pid: int) -> None:
    """Entry point of a worker process (started by the node daemon's forkserver)."""
    close_inherited_fds()
    threading.Thread(target=_watch_node, args=(node_pid,), name="ddlf-lifeline", daemon=True).start()
    os.environ.update(env)
    redirect_output(log_prefix)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the driver's terminal is the driver's
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    worker = Worker(loop, node_id, worker_id, head_address, token)

    async def start():
        # Callers are tracked once, when they authenticate, not on every call.
        worker.server = await serve(listen_host, 0, token, worker.frames,
                                    on_open=worker.callers.add)
        port = worker.server.sockets[0].getsockname()[1]
        context.worker_context().address = f"{listen_host}:{port}"   # named by out-of-band refs
        worker.node_conn = await connect(node_host, node_port, token,
                                         rpc.RpcHandler(worker, worker.rpc_handlers()))
        await rpc.call(worker.node_conn, "worker_ready", worker_id, worker.pid, port)

    try:
        loop.run_until_complete(start())
    except Exception as e:
        print(f"ddlf worker {worker_id} failed to start: {e!r}", file=sys.stderr)
        os._exit(1)
    loop.run_forever()


def close_inherited_fds() -> list:
    """Close what a worker inherits from the forkserver and never uses; the fds closed.

    ``ls -l /proc/<worker>/fd`` showed, besides its own files and sockets:

    * fd 0: the node's stdin, which for an embedded cluster is the driver's lifeline pipe
      (a worker reading stdin would have taken bytes meant for the node). It becomes
      /dev/null, which is what ``sys.stdin`` already was;
    * the write end of the forkserver's "alive" pipe: the forkserver exits when every
      holder has closed it, so each worker kept it running after its node was gone;
    * the write end of the node's ``multiprocessing`` resource-tracker pipe (a worker
      that needs a tracker starts its own);
    * multiprocessing's parent sentinel, a read end of the pipe the worker's start-up
      data came through, kept only for ``multiprocessing.parent_process().is_alive()``
      (now ``parent_process()`` is None: workers watch their node by pid instead);
    * the /dev/null descriptors the forkserver and multiprocessing opened as stdin.

    Where this Python's multiprocessing differs, what is not found is left open.
    """
    closed = []

    def close(fd) -> None:
        if isinstance(fd, int) and fd > 2:
            try:
                os.close(fd)
                closed.append(fd)
            except OSError:
                pass

    try:
        from multiprocessing import forkserver, process, resource_tracker

        server = getattr(forkserver, "_forkserver", None)
        alive_fd = getattr(server, "_forkserver_alive_fd", None)
        if server is not None and alive_fd is not None:
            close(alive_fd)
            server._forkserver_alive_fd = None
        tracker = getattr(resource_tracker, "_resource_tracker", None)
        tracker_fd = getattr(tracker, "_fd", None)
        if (tracker is not None and tracker_fd is not None
                and getattr(tracker, "_pid", None) is None):
            close(tracker_fd)   # not a tracker this process started (that would have a pid)
            tracker._fd = None
        parent = getattr(process, "_parent_process", None)
        if parent is not None and isinstance(getattr(parent, "_sentinel", None), int):
            close(parent._sentinel)
            process._parent_process = None   # type: ignore[attr-defined]  # (private, checked above)
    except Exception as e:
        # multiprocessing's private names differ in this Python: those descriptors stay
        # open, which costs a few fds per worker, never correctness (see the docstring).
        log.debug("closing multiprocessing's inherited descriptors: %r", e)
    try:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        os.dup2(null, 0, inheritable=True)
        os.close(null)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        null_dev = os.stat(os.devnull).st_rdev
        keep = getattr(sys.modules.get("subprocess"), "_devnull", None)   # cached by subprocess
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd <= 2 or fd == keep:
                continue
            try:
                st = os.fstat(fd)
            except OSError:
                continue   # the listing's own descriptor, closed by now
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == null_dev:
                close(fd)
    except (OSError, ValueError):
        pass   # no /proc (another OS): the /dev/null descriptors stay
    return closed


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
    except Exception as e:
        # No prctl here (a libc without it): the getppid poll still catches the parent's
        # exit, within half a second.
        log.debug("PR_SET_PDEATHSIG: %r", e)
