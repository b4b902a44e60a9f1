"""Remote functions: parallel fan-out, resource accounting, crashes and retries."""

from __future__ import annotations

import os
import time

import pytest
from helpers_modules.util import crash_once

import ddlf_actors as ddlf
from ddlf_actors.errors import UnschedulableError, WorkerCrashedError


@ddlf.remote
def double(x):
    return 2 * x


@ddlf.remote
def combine(a, b=0, *rest, scale=1, **kw):
    return (a + b + sum(rest)) * scale, sorted(kw)


@ddlf.remote
def whoami():
    return os.getpid()


@ddlf.remote
def interval(seconds):
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


@ddlf.remote
def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


@ddlf.remote
def crash():
    os._exit(1)


@ddlf.remote
async def async_task(x):
    import asyncio

    await asyncio.sleep(0.01)
    return x + 1


def _overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_fn_remote_returns_object_ref(cluster):
    ref = double.remote(21)
    assert isinstance(ref, ddlf.ObjectRef)
    assert ddlf.get(ref, timeout=20) == 42


def test_many_tasks_in_parallel(cluster):
    refs = [double.remote(i) for i in range(200)]
    assert ddlf.get(refs, timeout=60) == [2 * i for i in range(200)]


def test_tasks_args_and_kwargs(cluster):
    assert ddlf.get(combine.remote(1), timeout=20) == (1, [])
    assert ddlf.get(combine.remote(1, 2, 3, 4, scale=10, z=1, y=2), timeout=20) == (100, ["y", "z"])


def test_task_defined_inside_test_function(cluster):
    offset = 1000

    @ddlf.remote
    def local_fn(x):
        return x + offset

    assert ddlf.get([local_fn.remote(i) for i in range(10)], timeout=30) == [
        1000 + i for i in range(10)]


def test_lambda_as_remote_function(cluster):
    fn = ddlf.remote(lambda x, y: x * y)
    assert ddlf.get(fn.remote(6, 7), timeout=20) == 42


def test_async_remote_function(cluster):
    assert ddlf.get([async_task.remote(i) for i in range(5)], timeout=20) == [1, 2, 3, 4, 5]


def test_get_preserves_order_despite_completion_order(cluster):
    refs = [sleep_then.remote(0.3, "slow"), sleep_then.remote(0.0, "fast")]
    assert ddlf.get(refs, timeout=20) == ["slow", "fast"]


def test_tasks_run_in_worker_processes(cluster):
    pids = set(ddlf.get([whoami.remote() for _ in range(10)], timeout=30))
    assert os.getpid() not in pids


def test_two_cpu_tasks_do_not_overlap(cluster):
    two = interval.options(num_cpus=2)
    a, b = ddlf.get([two.remote(0.4), two.remote(0.4)], timeout=30)
    assert not _overlap(a, b), (a, b)


def test_two_cpu_task_excludes_one_cpu_task(cluster):
    # Different resource shapes use different worker leases: only the head's accounting
    # can keep them apart.
    big = interval.options(num_cpus=2).remote(0.5)
    small = interval.remote(0.5)
    other = interval.options(num_cpus=1.5).remote(0.5)
    a, b, c = ddlf.get([big, small, other], timeout=30)
    assert not _overlap(a, b), (a, b)
    assert not _overlap(a, c), (a, c)
    assert not _overlap(b, c), (b, c)  # 1 + 1.5 > 2


def test_options_do_not_change_the_original(cluster):
    bound = double.options(num_cpus=2)
    assert ddlf.get(bound.remote(1), timeout=20) == 2
    # The undecorated function still runs with its own (1-CPU) demand next to a 1-CPU task.
    assert ddlf.get([double.remote(2), double.remote(3)], timeout=20) == [4, 6]


def test_task_crash_raises_worker_crashed(cluster):
    t0 = time.monotonic()
    with pytest.raises(WorkerCrashedError):
        ddlf.get(crash.options(max_retries=0).remote(), timeout=20)
    assert time.monotonic() - t0 < 10
    # The cluster still runs tasks afterwards.
    assert ddlf.get(double.remote(5), timeout=20) == 10


def test_task_crash_with_retries_eventually_raises(cluster):
    with pytest.raises(WorkerCrashedError):
        ddlf.get(crash.options(max_retries=1).remote(), timeout=30)


def test_crashed_task_is_retried(cluster, tmp_path):
    marker = str(tmp_path / "crashed-once")
    assert ddlf.get(crash_once.options(max_retries=1).remote(marker), timeout=30) == "recovered"
    assert os.path.exists(marker)


def test_crash_does_not_fail_other_tasks_without_retries(cluster, tmp_path):
    good = [sleep_then.remote(0.05, i) for i in range(10)]
    bad = crash.options(max_retries=0).remote()
    assert ddlf.get(good, timeout=30) == list(range(10))
    with pytest.raises(WorkerCrashedError):
        ddlf.get(bad, timeout=20)


def test_unschedulable_task_fails_fast(cluster):
    t0 = time.monotonic()
    with pytest.raises(UnschedulableError):
        ddlf.get(double.options(num_cpus=64).remote(1), timeout=10)
    with pytest.raises(UnschedulableError):
        ddlf.get(double.options(resources={"GPU": 1}).remote(1), timeout=10)
    assert time.monotonic() - t0 < 5
    assert ddlf.get(double.remote(1), timeout=20) == 2
