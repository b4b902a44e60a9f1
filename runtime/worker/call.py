"""One call on this worker, decoded once from its ``CALL`` frame, from arrival to reply."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import context
from ..states import CallState
from ..wire.callspec import CallSpec, TaskSpec
from .output import log_marker

if TYPE_CHECKING:
    from ..wire.connection import Connection
    from .stream_out import StreamOut

__all__ = ["Call"]


class Call(context.CallContext):
    """A task or actor method call: its spec, its resolved code and arguments, where its
    reply goes, and (as a :class:`~context.CallContext`) what user code and ``cancel``
    see of it.

    ``is_task`` tells a task from an actor method. ``is_async`` is true when its code runs
    as an asyncio task on the event loop (``async def``, or for an actor an ``async def``
    generator), false when it runs on an execution thread. A generator call
    (``streaming``) sends its values through ``out`` (a ``StreamOut``) as they come;
    it is never registered for ``cancel``, nor seen by ``current_call``.
    """

    __slots__ = ("msg_id", "spec", "args", "kwargs", "where", "is_task", "streaming",
                 "num_returns", "out")
    out: StreamOut   # a streaming call's, set by the runner when it starts

    def __init__(self, conn: Connection, msg_id: int, spec: CallSpec | TaskSpec, fn, args, kwargs,
                 name: str, where: str, is_task: bool, is_async: bool):
        # CallContext's fields, set here rather than through its __init__: this runs for
        # every call (test_unit_worker_calls checks that none is missed).
        self.seq = 0
        self.name = name
        self.fn = fn
        self.conn = conn
        self.is_async = is_async
        self.state = CallState.QUEUED
        self.cancelled = False
        self.interrupted = False
        self.thread = 0
        self.atask = None
        self.children = None
        self._token = [True]
        self.msg_id = msg_id
        self.spec = spec
        self.args = args
        self.kwargs = kwargs
        self.where = where   # names the call in errors: "Counter.incr (pid 12)"
        self.is_task = is_task
        self.streaming = type(spec.num_returns) is str   # "streaming" or "dynamic"
        self.num_returns = spec.num_returns

    @property
    def what(self) -> str:
        """The call in a cancellation message: "task f", or "Counter.incr"."""
        return f"task {self.name}" if self.is_task else self.name

    def enter(self) -> None:
        """A task's context, set on the thread (or asyncio task) that runs it just before
        its code: its job and placement group, and a marker telling the node's log tailer
        whose output follows. Nothing for an actor call (its actor set these once)."""
        if not self.is_task:
            return
        spec = self.spec
        assert isinstance(spec, TaskSpec)   # is_task: a task's spec
        ctx = context.worker_context()
        ctx.job_id = spec.job_id
        ctx.placement = spec.placement
        log_marker(f"task:{spec.fn_name}:{spec.job_id or ''}")
