"""A worker process's entry point and its lifeline to the node daemon that started it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time

import psutil

from .. import context, rpc
from ..connection import connect, serve
from ..eventloop import new_event_loop
from .output import redirect_output
from .worker import Worker

__all__ = ["worker_main"]


def worker_main(node_host: str, node_port: int, token: str, node_id: str, worker_id: str,
                head_address: str, listen_host: str, log_prefix: str | None, env: dict,
                node_pid: int) -> None:
    """Entry point of a worker process (started by the node daemon's forkserver)."""
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
        context.current.address = f"{listen_host}:{port}"   # named by out-of-band refs
        worker.node_conn = await connect(node_host, node_port, token,
                                         rpc.RpcHandler(worker, worker.rpc_handlers()))
        await rpc.call(worker.node_conn, "worker_ready", worker_id, worker.pid, port)

    try:
        loop.run_until_complete(start())
    except Exception as e:
        print(f"ddlf worker {worker_id} failed to start: {e!r}", file=sys.stderr)
        os._exit(1)
    loop.run_forever()


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
