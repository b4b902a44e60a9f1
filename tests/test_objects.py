"""Objects: put/get, refs as arguments, wait, timeouts, await, large arrays."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import GetTimeoutError, TaskError


@ddlf.remote
class Store:
    def __init__(self):
        self.seen = []

    def echo(self, x):
        return x

    def describe(self, x, y=None):
        self.seen.append(type(x).__name__)
        return type(x).__name__, x, y

    def total(self, xs):
        return sum(xs)

    def add(self, a, b):
        return a + b

    def fail(self, msg):
        raise ValueError(msg)

    def sleep(self, seconds):
        time.sleep(seconds)
        return seconds

    def nbytes_and_sum(self, arr):
        return arr.nbytes, float(arr[::1000].sum())


@ddlf.remote(max_concurrency=8)
class AsyncSleeper:
    async def sleep(self, seconds, value=None):
        await asyncio.sleep(seconds)
        return seconds if value is None else value


@ddlf.remote
def total(xs):
    return sum(xs)


@ddlf.remote
def add(a, b=0):
    return a + b


@ddlf.remote
def kind(x):
    return type(x).__name__


@ddlf.remote
def fail_task(msg):
    raise KeyError(msg)


@ddlf.remote
def slow_value(seconds, value):
    time.sleep(seconds)
    return value


# -- put / get -------------------------------------------------------------------------------------

def test_put_returns_ref_and_get_round_trips(cluster):
    value = {"a": [1, 2, 3], "b": ("x", None), "c": {1.5, 2.5}}
    ref = ddlf.put(value)
    assert isinstance(ref, ddlf.ObjectRef)
    assert ddlf.get(ref) == value
    assert ddlf.get([ref, ref]) == [value, value]


def test_put_snapshots_mutable_value(cluster):
    arr = np.arange(100_000, dtype=np.int64)
    lst = [1, 2, 3]
    r_arr, r_lst = ddlf.put(arr), ddlf.put(lst)
    arr[:] = -1
    lst.append(4)
    s = Store.remote()
    assert ddlf.get(s.total.remote(r_lst), timeout=20) == 6
    np.testing.assert_array_equal(ddlf.get(s.echo.remote(r_arr), timeout=20),
                                  np.arange(100_000, dtype=np.int64))


def test_same_put_ref_to_many_calls_and_tasks(cluster):
    data = list(range(1000))
    ref = ddlf.put(data)
    s1, s2 = Store.remote(), Store.remote()
    actor_refs = [s.total.remote(ref) for s in (s1, s2) for _ in range(10)]
    task_refs = [total.remote(ref) for _ in range(20)]
    assert ddlf.get(actor_refs + task_refs, timeout=60) == [sum(data)] * 40
    assert ddlf.get(s1.describe.remote(ref), timeout=20)[0] == "list"


def test_put_ref_as_kwarg(cluster):
    ref = ddlf.put(5)
    s = Store.remote()
    assert ddlf.get(s.describe.remote(1, y=ref), timeout=20) == ("int", 1, 5)
    assert ddlf.get(add.remote(1, b=ref), timeout=20) == 6


def test_put_of_a_ref_is_refused(cluster):
    ref = ddlf.put(1)
    with pytest.raises(TypeError):
        ddlf.put(ref)


def test_get_rejects_non_refs(cluster):
    with pytest.raises(TypeError):
        ddlf.get(42)


# -- refs as arguments -------------------------------------------------------------------------------

def test_actor_result_ref_passed_to_actor_call_is_resolved(cluster):
    a, b = Store.remote(), Store.remote()
    r1 = a.echo.remote([1, 2, 3])
    r2 = b.describe.remote(r1)
    assert ddlf.get(r2, timeout=20) == ("list", [1, 2, 3], None)
    # Through the same actor, and as a keyword argument.
    r3 = a.add.remote(10, 5)
    assert ddlf.get(a.add.remote(r3, b=r3), timeout=20) == 30


def test_pending_ref_passed_to_call_waits_for_value(cluster):
    a, b = Store.remote(), Store.remote()
    slow = a.sleep.remote(0.5)
    dependent = b.add.remote(slow, 1)
    assert ddlf.get(dependent, timeout=20) == 1.5


def test_task_result_ref_passed_to_task_is_resolved(cluster):
    r1 = add.remote(1, 2)
    r2 = add.remote(r1, 10)
    r3 = add.remote(r2, b=r1)
    assert ddlf.get(kind.remote(r1), timeout=20) == "int"
    assert ddlf.get([r2, r3], timeout=20) == [13, 16]


def test_chain_of_pending_task_refs(cluster):
    ref = slow_value.remote(0.2, 0)
    for _ in range(10):
        ref = add.remote(ref, 1)
    assert ddlf.get(ref, timeout=30) == 10


def test_refs_cross_between_tasks_and_actors(cluster):
    s = Store.remote()
    from_task = add.remote(2, 3)
    from_actor = s.add.remote(from_task, 4)      # task -> actor
    back_to_task = add.remote(from_actor, b=1)   # actor -> task (kwarg)
    assert ddlf.get(back_to_task, timeout=20) == 10


def test_failed_ref_as_argument_fails_dependent_actor_call(cluster):
    s = Store.remote()
    bad = s.fail.remote("upstream-broke-7")
    dependent = s.echo.remote(bad)
    with pytest.raises(ValueError, match="upstream-broke-7") as info:
        ddlf.get(dependent, timeout=20)
    assert isinstance(info.value, TaskError)
    with pytest.raises(ValueError, match="upstream-broke-7"):
        ddlf.get(s.describe.remote(1, y=bad), timeout=20)
    # The actor is fine and the dependent call never ran on it.
    assert ddlf.get(s.echo.remote("ok"), timeout=20) == "ok"


def test_failed_ref_as_argument_fails_dependent_task(cluster):
    bad = fail_task.remote("task-broke-9")
    with pytest.raises(KeyError, match="task-broke-9"):
        ddlf.get(add.remote(bad, 1), timeout=20)
    with pytest.raises(KeyError, match="task-broke-9"):
        ddlf.get(add.remote(1, b=bad), timeout=20)
    s = Store.remote()
    with pytest.raises(KeyError, match="task-broke-9"):
        ddlf.get(s.echo.remote(bad), timeout=20)


# -- get timeout / wait --------------------------------------------------------------------------------

def test_get_timeout_raises_get_timeout_error(cluster):
    s = Store.remote()
    assert ddlf.get(s.echo.remote(1), timeout=20) == 1
    slow = s.sleep.remote(3)
    t0 = time.monotonic()
    with pytest.raises(GetTimeoutError):
        ddlf.get(slow, timeout=0.5)
    elapsed = time.monotonic() - t0
    assert 0.4 <= elapsed < 2.5, elapsed
    assert issubclass(GetTimeoutError, TimeoutError)
    # The call itself was not disturbed.
    assert ddlf.get(slow, timeout=20) == 3


def test_get_timeout_on_list(cluster):
    s = Store.remote()
    fast, slow = s.echo.remote(1), s.sleep.remote(2)
    with pytest.raises(GetTimeoutError):
        ddlf.get([fast, slow], timeout=0.3)
    assert ddlf.get([fast, slow], timeout=20) == [1, 2]


def test_wait_returns_ready_and_not_ready_in_input_order(cluster):
    a = AsyncSleeper.remote()
    ddlf.get(a.sleep.remote(0), timeout=20)
    refs = [a.sleep.remote(5, "s0"), a.sleep.remote(0, "f1"), a.sleep.remote(5, "s2"),
            a.sleep.remote(0.05, "f3")]
    ready, not_ready = ddlf.wait(refs, num_returns=2, timeout=4)
    assert ready == [refs[1], refs[3]]
    assert not_ready == [refs[0], refs[2]]
    assert ddlf.get(ready, timeout=20) == ["f1", "f3"]


def test_wait_ready_follows_input_order_not_completion_order(cluster):
    a = AsyncSleeper.remote()
    ddlf.get(a.sleep.remote(0), timeout=20)
    later = a.sleep.remote(0.4, "later")
    sooner = a.sleep.remote(0.0, "sooner")
    ddlf.get([later, sooner], timeout=20)
    ready, not_ready = ddlf.wait([later, sooner], num_returns=2, timeout=10)
    assert ready == [later, sooner] and not_ready == []
    ready, not_ready = ddlf.wait([sooner, later], num_returns=2, timeout=10)
    assert ready == [sooner, later] and not_ready == []


def test_wait_num_returns_caps_ready(cluster):
    refs = [ddlf.put(i) for i in range(5)]
    ready, not_ready = ddlf.wait(refs, num_returns=2, timeout=5)
    assert ready == refs[:2] and not_ready == refs[2:]


def test_wait_timeout_returns_fewer_ready(cluster):
    a = AsyncSleeper.remote()
    ddlf.get(a.sleep.remote(0), timeout=20)
    refs = [a.sleep.remote(5), a.sleep.remote(0), a.sleep.remote(5)]
    ddlf.get(refs[1], timeout=20)
    t0 = time.monotonic()
    ready, not_ready = ddlf.wait(refs, num_returns=3, timeout=0.5)
    elapsed = time.monotonic() - t0
    assert ready == [refs[1]]
    assert not_ready == [refs[0], refs[2]]
    assert 0.4 <= elapsed < 3, elapsed


def test_wait_on_tasks(cluster):
    refs = [slow_value.remote(0.0, i) for i in range(6)]
    ready, not_ready = ddlf.wait(refs, num_returns=6, timeout=30)
    assert ready == refs and not_ready == []


def test_wait_argument_errors(cluster):
    ref = ddlf.put(1)
    with pytest.raises(TypeError):
        ddlf.wait(ref)
    with pytest.raises(ValueError):
        ddlf.wait([ref], num_returns=2)


# -- await ---------------------------------------------------------------------------------------------

def test_await_ref_in_asyncio_run(cluster):
    s = Store.remote()

    async def main():
        one = await s.add.remote(1, 2)
        many = await asyncio.gather(*[s.add.remote(i, i) for i in range(5)])
        from_task = await add.remote(one, 100)
        from_put = await ddlf.put("stored")
        return one, many, from_task, from_put

    assert asyncio.run(main()) == (3, [0, 2, 4, 6, 8], 103, "stored")


def test_await_ref_raises_remote_error(cluster):
    s = Store.remote()

    async def main():
        await s.fail.remote("awaited-failure")

    with pytest.raises(ValueError, match="awaited-failure"):
        asyncio.run(main())


def test_await_pending_ref_does_not_block_event_loop(cluster):
    s = Store.remote()

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        value = await s.sleep.remote(0.5)
        t.cancel()
        return value, ticks

    value, ticks = asyncio.run(main())
    assert value == 0.5
    assert ticks >= 5  # the loop kept running while the ref was pending


# -- large data ----------------------------------------------------------------------------------------

def test_100mb_numpy_round_trip_through_actor(cluster):
    rng = np.random.default_rng(1234)
    arr = rng.random(25_000_000, dtype=np.float32)  # 100 MB
    assert arr.nbytes == 100_000_000
    s = Store.remote()
    back = ddlf.get(s.echo.remote(arr), timeout=60)
    assert isinstance(back, np.ndarray)
    assert back.dtype == np.float32 and back.shape == arr.shape
    assert np.array_equal(back, arr)
    nbytes, sample = ddlf.get(s.nbytes_and_sum.remote(arr), timeout=60)
    assert nbytes == arr.nbytes
    assert sample == pytest.approx(float(arr[::1000].sum()))


def test_100mb_numpy_put_shared_by_calls(cluster):
    arr = np.ones(25_000_000, dtype=np.float32)
    arr[::7] = 3.0
    ref = ddlf.put(arr)
    s = Store.remote()
    expected = (arr.nbytes, float(arr[::1000].sum()))
    results = ddlf.get([s.nbytes_and_sum.remote(ref) for _ in range(3)], timeout=60)
    assert results == [expected] * 3
