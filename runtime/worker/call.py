"""One call on this worker, decoded once from its ``CALL`` frame, from arrival to reply."""

from __future__ import annotations

from .. import context
from ..callspec import CallSpec, TaskSpec
from .output import log_marker

__all__ = ["Call"]


class Call(context.CallContext):
    """A task or actor method call: its spec, its resolved code and arguments, where its
    reply goes, and (as a :class:`~context.CallContext`) what user code and ``cancel``
    see of it.

    ``is_task`` tells a task from an actor method. ``on_loop`` is true when its code runs
    as an asyncio task on the event loop (``async def``, or for an actor an ``async def``
    generator), false when it runs on an execution thread. A generator call
    (``streaming``) sends its values through ``out`` (a ``StreamOut``) as they come;
    it is never registered for ``cancel``, nor seen by ``current_call``.
    """

    __slots__ = ("msg_id", "spec", "args", "kwargs", "where", "what", "is_task", "on_loop",
                 "out")

    def __init__(self, conn, msg_id: int, spec: CallSpec | TaskSpec, fn, args, kwargs, *,
                 name: str, where: str, is_task: bool, on_loop: bool):
        super().__init__(0, name, fn, conn, on_loop)
        self.msg_id = msg_id
        self.spec = spec
        self.args = args
        self.kwargs = kwargs
        self.where = where   # names the call in errors: "Counter.incr (pid 12)"
        self.what = f"task {name}" if is_task else name   # and in cancellation messages
        self.is_task = is_task
        self.on_loop = on_loop
        self.out = None

    @property
    def streaming(self) -> bool:
        """True for ``num_returns="streaming"`` or ``"dynamic"``."""
        return self.spec.streaming

    @property
    def num_returns(self):
        return self.spec.num_returns

    def enter(self) -> None:
        """A task's context, set on the thread (or asyncio task) that runs it just before
        its code: its job and placement group, and a marker telling the node's log tailer
        whose output follows. Nothing for an actor call (its actor set these once)."""
        if not self.is_task:
            return
        spec = self.spec
        context.current.job_id = spec.job_id
        context.current.placement = spec.placement
        log_marker(f"task:{spec.fn_name}:{spec.job_id or ''}")
