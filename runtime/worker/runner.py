"""The one run path of a call: from a decoded :class:`~call.Call` to its reply.

Where a call runs depends on its code, not on what kind of call it is:

* on an execution thread (:class:`~executor.Executor`), for sync code, in arrival order;
* on the event loop, as an asyncio task, for ``async def`` code (an actor's at most
  ``max_concurrency`` at once).

Either way it runs the same steps: claim the call (unless a cancel got it first), run the
code, turn what it returned into frames (one result, or a generator's values one by one
as they come), and hand ``(kind, segments)`` to :meth:`Runner._send` on the loop. Before
that, :meth:`Runner._answer` (the one cancel rule) turns the outcome of a call that a
cancel reached into its ``TaskCancelledError``; a ``cancel`` of a call still queued
answers through the same two steps. An actor that calls ``sys.exit`` ends the process
instead (``Worker.exit_reply``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING

from .. import context, shm_store
from ..client import current
from ..errors import TaskCancelledError
from ..states import CallState
from ..wire import protocol
from ..wire.remote_error import encode_error
from .call import Call
from .executor import Executor
from .interrupt import exit_now, interrupt, settle
from .results import as_iterator, encode, encode_result, encode_yielded
from .stream_out import end_stream, open_stream, send_item

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["Runner", "Ending"]

_ERR = protocol.RESULT_ERR


class Ending(Enum):
    """How a call ended other than with a result frame (never on the wire)."""

    EXIT = "exit"              # an actor method called sys.exit or exit_actor()
    CANCELLED = "cancelled"    # ddlf.cancel reached it before it produced an outcome
    STREAM_END = "stream end"  # a generator call yielded its last value


class _Unlimited:
    """``async with`` that never waits: async tasks are not bounded like an actor's calls."""

    async def __aenter__(self):
        return None

    async def __aexit__(self, *exc):
        return False


_UNLIMITED = _Unlimited()


