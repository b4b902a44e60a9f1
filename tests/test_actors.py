"""Actor behaviour: state, ordering, async concurrency, handles passed around, kill."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from helpers_modules.remote_defs import Counter

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError


@ddlf.remote
class ListHolder:
    def __init__(self):
        self.items = []

    def append(self, x):
        self.items.append(x)
        return len(self.items)

    def items_(self):
        return list(self.items)


@ddlf.remote
class Sleeper:
    def sleep(self, seconds):
        time.sleep(seconds)
        return seconds

    def ping(self):
        return "pong"


class _ConcurrencyProbe:
    """Async actor that records how many of its calls are inside at once."""

    def __init__(self):
        self.inside = 0
        self.peak = 0
        self.changed = asyncio.Event()

    async def enter(self, want: int, timeout: float):
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        self.changed.set()
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            while self.inside < want:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                self.changed.clear()
                try:
                    await asyncio.wait_for(self.changed.wait(), left)
                except asyncio.TimeoutError:
                    break
            return self.peak
        finally:
            self.inside -= 1
            self.changed.set()

    async def get_peak(self):
        return self.peak


AsyncProbe4 = ddlf.remote(max_concurrency=4)(_ConcurrencyProbe)
AsyncProbe1 = ddlf.remote(max_concurrency=1)(_ConcurrencyProbe)


@ddlf.remote(max_concurrency=3)
class ThreadedProbe:
    """Sync methods with max_concurrency > 1 run on threads: they may overlap."""

    def __init__(self):
        self.lock = threading.Lock()
        self.inside = 0
        self.peak = 0

    def enter(self, want, timeout):
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                with self.lock:
                    if self.inside >= want:
                        break
                time.sleep(0.01)
            return self.peak
        finally:
            with self.lock:
                self.inside -= 1


@ddlf.remote
class Caller:
    """Calls another actor through a handle it receives as an argument."""

    def __init__(self, other=None):
        self.other = other

    def call_through(self, handle, by):
        return ddlf.get(handle.incr.remote(by), timeout=20)

    def call_stored(self, by):
        return ddlf.get(self.other.incr.remote(by), timeout=20)

    def create_and_use(self, start):
        inner = Counter.remote(start)
        return ddlf.get(inner.incr.remote(), timeout=20)


@ddlf.remote
def task_calls_handle(handle, by):
    return ddlf.get(handle.incr.remote(by), timeout=20)


@ddlf.remote
def task_calls_handles_in_list(handles):
    return ddlf.get([h.incr.remote(1) for h in handles], timeout=20)


# -- basics ---------------------------------------------------------------------------------------

def test_handle_and_ref_types(cluster):
    c = Counter.remote()
    assert isinstance(c, ddlf.ActorHandle)
    ref = c.incr.remote()
    assert isinstance(ref, ddlf.ObjectRef)
    assert ddlf.get(ref, timeout=20) == 1


def test_state_persists_across_calls(cluster):
    c = Counter.remote(5)
    assert ddlf.get(c.incr.remote(), timeout=20) == 6
    assert ddlf.get(c.incr.remote(10), timeout=20) == 16
    assert ddlf.get(c.incr.remote(by=-1), timeout=20) == 15
    assert ddlf.get(c.read.remote(), timeout=20) == 15


def test_actors_have_separate_state_and_processes(cluster):
    a, b = Counter.remote(), Counter.remote(100)
    ddlf.get([a.incr.remote() for _ in range(3)], timeout=20)
    assert ddlf.get([a.read.remote(), b.read.remote()], timeout=20) == [3, 100]
    pa, pb = ddlf.get([a.pid.remote(), b.pid.remote()], timeout=20)
    assert pa != pb and os.getpid() not in (pa, pb)


def test_calls_from_one_caller_run_in_submission_order(cluster):
    h = ListHolder.remote()
    refs = [h.append.remote(i) for i in range(200)]
    assert ddlf.get(refs, timeout=30) == list(range(1, 201))
    assert ddlf.get(h.items_.remote(), timeout=20) == list(range(200))


def test_get_of_list_preserves_order(cluster):
    c = Counter.remote()
    refs = [c.incr.remote(i) for i in range(50)]
    expected = [sum(range(i + 1)) for i in range(50)]
    assert ddlf.get(refs, timeout=20) == expected
    assert ddlf.get(list(reversed(refs)), timeout=20) == list(reversed(expected))
    assert ddlf.get(tuple(refs[:3]), timeout=20) == expected[:3]


def test_actor_class_defined_inside_test_function(cluster):
    @ddlf.remote
    class Local:
        def __init__(self, base):
            self.base = base
            self.calls = []

        def add(self, x):
            self.calls.append(x)
            return self.base + x

        def history(self):
            return self.calls

    a = Local.remote(1000)
    assert ddlf.get([a.add.remote(i) for i in range(5)], timeout=20) == [1000, 1001, 1002,
                                                                          1003, 1004]
    assert ddlf.get(a.history.remote(), timeout=20) == [0, 1, 2, 3, 4]


def test_closure_over_local_value_shipped_by_value(cluster):
    secret = os.urandom(4).hex()

    @ddlf.remote
    class Closure:
        def reveal(self):
            return secret

    assert ddlf.get(Closure.remote().reveal.remote(), timeout=20) == secret


def test_constructor_args_and_kwargs(cluster):
    @ddlf.remote
    class Args:
        def __init__(self, a, b=2, *rest, **kw):
            self.state = (a, b, rest, kw)

        def get(self):
            return self.state

    h = Args.remote(1, 3, 4, 5, x="y")
    assert ddlf.get(h.get.remote(), timeout=20) == (1, 3, (4, 5), {"x": "y"})


def test_unknown_method_raises_attribute_error(cluster):
    c = Counter.remote()
    with pytest.raises(AttributeError):
        c.no_such_method.remote()


# -- async actors ----------------------------------------------------------------------------------

def test_async_actor_calls_overlap_up_to_max_concurrency(cluster):
    p = AsyncProbe4.remote()
    refs = [p.enter.remote(4, 8.0) for _ in range(4)]
    peaks = ddlf.get(refs, timeout=20)
    assert max(peaks) == 4
    assert ddlf.get(p.get_peak.remote(), timeout=20) == 4


def test_async_actor_never_exceeds_max_concurrency(cluster):
    p = AsyncProbe4.remote()
    # Ask for 8 at once: only 4 may be inside.
    ddlf.get([p.enter.remote(8, 0.5) for _ in range(8)], timeout=20)
    assert ddlf.get(p.get_peak.remote(), timeout=20) == 4


def test_async_actor_max_concurrency_one_does_not_overlap(cluster):
    p = AsyncProbe1.remote()
    peaks = ddlf.get([p.enter.remote(4, 0.25) for _ in range(4)], timeout=20)
    assert peaks == [1, 1, 1, 1]
    assert ddlf.get(p.get_peak.remote(), timeout=20) == 1


def test_async_actor_defined_inside_test(cluster):
    @ddlf.remote(max_concurrency=2)
    class Gate:
        def __init__(self):
            self.event = asyncio.Event()

        async def wait_open(self):
            await asyncio.wait_for(self.event.wait(), 10)
            return "passed"

        async def open(self):
            self.event.set()
            return "opened"

    g = Gate.remote()
    waiting = g.wait_open.remote()
    # The waiter is parked inside the actor; a second call can still get in and open it.
    assert ddlf.get(g.open.remote(), timeout=20) == "opened"
    assert ddlf.get(waiting, timeout=20) == "passed"


def test_threaded_actor_overlaps_sync_methods(cluster):
    p = ThreadedProbe.remote()
    peaks = ddlf.get([p.enter.remote(3, 8.0) for _ in range(3)], timeout=20)
    assert max(peaks) == 3


# -- handles passed around ---------------------------------------------------------------------------

def test_actor_calls_actor_through_handle_argument(cluster):
    b = Counter.remote()
    a = Caller.remote()
    assert ddlf.get(a.call_through.remote(b, 5), timeout=20) == 5
    assert ddlf.get(a.call_through.remote(b, 2), timeout=20) == 7
    # The driver sees the state the other actor changed: it is the same actor.
    assert ddlf.get(b.incr.remote(1), timeout=20) == 8


def test_handle_passed_to_constructor(cluster):
    b = Counter.remote(10)
    a = Caller.remote(b)
    assert ddlf.get(a.call_stored.remote(3), timeout=20) == 13
    assert ddlf.get(b.read.remote(), timeout=20) == 13


def test_task_receives_handle_and_calls_it(cluster):
    b = Counter.remote()
    assert ddlf.get(task_calls_handle.remote(b, 4), timeout=20) == 4
    assert ddlf.get(task_calls_handles_in_list.remote([b, b]), timeout=20) == [5, 6]
    assert ddlf.get(b.read.remote(), timeout=20) == 6


def test_many_tasks_share_one_actor(cluster):
    b = Counter.remote()
    results = ddlf.get([task_calls_handle.remote(b, 1) for _ in range(20)], timeout=60)
    assert sorted(results) == list(range(1, 21))
    assert ddlf.get(b.read.remote(), timeout=20) == 20


def test_actor_creates_and_uses_its_own_actor(cluster):
    a = Caller.remote()
    assert ddlf.get(a.create_and_use.remote(41), timeout=30) == 42


# -- kill --------------------------------------------------------------------------------------------

def test_kill_fails_pending_and_later_calls(cluster):
    s = Sleeper.remote()
    assert ddlf.get(s.ping.remote(), timeout=20) == "pong"
    running = s.sleep.remote(10)
    queued = [s.ping.remote() for _ in range(5)]
    time.sleep(0.3)
    t0 = time.monotonic()
    ddlf.kill(s)
    for ref in [running, *queued]:
        with pytest.raises(ActorDiedError):
            ddlf.get(ref, timeout=20)
    assert time.monotonic() - t0 < 8  # well before the 10 s call would have finished
    for _ in range(3):
        with pytest.raises(ActorDiedError):
            ddlf.get(s.ping.remote(), timeout=20)


def test_call_right_after_kill_raises(cluster):
    c = Counter.remote()
    assert ddlf.get(c.incr.remote(), timeout=20) == 1
    ddlf.kill(c)
    with pytest.raises(ActorDiedError):
        ddlf.get(c.incr.remote(), timeout=20)


def test_kill_stops_the_actor_process(cluster):
    import psutil

    c = Counter.remote()
    pid = ddlf.get(c.pid.remote(), timeout=20)
    assert psutil.pid_exists(pid)
    ddlf.kill(c)

    def gone():
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone()


def test_kill_rejects_non_handles(cluster):
    with pytest.raises(TypeError):
        ddlf.kill("not a handle")


def test_kill_one_actor_leaves_others_alive(cluster):
    a, b = Counter.remote(), Counter.remote()
    ddlf.get([a.incr.remote(), b.incr.remote()], timeout=20)
    ddlf.kill(a)
    with pytest.raises(ActorDiedError):
        ddlf.get(a.pid.remote(), timeout=20)
    assert ddlf.get(b.incr.remote(), timeout=20) == 2


def test_a_new_clusters_first_actor_runs_in_a_worker_started_before_init_returned(no_leaks):
    """A new node warms its workers before it registers, so an actor created right after
    ``ddlf.init()`` takes a ready process instead of waiting for the forkserver to start
    and import (0.3 s idle, over 1 s on a loaded 2-core host: Ray's doc example
    ``actors.py`` cancels its first call 1 s after creating the actor). Timing-free: the
    actor's process must be one of the node's processes when ``init`` returned."""
    import psutil

    from ddlf_actors.runtime.client.current import get_core

    ddlf.init(num_cpus=1)
    try:
        node = psutil.Process(get_core().cluster.procs[1].pid)
        there = {p.pid for p in node.children(recursive=True)}
        c = Counter.remote()
        pid = ddlf.get(c.pid.remote(), timeout=60)
        assert pid in there, "the first actor waited for a worker process to be started"
    finally:
        ddlf.shutdown()
