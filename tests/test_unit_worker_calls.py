"""runtime/worker/: a CALL frame decoded once into a Call and run on the one run path, with
no process: a real event loop and real execution threads, a fake caller connection.

Covers sync, async and generator calls of tasks and actors, num_returns, the cancel of a
queued call, and the one cancel rule (``Runner._answer``).
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from ddlf_actors.runtime import context
from ddlf_actors.runtime.client import object_ref
from ddlf_actors.runtime.errors import TaskCancelledError
from ddlf_actors.runtime.states import CallState
from ddlf_actors.runtime.wire import protocol
from ddlf_actors.runtime.wire.callspec import STREAMING, CallSpec, TaskSpec
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.remote_error import decode_error
from ddlf_actors.runtime.wire.serialization import dumps, loads
from ddlf_actors.runtime.worker import Worker
from ddlf_actors.runtime.worker.call import Call
from ddlf_actors.runtime.worker.executor import Executor
from ddlf_actors.runtime.worker.runner import Ending, Runner


class FakeConn:
    def __init__(self):
        self.info = ConnInfo()
        self.peer = ("127.0.0.1", 1)
        self.closed = False
        self.aborted = None
        self.sent: list = []
        self.changed: asyncio.Event | None = None

    def send_msg(self, kind, msg_id, segs=()):
        self.sent.append((kind, msg_id, list(segs)))
        if self.changed is not None:
            self.changed.set()

    def abort(self, exc=None):
        self.closed, self.aborted = True, exc


@pytest.fixture
def isolated(monkeypatch):
    """A Worker sets process-wide state (its context, the nested-ref resolver): undo it."""
    monkeypatch.setattr(context, "current", None)
    monkeypatch.setattr(object_ref, "_default_resolve", object_ref._default_resolve)


def _run(scenario, actor=None):
    """Run ``scenario(worker, conn, send)`` on a fresh loop with a worker; ``actor``: an
    instance the worker serves (it is a task worker otherwise)."""
    async def main():
        loop = asyncio.get_running_loop()
        worker = Worker(loop, "n1", "w1", "127.0.0.1:1", "token")
        if actor is not None:
            worker.is_actor, worker.instance, worker.actor_name = True, actor, type(actor).__name__
            worker.runner.semaphore = asyncio.Semaphore(1)
            worker.runner.executor = Executor(loop, 1, name="test-actor")
        conn = FakeConn()
        conn.changed = asyncio.Event()

        async def replies(n, timeout=10):
            """Wait until ``n`` frames were sent back; return them."""
            async def wait():
                while len(conn.sent) < n:
                    conn.changed.clear()
                    await conn.changed.wait()
            await asyncio.wait_for(wait(), timeout)
            return conn.sent[:n]

        def send(kind, msg_id, *segs):
            worker.frames.frame_received(conn, [protocol.header(kind, msg_id), *segs])

        try:
            return await scenario(worker, conn, send, replies)
        finally:
            worker.background.close()
            if worker.runner.executor is not None:
                worker.runner.executor.stop()

    return asyncio.run(main())


def _ship(send, fn_id, fn):
    send(protocol.FUNC, 0, fn_id, *dumps(fn))


def _task(send, msg_id, fn_id, *args, **options):
    send(protocol.CALL, msg_id, *dumps(TaskSpec(fn_id, "f", "job1", args, {}, **options)
                                       .to_wire()))


def _value(reply):
    kind, _, segs = reply
    assert kind == protocol.RESULT_OK, decode_error(segs) if kind == protocol.RESULT_ERR else kind
    return loads(segs)


def _error(reply):
    kind, _, segs = reply
    assert kind == protocol.RESULT_ERR, kind
    return decode_error(segs)


def _add(a, b):
    return a + b


async def _async_add(a, b):
    await asyncio.sleep(0)
    return a + b


def _count(n):
    yield from range(n)


def _pair(a):
    return a, a * 2


def test_a_sync_task_runs_on_a_thread_and_answers(isolated):
    async def scenario(worker, conn, send, replies):
        _ship(send, b"a" * 16, _add)
        _task(send, 7, b"a" * 16, 2, 3)
        (reply,) = await replies(1)
        return reply[1], _value(reply), worker.runner.calls

    msg_id, value, calls = _run(scenario)
    assert (msg_id, value, calls) == (7, 5, {})


def test_an_async_task_runs_on_the_loop(isolated):
    async def scenario(worker, conn, send, replies):
        _ship(send, b"b" * 16, _async_add)
        _task(send, 8, b"b" * 16, 4, 5)
        (reply,) = await replies(1)
        return _value(reply)

    assert _run(scenario) == 9


def test_a_generator_task_sends_each_value_then_the_end(isolated):
    async def scenario(worker, conn, send, replies):
        _ship(send, b"c" * 16, _count)
        _task(send, 9, b"c" * 16, 3, num_returns=STREAMING)
        frames = await replies(4)
        return frames, conn.info.streams

    frames, streams = _run(scenario)
    items = [(protocol.STREAM_ITEM_HEAD.unpack(segs[0]), loads(segs[1:]))
             for kind, _, segs in frames[:3]]
    assert items == [((i, protocol.RESULT_OK), i) for i in range(3)]
    kind, msg_id, segs = frames[3]
    assert (kind, msg_id, protocol.STREAM_COUNT.unpack(segs[0])[0]) == (protocol.STREAM_END, 9, 3)
    assert streams == {}


def test_num_returns_two_answers_one_multi_frame(isolated):
    async def scenario(worker, conn, send, replies):
        _ship(send, b"d" * 16, _pair)
        _task(send, 10, b"d" * 16, 21, num_returns=2)
        (reply,) = await replies(1)
        return reply

    kind, _, segs = _run(scenario)
    assert kind == protocol.RESULT_MULTI
    index = loads([segs[0]])
    assert index == [(protocol.RESULT_OK, 1), (protocol.RESULT_OK, 1)]
    assert loads([segs[1]]) == 21 and loads([segs[2]]) == 42


def test_a_malformed_call_is_answered_with_the_field_it_lacks(isolated):
    async def scenario(worker, conn, send, replies):
        send(protocol.CALL, 11, *dumps((b"e" * 16, 5, None, (), {})))
        (reply,) = await replies(1)
        return _error(reply)

    err = _run(scenario)
    assert "TaskSpec.fn_name must be a str, got int" in str(err)


def test_code_never_shipped_is_named(isolated):
    async def scenario(worker, conn, send, replies):
        _task(send, 12, b"z" * 16)
        (reply,) = await replies(1)
        return _error(reply)

    assert f"task code {(b'z' * 16).hex()} was never shipped" in str(_run(scenario))


class Counter:
    def __init__(self):
        self.n = 0
        self.gate = threading.Event()

    def incr(self, by=1):
        self.n += by
        return self.n

    def wait(self):
        self.gate.wait(10)
        return "waited"

    async def later(self, x):
        await asyncio.sleep(0)
        return x * 10

    async def agen(self, n):
        for i in range(n):
            yield i


def _method(send, msg_id, name, *args, **options):
    send(protocol.CALL, msg_id, *dumps(CallSpec(name, args, {}, **options).to_wire()))


def test_actor_calls_run_in_arrival_order(isolated):
    async def scenario(worker, conn, send, replies):
        for i in range(1, 4):
            _method(send, i, "incr", i)
        return [(m, _value(r)) for r, (_, m, _) in zip(await replies(3), conn.sent)]

    assert _run(scenario, actor=Counter()) == [(1, 1), (2, 3), (3, 6)]


def test_async_methods_and_async_generators_run_on_the_loop(isolated):
    async def scenario(worker, conn, send, replies):
        _method(send, 1, "later", 4)
        _method(send, 2, "agen", 2, num_returns=STREAMING)
        frames = await replies(4)
        on_loop = {k: v.on_loop or v.on_loop_streaming for k, v in worker.decoder.methods.items()}
        return frames, on_loop

    frames, on_loop = _run(scenario, actor=Counter())
    assert on_loop == {"later": True, "agen": True}
    by_id = {}
    for kind, msg_id, _ in frames:
        by_id.setdefault(msg_id, []).append(kind)
    assert by_id == {1: [protocol.RESULT_OK],
                     2: [protocol.STREAM_ITEM, protocol.STREAM_ITEM, protocol.STREAM_END]}
    assert _value(next(f for f in frames if f[1] == 1)) == 40


def test_a_call_cancelled_while_queued_never_runs(isolated):
    actor = Counter()

    async def scenario(worker, conn, send, replies):
        _method(send, 1, "wait")          # holds the only execution thread
        _method(send, 2, "incr", 100)     # queued behind it
        send(protocol.CANCEL, 2, bytes([0]))
        (first,) = await replies(1)
        actor.gate.set()
        second = (await replies(2))[1]
        return first, second

    first, second = _run(scenario, actor=actor)
    err = _error(first)
    assert first[1] == 2 and isinstance(err.cause, TaskCancelledError)
    assert "Counter.incr was cancelled with ddlf.cancel() while queued on its worker" in str(err)
    assert second[1] == 1 and _value(second) == "waited"
    assert actor.n == 0   # incr never ran


def test_an_unknown_frame_kind_drops_the_caller(isolated):
    async def scenario(worker, conn, send, replies):
        send(protocol.RESULT_OK, 3, b"x")
        return conn.aborted

    assert "unexpected frame kind" in str(_run(scenario))


def _call(*, is_task, on_loop, cancelled=False, state=CallState.RUNNING):
    spec = TaskSpec(b"f", "f", None, (), {}) if is_task else CallSpec("m", (), {})
    call = Call(None, 1, spec, None, (), {}, "f" if is_task else "A.m",
                f"x (pid {os.getpid()})", is_task, on_loop)
    call.cancelled, call.state = cancelled, state
    return call


@pytest.mark.parametrize("is_task,on_loop,cancelled_answer", [
    (True, False, False),    # a sync task the interrupt did not stop keeps its result
    (True, True, True),      # an async task: cancelled
    (False, False, True),    # a sync actor method runs on, but answers cancelled (Ray)
    (False, True, True),     # an async actor method: cancelled
])
def test_the_cancel_rule(is_task, on_loop, cancelled_answer):
    ok = (protocol.RESULT_OK, ["value"])
    call = _call(is_task=is_task, on_loop=on_loop, cancelled=True)
    kind, segs = Runner._answer(call, *ok)
    assert (kind == protocol.RESULT_ERR) is cancelled_answer
    if cancelled_answer:
        assert "was cancelled with ddlf.cancel() while it ran" in str(decode_error(segs))
    # Not cancelled: the outcome stands. An actor's exit always stands.
    assert Runner._answer(_call(is_task=is_task, on_loop=on_loop), *ok) == ok
    assert Runner._answer(call, Ending.EXIT, ["bye"]) == (Ending.EXIT, ["bye"])
    # Cancelled before it ran: answered as queued.
    queued = _call(is_task=is_task, on_loop=on_loop, cancelled=True, state=CallState.QUEUED)
    kind, segs = Runner._answer(queued, Ending.CANCELLED, None)
    assert "while queued on its worker" in str(decode_error(segs))


_seen_args: list = []


def _keep_weakref(arr):
    import weakref

    _seen_args.append(weakref.ref(arr))
    return int(arr.sum())


async def _keep_weakref_async(arr):
    return _keep_weakref(arr)


@pytest.mark.parametrize("fn", [_keep_weakref, _keep_weakref_async])
def test_a_calls_arguments_are_not_kept_once_it_has_answered(isolated, fn):
    """An argument may be large (or map a shared-memory object its owner frees later):
    nothing of the worker's holds it after the reply, without waiting for a GC pass."""
    import gc

    import numpy as np

    _seen_args.clear()

    async def scenario(worker, conn, send, replies):
        _ship(send, b"w" * 16, fn)
        _task(send, 5, b"w" * 16, np.ones(1000))
        (reply,) = await replies(1)
        for _ in range(3):
            await asyncio.sleep(0)
        return _value(reply), [r() is None for r in _seen_args]

    gc.disable()
    try:
        value, dead = _run(scenario)
    finally:
        gc.enable()
    assert value == 1000 and dead == [True]


def test_a_call_sets_every_field_of_its_context():
    call = _call(is_task=True, on_loop=False)
    missing = [name for name in context.CallContext.__slots__ if not hasattr(call, name)]
    assert missing == []
    fresh = context.CallContext(0, "f", None, None, False)
    for name in context.CallContext.__slots__:
        if name not in ("name", "_token"):
            assert getattr(Call(None, 1, TaskSpec(b"f", "f", None, (), {}), None, (), {},
                                "f", "w", True, False), name) == getattr(fresh, name), name