class Runner:
    """Runs the calls of one worker and answers them, or cancels them.

    ``calls`` holds each call (not generator calls) from its arrival to its reply, by
    ``(connection, message id)``: that is how ``cancel`` finds it.
    """

    def __init__(self, worker):
        self.worker = worker
        self.loop = worker.loop
        self.calls: dict[tuple, Call] = {}
        self._seq = 0
        # An actor's: async calls at once (max_concurrency), and its execution threads.
        # Task workers get one execution thread, made on first use.
        self.semaphore: asyncio.Semaphore | None = None
        self.executor: Executor | None = None

    def exec(self) -> Executor:
        if self.executor is None:
            self.executor = Executor(self.loop, 1)
        return self.executor

    # -- the run path ----------------------------------------------------------------------
    def run(self, call: Call) -> None:
        """Start ``call`` (on the loop): queue it on a thread, or spawn it on the loop."""
        if call.streaming:
            call.out = open_stream(call.conn, call.msg_id, call.spec.backpressure)
        else:
            self._seq += 1
            call.seq = self._seq
            self.calls[(call.conn, call.msg_id)] = call
        if call.is_async:
            call.atask = self.worker.background.spawn(self._on_loop(call))
        else:
            (self.executor or self.exec()).submit(partial(self._on_thread, call))

    def _on_thread(self, call: Call):
        """An executor job: run the call here; its completion sends the reply on the loop."""
        if call.streaming:
            kind, segs = self._run_code(call)
            # After its values, which went to the loop the same way: the end never
            # overtakes them (a completion may run in a drain scheduled before them).
            self.loop.call_soon_threadsafe(self._send, call, kind, segs)
            return None
        if not call.claim():
            return None   # cancelled while queued here: already answered
        context.set_current_call(call)
        call.thread = threading.get_ident()
        call.state = CallState.RUNNING
        kind, segs = Ending.CANCELLED, None
        try:
            # cancel() sets .cancelled before it reads .state: one of us sees the other.
            if not call.cancelled:
                kind, segs = self._run_code(call)
        except KeyboardInterrupt:
            kind = Ending.CANCELLED   # a cancel's interrupt that landed in our code
        while True:   # at most one interrupt is ever sent: this loop ends
            try:
                settle(call)
                break
            except KeyboardInterrupt:
                pass
        context.set_current_call(None)
        self.calls.pop((call.conn, call.msg_id), None)
        if call.cancelled or kind is Ending.CANCELLED:
            kind, segs = self._answer(call, kind, segs)
        if type(kind) is int:
            kind, segs = shm_store.wrap_result(call.conn, kind, segs)   # off the loop
        return partial(self._send, call, kind, segs)

    def _run_code(self, call: Call) -> tuple:
        """On an execution thread: run the call's code; ``(frame kind, segments)`` of what
        it returned or raised (a generator call sends its values as they come)."""
        where = call.where
        try:
            if call.is_task:
                call.enter()
                context.set_running_task(True)   # a get() in it lends its CPU back
            try:
                result = call.fn(*call.args, **call.kwargs)
                call.args = call.kwargs = None   # the code holds what it still needs
                if call.streaming:
                    return self._send_values(call, as_iterator(result, where))
            finally:
                if call.is_task:
                    context.set_running_task(False)
            if inspect.isgenerator(result) or inspect.isasyncgen(result):
                return encode_yielded(as_iterator(result, where), int(call.num_returns), where)
        except SystemExit as e:
            return self._system_exit(call, e)
        except BaseException as e:
            if type(e) is KeyboardInterrupt and call.interrupted:   # ddlf.cancel's
                err = TaskCancelledError(f"{call.what} was cancelled with ddlf.cancel() "
                                         "while it ran")
                err.__cause__ = e   # as in Ray, which raises it in the task
                e = err
            return _ERR, encode_error(e, where)
        return encode(result, call.num_returns, where)

    def _send_values(self, call: Call, items) -> tuple:
        """On an execution thread: send each value a generator yields, as it comes."""
        conn, out, post = call.conn, call.out, self.loop.call_soon_threadsafe
        for item in items:
            kind, segs = shm_store.wrap_result(conn, *encode_result(item, call.where))
            post(send_item, conn, call.msg_id, out.sent, kind, segs)
            out.sent += 1
            item = segs = None   # a paused generator must not pin the last value
            if kind == _ERR or not out.wait_credit(out.sent, conn):
                items.close()   # unpicklable value, or the caller is gone
                break
        return Ending.STREAM_END, None

    async def _on_loop(self, call: Call) -> None:
        """The same steps as ``_on_thread``, as an asyncio task, for ``async def`` code."""
        if not call.streaming:
            call.claim()   # started: from now on a cancel is answered here
            context.set_current_call(call)   # this asyncio task's own context
        kind = segs = result = None
        gate = _UNLIMITED if call.is_task else self.semaphore
        assert gate is not None  # start_actor set it before any call to the actor arrived
        try:
            async with gate:
                call.state = CallState.RUNNING
                try:
                    call.enter()
                    running = call.fn(*call.args, **call.kwargs)
                    call.args = call.kwargs = None
                    if call.streaming:
                        kind, segs = await self._send_values_async(call, running)
                    else:
                        result = await running
                    running = None
                except SystemExit as e:
                    kind, segs = self._system_exit(call, e)
                except asyncio.CancelledError:
                    raise
                except BaseException as e:
                    kind, segs = _ERR, encode_error(e, call.where)
        except asyncio.CancelledError:
            if not call.cancelled:
                raise   # not ours (the loop is closing)
            kind = Ending.CANCELLED
        finally:
            if not call.streaming:
                self.calls.pop((call.conn, call.msg_id), None)
        # As in Ray, a cancelled call is answered as such, even when it caught the
        # CancelledError and returned.
        kind, segs = self._answer(call, kind, segs)
        if kind is None:   # it returned: encode the value, off the loop if it must wait
            if call.conn.closed:
                return
            out = encode(result, call.num_returns, call.where, can_block=False)
            if out is None:   # it holds refs still pending
                out = await self.loop.run_in_executor(None, encode, result,
                                                      call.num_returns, call.where)
            kind, segs = shm_store.wrap_result(call.conn, *out)
        self._send(call, kind, segs)

    async def _send_values_async(self, call: Call, agen) -> tuple:
        """On the loop: send each value an async generator yields, as it comes."""
        conn, out = call.conn, call.out
        while True:
            try:
                item = await agen.__anext__()
            except StopAsyncIteration:
                break
            enc = encode_result(item, call.where, can_block=False)
            if enc is None:   # it holds refs still pending: wait off the loop
                enc = await self.loop.run_in_executor(None, encode_result, item, call.where)
            kind, segs = shm_store.wrap_result(conn, *enc)
            send_item(conn, call.msg_id, out.sent, kind, segs)
            out.sent += 1
            item = segs = enc = None
            if kind == _ERR or not await out.await_credit(out.sent, conn):
                await agen.aclose()
                break
        return Ending.STREAM_END, None

    def _system_exit(self, call: Call, e: SystemExit) -> tuple:
        """``sys.exit`` in a call: an actor ends (nothing runs after it); a task's call
        fails with it."""
        if call.is_task:
            return _ERR, encode_error(e, call.where)
        if self.executor is not None:
            self.executor.stopped = True
        return Ending.EXIT, self.worker.begin_exit(e, call.where)

    # -- answering -------------------------------------------------------------------------
    @staticmethod
    def _answer(call: Call, kind, segs) -> tuple:
        """The one cancel rule: what a call answers, given how it ended.

        A call a cancel reached answers ``TaskCancelledError``: one cancelled while queued,
        or whose interrupt landed outside its code, and any async call or actor method
        cancelled while it ran (a sync actor method runs on; Ray does the same). A sync
        task the interrupt did not stop, and an actor's exit, keep their outcome.
        """
        if kind is Ending.CANCELLED or (
                call.cancelled and kind is not Ending.EXIT
                and (call.is_async or not call.is_task)):
            when = ("while queued on its worker" if call.state is CallState.QUEUED
                    else "while it ran")
            return _ERR, encode_error(TaskCancelledError(
                f"{call.what} was cancelled with ddlf.cancel() {when}"), call.where)
        return kind, segs

    def _send(self, call: Call, kind, segs) -> None:
        """On the loop: send the reply; end a generator call's stream; or exit."""
        conn, msg_id = call.conn, call.msg_id
        if kind is Ending.EXIT:
            self.worker.exit_reply(conn, msg_id, segs)
        elif call.streaming:
            out = call.out
            if kind is not Ending.STREAM_END:   # what ended it early is its last value
                send_item(conn, msg_id, out.sent, kind, segs)
                out.sent += 1
            end_stream(conn, msg_id, out.sent)
        elif not conn.closed:
            conn.send_msg(kind, msg_id, segs)

    def fail(self, conn: Connection, msg_id: int, exc: BaseException, where: str) -> None:
        """Answer a call that could not start (its frame was malformed, its code missing)."""
        if not conn.closed:
            conn.send_msg(_ERR, msg_id, encode_error(exc, where))

    # -- cancel ----------------------------------------------------------------------------
    def cancel(self, conn: Connection, msg_id: int, flags: int) -> None:
        """A CANCEL frame: drop the call if it is queued here; else interrupt it.

        A sync task gets a ``KeyboardInterrupt`` in its thread (or, with force, this
        process exits); an async task or method has its asyncio task cancelled; a
        running sync actor method only sees ``is_canceled()`` turn True, as in Ray.
        """
        call = self.calls.get((conn, msg_id))
        if call is None:
            return   # already finished: nothing to do
        force = bool(flags & protocol.CANCEL_FORCE) and call.is_task
        call.cancelled = True
        if call.claim():   # not started: it never will
            self.calls.pop((conn, msg_id), None)
            if call.atask is not None:
                call.atask.cancel()   # before its first step: none of its code runs
            self._send(call, *self._answer(call, Ending.CANCELLED, None))
            return
        if flags & protocol.CANCEL_RECURSIVE and call.children:
            core = current.get_core(auto=False)
            if core is not None:
                ids = list(call.children)
                if force:   # this process exits next: send the cancels first
                    core.cancel_and_flush(ids, True, True)
                else:
                    core.submit_io(core.cancel_ids, ids, False, True)
        if force:
            exit_now(1)
        if call.atask is not None:
            call.atask.cancel()
        elif call.is_task:
            interrupt(call)
