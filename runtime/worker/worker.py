"""``Worker``: the state of one worker process, what its node daemon may ask of it, and
how an actor's process ends when its code calls ``sys.exit`` or ``exit_actor()``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from .. import context
from ..client import current
from ..client.core import join_worker_cluster
from ..client.object_ref import set_default_resolver
from ..errors import ActorDiedError, ActorExit
from ..wire import protocol, rpc
from ..wire.messages import ActorCreation
from ..wire.remote_error import encode_error
from ..wire.serialization import dumps
from ..wire.taskgroup import TaskGroup
from .actor_start import start_actor
from .decode import CallDecoder
from .env import apply_env
from .frames import CallerFrames
from .objects import ObjectCache, adopt_shipped
from .runner import Runner

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["Worker"]

log = logging.getLogger("ddlf.worker")


class Worker:
    """State of one worker process; also the RPC target for its node daemon.

    Its parts: ``objects`` (what callers shipped), ``decoder`` (CALL frames to calls, and
    the task code they run), ``runner`` (the one run path, cancel and reply) and
    ``frames`` (the handler of every caller connection).
    """

    def __init__(self, loop, node_id: str, worker_id: str, head_address: str, token: str):
        self.loop = loop
        self.pid = os.getpid()
        self.background = TaskGroup(loop, "worker")
        self.objects = ObjectCache()
        set_default_resolver(adopt_shipped(self.objects))
        self.is_actor = False
        self.actor_name = ""
        self.instance = None
        self.exit_status: int | None = None
        self.callers: set = set()     # open caller connections, flushed before an exit
        self.node_conn: Connection | None = None
        self.server: asyncio.Server | None = None
        self.decoder = CallDecoder(self)
        self.runner = Runner(self)
        self.frames = CallerFrames(self)
        context.current = context.WorkerContext(head_address, token, node_id, worker_id)
        # Code this worker runs may call other actors: it gets a core on first use.
        current.set_joiner(join_worker_cluster)

    # -- control plane (from the node daemon) ------------------------------------------------
    def rpc_handlers(self) -> dict:
        """What this worker's node daemon may ask of it."""
        return {"setup_env": self.rpc_setup_env, "start_actor": self.rpc_start_actor}

    def rpc_setup_env(self, conn: Connection, setup: dict):
        """A task worker's runtime env, set once, before its first task arrives."""
        apply_env(setup)
        return None

    async def rpc_start_actor(self, conn: Connection, creation: dict):
        """Become the actor ``creation`` (an :class:`ActorCreation`) describes; return an
        :class:`ActorStarted` (with its init error if that failed)."""
        return await start_actor(self, ActorCreation.from_wire(creation))

    def on_push(self, conn: Connection, event, data):
        pass

    def on_closed(self, conn: Connection, exc):
        # The node daemon is gone (or shut us down): never outlive it.
        os._exit(0)

    # -- an actor's exit -------------------------------------------------------------------
    def begin_exit(self, e: SystemExit, where: str) -> list:
        """``sys.exit`` or ``exit_actor()`` in an actor method: end this process, as in Ray.

        The calling method gets an ``ActorDiedError`` naming the exit (these segments);
        the process then exits with the same status, so the head restarts it
        (``max_restarts``) only when that status is non-zero. ``exit_actor()`` exits with
        0: on purpose, no restart.
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
            f"actor {self.actor_name} ({context.worker_context().actor_id}) exited: {where} called "
            f"{how}, exit status {status}; {then}")
        self.exit_status = status
        return encode_error(err, where)

    def exit_reply(self, conn: Connection, msg_id, segs) -> None:
        """On the loop: warn every caller, answer the exiting call, then exit.

        The "exiting" push goes out before the reply, so a caller has stopped sending on
        this connection by the time its user code sees the ActorDiedError: a call made
        next waits for the restarted actor (or fails as dead) instead of being lost here.
        """
        status = self.exit_status
        assert status is not None  # the runner replies this way only after begin_exit set it
        note = dumps(("exiting", {"status": status}))
        for c in self.callers:
            if not c.closed and c is not conn:
                c.send_msg(protocol.PUSH, 0, note)
        if not conn.closed:
            # The caller may retry the very call that exited (max_task_retries).
            conn.send_msg(protocol.PUSH, 0, dumps(
                ("exiting", {"status": status, "msg_id": msg_id})))
        if not conn.closed:
            conn.send_msg(protocol.RESULT_ERR, msg_id, segs)
        if status == 0 and self.node_conn is not None and not self.node_conn.closed:
            # Status 0 alone does not mean "on purpose" (os._exit(0) is a crash, as in
            # Ray): say so to the node, which tells the head not to restart us.
            rpc.push(self.node_conn, "exiting_on_purpose", {})
        self._exit_after_replies(status)

    def _exit_after_replies(self, status: int) -> None:
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
                except Exception as e:
                    # Whatever the stream (closed, or replaced by user code), the process
                    # must reach os._exit: only unflushed output is lost.
                    log.debug("flushing %r before exiting: %r", stream, e)
            os._exit(status)

        # Let completions already handed to the loop (the exiting call's reply) go first.
        self.loop.call_soon(check)
