"""What a worker process knows about the cluster it belongs to, and about the call it runs.

Set by :mod:`worker` at start-up; read by the client core so that code running inside
an actor or task can call other actors without an explicit ``init``.
"""

from __future__ import annotations

import contextvars
import threading
from typing import TYPE_CHECKING

from .client.current import get_core as current_core
from .states import CallState

if TYPE_CHECKING:
    from .wire.connection import Connection

__all__ = ["WorkerContext", "CallContext", "current", "worker_context", "running_task",
           "set_running_task", "current_call", "set_current_call"]


class WorkerContext:
    def __init__(self, head_address: str, token: str, node_id: str, worker_id: str):
        self.head_address = head_address
        self.token = token
        self.node_id = node_id
        self.worker_id = worker_id
        self.actor_id: str | None = None
        self.job_id: str | None = None
        # The runtime env this worker runs in (wire form): the parent of what it submits.
        self.runtime_env: dict | None = None
        self.gpu_ids: list = []      # GPUs assigned to this worker (its CUDA_VISIBLE_DEVICES)
        # The placement group this actor or task runs in: {"group_id", "bundles",
        # "capture"}, or None. With "capture", work it submits joins the group too.
        self.placement: dict | None = None
        self.address: str | None = None   # this worker's server, once it listens
        # The actor's name (None if unnamed), its methods and its resources, from its spec.
        self.actor_info: dict | None = None


current: WorkerContext | None = None


def worker_context() -> WorkerContext:
    """This worker process's context (a ``Worker`` sets it as it starts, before any call
    arrives). Raises ``RuntimeError`` in a process that is not a DDLF worker."""
    ctx = current
    if ctx is None:
        raise RuntimeError("no DDLF worker context: this runs only in a DDLF worker process, "
                           "once its Worker has started")
    return ctx


# True on the thread that runs a task, while it runs: a ``get`` there lends the task's
# CPU back to the scheduler (as Ray does), so nested tasks cannot deadlock.
_thread = threading.local()


def running_task() -> bool:
    return getattr(_thread, "task", False)


def set_running_task(flag: bool) -> None:
    _thread.task = flag


class CallContext:
    """One task or actor call on this worker, from its arrival to its reply.

    ``ddlf.cancel`` finds it by the caller's connection and message id; user code finds
    it through :func:`current_call` (``get_runtime_context().get_task_id()``, ``is_canceled()``),
    and the client core appends to ``children`` the refs of calls it submits, so that a
    recursive cancel reaches them.
    """

    __slots__ = ("seq", "name", "fn", "conn", "is_async", "state", "cancelled", "interrupted",
                 "thread", "atask", "children", "_token")

    def __init__(self, seq: int, name: str, fn, conn: Connection, is_async: bool):
        self.seq = seq
        self.name = name              # "f" for a task, "Class.method" for an actor call
        self.fn = fn
        self.conn = conn
        self.is_async = is_async
        self.state = CallState.QUEUED
        self.cancelled = False
        self.interrupted = False      # a KeyboardInterrupt was sent to its thread
        self.thread = 0
        self.atask = None             # the asyncio task of an async call
        self.children: list | None = None   # object ids of calls it submitted
        self._token = [True]

    def claim(self) -> bool:
        """Take the right to settle a queued call: the first caller wins (the execution
        thread, to run it; ``cancel``, to answer it as cancelled). ``list.pop`` is atomic."""
        try:
            self._token.pop()
            return True
        except IndexError:
            return False

    @property
    def task_id(self) -> str:
        wid = current.worker_id if current is not None else ""
        return f"{wid}{self.seq:012x}"

    def add_child(self, obj_id: bytes) -> None:
        children = self.children
        if children is None:
            children = self.children = []
        children.append(obj_id)
        if len(children) >= 1024 and (len(children) & (len(children) - 1)) == 0:
            _prune(children)


def _prune(children: list) -> None:
    """Forget children whose result this process no longer holds (settled or dropped), so
    a long call that submits millions of tasks keeps a short list (amortized: at 2^k)."""
    core = current_core(auto=False)
    if core is not None:
        children[:] = core.store.pending_among(children)


_call: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("ddlf_call",
                                                                           default=None)


def current_call() -> CallContext | None:
    """The call running in this thread (or asyncio task), or None (a driver, ``__init__``)."""
    return _call.get()


def set_current_call(call: CallContext | None) -> None:
    _call.set(call)
