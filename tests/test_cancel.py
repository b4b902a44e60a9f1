"""``ddlf.cancel``: queued calls are dropped, running ones interrupted, as in Ray.

Tasks and methods here coordinate through marker files in ``tmp_path`` (workers run on
this host): "started" once running, "stopped" when the interrupt reached them, and a
"release" file that ends them normally. Every loop is bounded, so nothing outlives a test.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
from helpers_modules.clusters import start_cluster
from helpers_modules.util import wait_for, wait_gone

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError, TaskCancelledError, TaskError

LIMIT_S = 20.0   # no task here runs longer than this, whatever happens


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(num_cpus=2) as info:
        yield info


class Marks:
    def __init__(self, folder):
        self.started = str(folder / "started")
        self.release = str(folder / "release")
        self.stopped = str(folder / "stopped")
        self.done = str(folder / "done")

    def wait_started(self):
        assert wait_for(lambda: os.path.exists(self.started), 30), (
            f"the call never started; free: {ddlf.available_resources()}")

    def let_go(self):
        _touch(self.release)


def _touch(path, text=""):
    with open(path, "a") as f:
        f.write(text)


def _spin(m: Marks):
    """Run until released; note an interrupt (and let it through)."""
    _touch(m.started, f"{os.getpid()}\n")
    deadline = time.monotonic() + LIMIT_S
    try:
        while not os.path.exists(m.release) and time.monotonic() < deadline:
            time.sleep(0.02)
    except KeyboardInterrupt:
        _touch(m.stopped)
        raise
    _touch(m.done)
    return os.getpid()


@ddlf.remote
def spin(m):
    return _spin(m)


@ddlf.remote
def spin_and_catch(m):
    try:
        return _spin(m)
    except KeyboardInterrupt:
        return "caught"


@ddlf.remote
def record(path, *_deps):
    _touch(path, "ran\n")
    return "ran"


@ddlf.remote
def parent(m):
    return ddlf.get(spin.remote(m))


@ddlf.remote
async def async_sleeper(m):
    _touch(m.started)
    try:
        await asyncio.sleep(LIMIT_S)
    except asyncio.CancelledError:
        _touch(m.stopped)
        raise


@ddlf.remote
def pid():
    return os.getpid()


def _busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@ddlf.remote
def spin_briefly():
    time.sleep(0.3)


@ddlf.remote
def busy(i):
    _busy(random.uniform(0, 0.01))
    return i


@ddlf.remote
class Counter:
    def __init__(self):
        self.n = 0
        self.saw_cancel = None

    def block(self, m):
        return _spin(m)

    def incr(self, *_deps):
        self.n += 1
        return self.n

    def count(self):
        return self.n

    def until_canceled(self, m):
        _touch(m.started)
        deadline = time.monotonic() + LIMIT_S
        while time.monotonic() < deadline:
            if ddlf.get_runtime_context().is_canceled():
                self.saw_cancel = True
                return "noticed"
            time.sleep(0.02)
        return "timed out"

    def saw(self):
        return self.saw_cancel

    def busy(self, i):
        _busy(random.uniform(0, 0.005))
        return i

    async def sleeper(self, m):
        _touch(m.started)
        try:
            await asyncio.sleep(LIMIT_S)
        except asyncio.CancelledError:
            self.saw_cancel = "async"
            return "swallowed"   # Ray still reports the call as cancelled


# -- tasks ----------------------------------------------------------------------------------
def test_a_running_task_is_interrupted_and_its_worker_lives_on(cluster, tmp_path):
    m = Marks(tmp_path)
    ref = spin.remote(m)
    m.wait_started()
    ddlf.cancel(ref)
    with pytest.raises(TaskCancelledError) as info:
        ddlf.get(ref, timeout=15)
    # Settled by the worker, like Ray's RayTaskError(TaskCancelledError).
    assert isinstance(info.value, TaskError)
    assert os.path.exists(m.stopped)
    worker_pid = int(open(m.started).read())
    assert wait_gone([worker_pid], timeout=0.5) == {worker_pid}   # interrupted, not killed
    # No interrupt strays into the tasks that run next on that worker's thread.
    assert len(ddlf.get([pid.remote() for _ in range(20)], timeout=30)) == 20


def test_a_task_that_catches_the_interrupt_keeps_its_value(cluster, tmp_path):
    m = Marks(tmp_path)
    ref = spin_and_catch.remote(m)
    m.wait_started()
    ddlf.cancel(ref)
    assert ddlf.get(ref, timeout=15) == "caught"   # as in Ray


def test_a_queued_task_never_runs(cluster, tmp_path):
    m = Marks(tmp_path)
    marker = str(tmp_path / "ran")
    blocker = spin.options(num_cpus=2).remote(m)   # holds both CPUs
    m.wait_started()
    queued = record.options(num_cpus=2).remote(marker)
    ddlf.cancel(queued)
    with pytest.raises(TaskCancelledError):
        ddlf.get(queued, timeout=10)               # at once, while the blocker still runs
    assert not os.path.exists(m.done)
    m.let_go()
    ddlf.get(blocker, timeout=15)
    # Later tasks of the same shape run (and would have run the cancelled one first).
    assert ddlf.get(record.options(num_cpus=2).remote(str(tmp_path / "other")), timeout=15)
    assert not os.path.exists(marker)


def test_a_task_waiting_for_its_argument_is_dropped(cluster, tmp_path):
    m = Marks(tmp_path)
    marker = str(tmp_path / "ran")
    dep = spin.remote(m)
    m.wait_started()
    waiting = record.remote(marker, dep)
    ddlf.cancel(waiting)
    with pytest.raises(TaskCancelledError) as info:
        ddlf.get(waiting, timeout=10)
    assert not isinstance(info.value, TaskError)   # decided here: it never left
    m.let_go()
    ddlf.get(dep, timeout=15)
    assert ddlf.get(record.remote(str(tmp_path / "other"), dep), timeout=15) == "ran"
    assert not os.path.exists(marker)


def test_force_ends_the_worker_and_the_task_is_not_retried(cluster, tmp_path):
    m = Marks(tmp_path)
    ref = spin.options(max_retries=3).remote(m)
    m.wait_started()
    worker_pid = int(open(m.started).read())
    ddlf.cancel(ref, force=True)
    with pytest.raises(TaskCancelledError):
        ddlf.get(ref, timeout=15)
    assert not wait_gone([worker_pid])
    assert len(ddlf.get([pid.remote() for _ in range(4)], timeout=30)) == 4
    assert open(m.started).read().count("\n") == 1   # ran once: no retry


def test_cancelling_a_finished_task_changes_nothing(cluster):
    ref = pid.remote()
    value = ddlf.get(ref, timeout=15)
    ddlf.cancel(ref)
    ddlf.cancel(ref, force=True)
    assert ddlf.get(ref, timeout=5) == value


def test_recursive_cancel_reaches_the_tasks_it_submitted(cluster, tmp_path):
    m = Marks(tmp_path)
    ref = parent.remote(m)
    m.wait_started()
    ddlf.cancel(ref)                                # recursive=True by default
    with pytest.raises(TaskCancelledError):
        ddlf.get(ref, timeout=15)
    assert wait_for(lambda: os.path.exists(m.stopped), 15), "the child task ran on"


def test_non_recursive_cancel_leaves_the_child_running(cluster, tmp_path):
    m = Marks(tmp_path)
    ref = parent.remote(m)
    m.wait_started()
    ddlf.cancel(ref, recursive=False)
    with pytest.raises(TaskCancelledError):
        ddlf.get(ref, timeout=15)
    m.let_go()
    assert wait_for(lambda: os.path.exists(m.done), 15), "the child did not finish"
    assert not os.path.exists(m.stopped)


def test_an_async_task_is_cancelled(cluster, tmp_path):
    m = Marks(tmp_path)
    ref = async_sleeper.remote(m)
    m.wait_started()
    ddlf.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ddlf.get(ref, timeout=15)
    assert os.path.exists(m.stopped)


def test_cancels_racing_with_completion_settle_each_call_one_way(cluster):
    """Cancels land before, during and after short calls: each call gets its value or
    TaskCancelledError (only if cancelled), and the interrupts never hit another call."""
    a = Counter.remote()
    rng = random.Random(7)
    refs = [busy.remote(i) for i in range(150)] + [a.busy.remote(i) for i in range(150)]
    asked = set()
    for k, ref in enumerate(refs):
        if rng.random() < 0.4:
            time.sleep(rng.uniform(0, 0.003))
            ddlf.cancel(ref)
            asked.add(k)
    for k, ref in enumerate(refs):
        try:
            assert ddlf.get(ref, timeout=60) == k % 150
        except TaskCancelledError:
            assert k in asked, f"call {k} was never cancelled"
    assert ddlf.get([busy.remote(i) for i in range(30)], timeout=60) == list(range(30))
    assert ddlf.get([a.busy.remote(i) for i in range(30)], timeout=60) == list(range(30))
    ddlf.kill(a)


def test_a_lease_granted_after_the_queue_drained_is_given_back(cluster):
    """A burst asks for a second worker; when it arrives the burst is done. It must be
    returned when idle, or its CPU stays reserved (the queued-task test needs both)."""
    for _ in range(8):
        ddlf.get(spin_briefly.remote(), timeout=30)
        ddlf.get([pid.remote() for _ in range(20)], timeout=30)
        assert wait_for(lambda: ddlf.available_resources().get("CPU") == 2.0, 10), (
            f"a CPU stayed leased: {ddlf.available_resources()}")


# -- actor calls ------------------------------------------------------------------------------
def test_a_call_queued_at_the_actor_never_runs(cluster, tmp_path):
    m = Marks(tmp_path)
    a = Counter.remote()
    busy = a.block.remote(m)
    m.wait_started()
    queued = a.incr.remote()
    ddlf.cancel(queued)
    with pytest.raises(TaskCancelledError):
        ddlf.get(queued, timeout=10)    # at once, while block() still runs
    assert not os.path.exists(m.done)
    m.let_go()
    ddlf.get(busy, timeout=15)
    assert ddlf.get(a.count.remote(), timeout=15) == 0
    ddlf.kill(a)


def test_a_call_waiting_for_its_argument_is_dropped_and_the_next_runs(cluster, tmp_path):
    m = Marks(tmp_path)
    a = Counter.remote()
    dep = spin.remote(m)
    m.wait_started()
    waiting = a.incr.remote(dep)     # holds the caller's queue until dep is ready
    after = a.incr.remote()
    ddlf.cancel(waiting)
    with pytest.raises(TaskCancelledError):
        ddlf.get(waiting, timeout=10)
    assert ddlf.get(after, timeout=10) == 1   # while dep is still pending
    m.let_go()
    ddlf.get(dep, timeout=15)
    assert ddlf.get(a.count.remote(), timeout=15) == 1
    ddlf.kill(a)


def test_a_running_sync_method_sees_is_canceled(cluster, tmp_path):
    m = Marks(tmp_path)
    a = Counter.remote()
    ref = a.until_canceled.remote(m)
    m.wait_started()
    ddlf.cancel(ref)
    with pytest.raises(TaskCancelledError):   # whatever it returned, as in Ray
        ddlf.get(ref, timeout=15)
    assert ddlf.get(a.saw.remote(), timeout=15) is True
    ddlf.kill(a)


def test_an_async_method_is_cancelled_even_when_it_swallows_it(cluster, tmp_path):
    m = Marks(tmp_path)
    a = Counter.remote()
    ref = a.sleeper.remote(m)
    m.wait_started()
    ddlf.cancel(ref)
    with pytest.raises(TaskCancelledError) as info:
        ddlf.get(ref, timeout=15)
    assert isinstance(info.value, TaskError)   # Ray: RayTaskError(TaskCancelledError)
    assert ddlf.get(a.saw.remote(), timeout=15) == "async"
    ddlf.kill(a)


def test_force_on_an_actor_call_is_refused(cluster):
    a = Counter.remote()
    ref = a.count.remote()
    with pytest.raises(ValueError, match="ddlf.kill"):
        ddlf.cancel(ref, force=True)
    with pytest.raises(TypeError, match="ObjectRef"):
        ddlf.cancel(a)
    assert ddlf.get(ref, timeout=15) == 0
    ddlf.kill(a)


def test_a_cancelled_call_is_not_retried_when_its_actor_restarts(cluster, tmp_path):
    m = Marks(tmp_path)
    a = Counter.options(max_restarts=1, max_task_retries=-1).remote()
    ref = a.block.remote(m)
    m.wait_started()
    ddlf.cancel(ref)                          # a sync method runs on...
    ddlf.kill(a, no_restart=False)            # ...until its process dies
    with pytest.raises(TaskCancelledError):   # not retried, not ActorDiedError
        ddlf.get(ref, timeout=15)
    assert ddlf.get(a.count.remote(), timeout=30) == 0   # the restarted actor
    assert open(m.started).read().count("\n") == 1
    ddlf.kill(a)


def test_an_uncancelled_call_lost_with_its_actor_is_still_actor_died(cluster, tmp_path):
    m = Marks(tmp_path)
    a = Counter.remote()
    ref = a.block.remote(m)
    m.wait_started()
    ddlf.kill(a)
    with pytest.raises(ActorDiedError):
        ddlf.get(ref, timeout=15)


def test_ray_cancel_is_ddlfs(cluster, tmp_path):
    import ddlf_actors.compat.ray as ray

    assert ray.exceptions.TaskCancelledError is TaskCancelledError
    m = Marks(tmp_path)
    ref = spin.remote(m)
    m.wait_started()
    ray.cancel(ref)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=15)
