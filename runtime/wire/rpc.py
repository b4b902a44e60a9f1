"""Request/reply and one-way messages over a :class:`Connection` (the control plane).

``RpcHandler(target, handlers)`` answers ``REQUEST`` frames by calling
``handlers[method](conn, *args)`` (plain or ``async``) and routes ``PUSH`` frames to
``target.on_push(conn, event, data)``. Each role (head, node daemon, worker) lists what a
peer may ask of it in one handler table, so a request can only reach a function named
there, never an attribute found by name. :func:`call` sends a request and awaits its
reply. The data plane (actor calls, task calls, objects) does not go through here: it has
its own lean handlers.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import traceback
from typing import TYPE_CHECKING

from ..errors import ConnectionLostError, DDLFError, FrameError
from . import protocol
from .frames import TableFrameHandler
from .messages import MessageError
from .serialization import dumps, loads
from .taskgroup import TaskGroup

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["RpcHandler", "call", "push", "RemoteRpcError"]

log = logging.getLogger("ddlf.rpc")
_ids = itertools.count(1)


class RemoteRpcError(DDLFError):
    """A control-plane request failed on the peer; carries the peer's traceback text."""


def _pending(conn: Connection) -> dict:
    p = conn.info.rpc_pending
    if p is None:
        p = conn.info.rpc_pending = {}
    return p


async def call(conn: Connection, method: str, *args, timeout: float | None = None):
    """Send ``method(*args)`` to the peer and return its reply (re-raising its error)."""
    msg_id = next(_ids)
    fut = conn.loop.create_future()
    _pending(conn)[msg_id] = fut
    try:
        conn.send_msg(protocol.REQUEST, msg_id, dumps((method, args)))
    except ConnectionLostError:
        _pending(conn).pop(msg_id, None)
        raise
    if timeout is None:
        return await fut
    try:
        return await asyncio.wait_for(fut, timeout)
    finally:
        _pending(conn).pop(msg_id, None)


def push(conn: Connection, event: str, data) -> None:
    """Send a one-way event (no reply). Silently dropped if the connection is closed."""
    if not conn.closed:
        conn.send_msg(protocol.PUSH, 0, dumps((event, data)))


class RpcHandler(TableFrameHandler):
    """Answers requests from ``handlers`` ({method name: callable(conn, *args)}) and hands
    pushes and the connection's end to ``target`` (``on_push``, optional ``on_closed``).
    Without ``handlers`` (a driver's link to the head) every request is unknown."""

    def __init__(self, target, handlers: dict | None = None):
        self.target = target
        self.handlers = dict(handlers or {})
        self._requests: TaskGroup | None = None   # async requests being answered

    # -- frames (dispatched through FRAMES, runtime/wire/frames.py) ---------------------------------
    def _on_request(self, conn: Connection, kind, msg_id, segs):
        method, args = loads(segs[1:])
        fn = self.handlers.get(method) if isinstance(method, str) else None
        if fn is None:
            self._reply_err(conn, msg_id, DDLFError(f"unknown request {method!r}"))
            return
        try:
            result = fn(conn, *args)
        except Exception as e:
            self._reply_err(conn, msg_id, e)
            return
        if inspect.isawaitable(result):
            if self._requests is None:
                self._requests = TaskGroup(conn.loop, "rpc")
            # Its outcome is the reply (errors included), so the group need not log it.
            task = self._requests.spawn(result, log_errors=False)
            if task is None:   # the group was closed (nothing closes it today): answer anyway
                self._reply_err(conn, msg_id, DDLFError(f"request {method!r} arrived while "
                                                        "this process was shutting down"))
                return
            task.add_done_callback(lambda t: self._reply_task(conn, msg_id, t))
        else:
            self._reply_ok(conn, msg_id, result)

    def _on_reply(self, conn: Connection, kind, msg_id, segs):
        fut = _pending(conn).pop(msg_id, None)
        if fut is None or fut.done():
            return
        try:
            value = loads(segs[1:])
        except Exception as e:
            fut.set_exception(e)
            return
        if kind == protocol.REPLY_OK:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def _on_push(self, conn: Connection, kind, msg_id, segs):
        try:
            event, data = loads(segs[1:])
        except Exception as e:
            log.warning("dropped an unreadable push from %s: %s", conn.peer, e)
            return
        try:
            self.target.on_push(conn, event, data)
        except MessageError as e:
            # A push has no reply to carry the error: drop it, keep the connection.
            log.warning("dropped a malformed %r push from %s: %s", event, conn.peer, e)
        except Exception:
            # A bug in one handler must not cut the link: for a driver, losing the head
            # connection kills every actor it owns. Log it with its traceback instead.
            log.exception("the %r push handler failed (push from %s); the push is "
                          "dropped and the connection kept", event, conn.peer)

    FRAMES = {protocol.REQUEST: _on_request, protocol.REPLY_OK: _on_reply,
              protocol.REPLY_ERR: _on_reply, protocol.PUSH: _on_push}

    def unexpected_frame(self, conn: Connection, kind: int) -> None:
        # A data-plane frame on a control port: a confused or hostile peer. Drop the
        # connection quietly instead of logging a traceback per frame.
        conn.abort(FrameError(f"unexpected frame kind {kind} on a control connection"))

    def _reply_task(self, conn: Connection, msg_id, task):
        if task.cancelled():
            self._reply_err(conn, msg_id, DDLFError("request cancelled"))
        elif task.exception() is not None:
            self._reply_err(conn, msg_id, task.exception())
        else:
            self._reply_ok(conn, msg_id, task.result())

    def _reply_ok(self, conn: Connection, msg_id, value):
        if not conn.closed:
            conn.send_msg(protocol.REPLY_OK, msg_id, dumps(value))

    def _reply_err(self, conn: Connection, msg_id, exc):
        if conn.closed:
            return
        if not isinstance(exc, DDLFError):
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            exc = RemoteRpcError(f"{type(exc).__name__}: {exc}\n{tb}")
        try:
            payload = dumps(exc)
        except Exception:
            payload = dumps(RemoteRpcError(f"{type(exc).__name__}: {exc}"))
        conn.send_msg(protocol.REPLY_ERR, msg_id, payload)

    def connection_closed(self, conn: Connection, exc):
        pending, conn.info.rpc_pending = conn.info.rpc_pending or {}, None
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLostError(f"connection to {conn.peer} closed"))
        closed = getattr(self.target, "on_closed", None)
        if closed is not None:
            closed(conn, exc)
