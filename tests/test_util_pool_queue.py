"""ddlf.util.ActorPool and ddlf.util.queue.Queue, with Ray's semantics."""

from __future__ import annotations

import time

import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError
from ddlf_actors.util import ActorPool
from ddlf_actors.util.queue import Empty, Full, Queue


@ddlf.remote
class Worker:
    def double(self, v):
        # Later values finish first, so ordered and unordered results differ.
        time.sleep(0.3 if v == 0 else 0.0)
        return 2 * v

    def sleep(self, s):
        time.sleep(s)
        return s


def _double(actor, v):
    return actor.double.remote(v)


def test_util_is_an_attribute_of_the_package():
    assert ddlf.util.ActorPool is ActorPool
    assert ddlf.util.queue.Queue is Queue


def test_map_keeps_order_and_map_unordered_yields_as_ready(cluster):
    pool = ActorPool([Worker.remote(), Worker.remote()])
    assert list(pool.map(_double, [0, 1, 2, 3])) == [0, 2, 4, 6]
    unordered = list(pool.map_unordered(_double, [0, 1, 2, 3]))
    assert sorted(unordered) == [0, 2, 4, 6]
    assert unordered[-1] == 0   # the slow value came back last


def test_submit_queues_when_all_actors_are_busy(cluster):
    a = Worker.remote()
    pool = ActorPool([a])
    pool.submit(_double, 1)
    assert not pool.has_free()
    pool.submit(_double, 2)          # waits for the one actor
    assert pool.has_next()
    assert pool.get_next() == 2
    assert pool.get_next() == 4
    assert not pool.has_next()
    with pytest.raises(StopIteration):
        pool.get_next()
    assert pool.has_free()


def test_get_next_timeout_raises_timeout_error(cluster):
    pool = ActorPool([Worker.remote()])
    pool.submit(lambda a, s: a.sleep.remote(s), 2.0)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.1)
    assert pool.has_next()           # a plain timeout keeps the result for later
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.1)
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next()       # ignored for good; the actor is back in the pool
    assert pool.has_free()


def test_get_next_after_get_next_unordered_is_refused(cluster):
    pool = ActorPool([Worker.remote() for _ in range(3)])
    sleep = lambda a, s: a.sleep.remote(s)  # noqa: E731
    for s in (1.0, 1.0, 0.0):
        pool.submit(sleep, s)
    assert pool.get_next_unordered(timeout=30) == 0.0   # the last one submitted
    with pytest.raises(ValueError, match="get_next_unordered"):
        pool.get_next()
    assert sorted([pool.get_next_unordered(), pool.get_next_unordered()]) == [1.0, 1.0]


def test_pop_idle_and_push(cluster):
    a, b = Worker.remote(), Worker.remote()
    pool = ActorPool([a])
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(a)
    pool.push(b)
    popped = pool.pop_idle()
    assert popped in (a, b)
    assert pool.pop_idle() in (a, b) and pool.pop_idle() is None
    assert not pool.has_free()


def test_a_dead_actor_leaves_the_pool(cluster):
    a = Worker.remote()
    pool = ActorPool([a])
    ddlf.get(a.double.remote(1), timeout=30)
    ddlf.kill(a)
    pool.submit(_double, 1)
    with pytest.raises(ActorDiedError):
        pool.get_next(timeout=30)
    assert not pool.has_free()


def test_queue_put_get_and_sizes(cluster):
    q = Queue(maxsize=2)
    assert q.empty() and not q.full() and q.size() == 0
    q.put(1)
    q.put_nowait(2)
    assert q.full() and q.qsize() == 2 and len(q) == 2
    with pytest.raises(Full):
        q.put_nowait(3)
    with pytest.raises(Full):
        q.put(3, block=False)
    t0 = time.monotonic()
    with pytest.raises(Full):
        q.put(3, timeout=0.3)
    assert time.monotonic() - t0 >= 0.25
    assert q.get() == 1 and q.get_nowait() == 2
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(timeout=0.2)
    with pytest.raises(ValueError):
        q.get(timeout=-1)
    q.shutdown()


def test_queue_batches_are_all_or_nothing(cluster):
    q = Queue(maxsize=3)
    q.put_nowait_batch([1, 2])
    with pytest.raises(Full):
        q.put_nowait_batch([3, 4])
    assert q.qsize() == 2
    with pytest.raises(Empty):
        q.get_nowait_batch(3)
    assert q.get_nowait_batch(2) == [1, 2]
    q.shutdown()


@ddlf.remote
def _consume(queue, n):
    return [queue.get(timeout=30) for _ in range(n)]


def test_queue_is_shared_with_tasks_and_a_blocked_get_wakes(cluster):
    q = Queue()
    ref = _consume.remote(q, 3)      # blocks in the task until the items arrive
    time.sleep(0.5)
    for i in range(3):
        q.put(i)
    assert ddlf.get(ref, timeout=60) == [0, 1, 2]
    q.shutdown()
    with pytest.raises(Exception):  # noqa: B017 - any error: the queue actor is gone
        q.put_nowait(1)
