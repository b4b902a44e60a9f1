"""Generator tasks and actor methods: streaming (``ObjectRefGenerator``), ``"dynamic"``,
and a generator with ``num_returns=k``."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import numpy as np
import pytest
from helpers_modules.clusters import start_cluster
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors import DynamicObjectRefGenerator, ObjectRefGenerator
from ddlf_actors.errors import ActorDiedError, TaskError, WorkerCrashedError

T = 30  # every wait in this file is bounded by this many seconds


@pytest.fixture(scope="module")
def gen_cluster():
    with start_cluster(num_cpus=2) as info:
        yield info


def _wait_file(path: str, timeout: float = T) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def _lines(path) -> int:
    try:
        with open(path) as f:
            return len(f.read().split())
    except FileNotFoundError:
        return 0


@ddlf.remote
def count(n):
    for i in range(n):
        yield i * 10


@ddlf.remote
def first_then_wait(go_file):
    """Yields 0, then waits for the caller's go-ahead: 1 can only come after 0 was seen."""
    yield 0
    _wait_file(go_file)
    yield 1


@ddlf.remote
def fails_at(n):
    yield from range(n)
    raise KeyError(f"failed after {n}")


@ddlf.remote(max_retries=0)
def dies_after(n):
    yield from range(n)
    time.sleep(0.2)   # let the yielded items leave before the process does
    os._exit(1)


@ddlf.remote(max_retries=2)
def dies_once_midway(marker):
    for i in range(5):
        if i == 3 and not os.path.exists(marker):
            with open(marker, "w"):
                pass
            time.sleep(0.2)
            os._exit(1)
        yield i


@ddlf.remote
def logged(n, log_path):
    for i in range(n):
        with open(log_path, "a") as f:
            f.write(f"{i}\n")
        yield i


@ddlf.remote
def big_items(n):
    for i in range(n):
        yield np.full(1 << 18, i, dtype=np.float64)   # 2 MB each: through shared memory


@ddlf.remote
def yields_refs(n):
    for i in range(n):
        yield ddlf.put(f"v{i}")


@ddlf.remote
def sum_dynamic(gen):
    assert isinstance(gen, DynamicObjectRefGenerator)
    return sum(ddlf.get(list(gen)))


@ddlf.remote
def plain():
    return 1


@ddlf.remote
class Streamer:
    def __init__(self):
        self.calls = 0

    def sync_gen(self, n):
        yield from range(n)

    async def async_gen(self, n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    def dies_after(self, n):
        yield from range(n)
        time.sleep(0.2)
        os._exit(1)

    def crash_first_run(self, marker):
        for i in range(4):
            if i == 2 and not os.path.exists(marker):
                with open(marker, "w"):
                    pass
                time.sleep(0.2)
                os._exit(1)
            yield i

    @ddlf.method(num_returns=2)
    def pair(self):
        yield "a"
        yield "b"

    @ddlf.method(num_returns="dynamic")
    def dyn(self, n):
        yield from range(n)

    def ping(self):
        return "pong"

    def crash_once(self, marker):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return "again"


# -- streaming tasks ----------------------------------------------------------------------------
def test_generator_task_returns_object_ref_generator(gen_cluster):
    gen = count.remote(4)
    assert isinstance(gen, ObjectRefGenerator)
    refs = list(gen)
    assert all(isinstance(r, ddlf.ObjectRef) for r in refs)
    assert ddlf.get(refs, timeout=T) == [0, 10, 20, 30]


def test_items_arrive_while_the_generator_still_runs(gen_cluster, tmp_path):
    go = str(tmp_path / "go")
    gen = first_then_wait.remote(go)
    # 1 cannot be yielded before the go file exists: 0 must have been streamed alone.
    assert ddlf.get(next(gen), timeout=T) == 0
    assert not gen.next_ready()
    open(go, "w").close()
    assert ddlf.get(next(gen), timeout=T) == 1
    with pytest.raises(StopIteration):
        next(gen)
    assert gen.is_finished()


def test_exception_surfaces_at_its_position_then_iteration_stops(gen_cluster):
    gen = fails_at.remote(2)
    assert ddlf.get(next(gen), timeout=T) == 0
    assert ddlf.get(next(gen), timeout=T) == 1
    with pytest.raises(KeyError, match="failed after 2") as info:
        ddlf.get(next(gen), timeout=T)
    assert isinstance(info.value, TaskError) and "fails_at" in info.value.remote_traceback
    with pytest.raises(StopIteration):
        next(gen)
    assert ddlf.get(gen.completed(), timeout=T) is None   # the error was delivered in-band


def test_async_iteration_and_anext(gen_cluster):
    async def main():
        got = [await ref async for ref in count.remote(3)]
        gen = count.remote(2)
        first = await gen.__anext__()
        second = await gen.__anext__()
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        return got, [await first, await second]

    assert asyncio.run(asyncio.wait_for(main(), T)) == ([0, 10, 20], [0, 10])


def test_wait_treats_a_generator_as_ready_when_next_would_not_block(gen_cluster, tmp_path):
    go = str(tmp_path / "go")
    gen = first_then_wait.remote(go)
    ready, _ = ddlf.wait([gen], timeout=T)
    assert ready == [gen]
    next(gen)
    ready, not_ready = ddlf.wait([gen], timeout=0.2)
    assert ready == [] and not_ready == [gen]
    open(go, "w").close()
    ready, _ = ddlf.wait([gen], timeout=T)
    assert ready == [gen]
    assert ddlf.get(next(gen), timeout=T) == 1
    ddlf.get(gen.completed(), timeout=T)
    ready, _ = ddlf.wait([gen], timeout=T)   # ended: ready, and next() stops at once
    assert ready == [gen]
    with pytest.raises(StopIteration):
        next(gen)


def test_large_items_and_items_holding_refs(gen_cluster):
    values = [ddlf.get(r, timeout=T) for r in big_items.remote(3)]
    assert [float(v[0]) for v in values] == [0.0, 1.0, 2.0]
    assert all(v.shape == (1 << 18,) and (v == v[0]).all() for v in values)
    inner = [ddlf.get(r, timeout=T) for r in yields_refs.remote(2)]
    assert all(isinstance(r, ddlf.ObjectRef) for r in inner)
    assert ddlf.get(inner, timeout=T) == ["v0", "v1"]


def test_streaming_on_a_plain_function_says_it_is_not_a_generator(gen_cluster):
    gen = plain.options(num_returns="streaming").remote()
    with pytest.raises(TypeError, match="not a generator"):
        ddlf.get(next(gen), timeout=T)


# -- dynamic and num_returns=k ------------------------------------------------------------------
def test_dynamic_returns_one_ref_to_all_refs(gen_cluster):
    ref = count.options(num_returns="dynamic").remote(3)
    assert isinstance(ref, ddlf.ObjectRef)
    dyn = ddlf.get(ref, timeout=T)
    assert isinstance(dyn, DynamicObjectRefGenerator) and len(dyn) == 3
    assert ddlf.get(list(dyn), timeout=T) == [0, 10, 20]
    # The ref, or the value itself, can be passed on; the refs travel with it.
    assert ddlf.get(sum_dynamic.remote(ref), timeout=T) == 30
    assert ddlf.get(sum_dynamic.remote(dyn), timeout=T) == 30


def test_dynamic_keeps_the_error_in_the_last_ref(gen_cluster):
    a, b, c = ddlf.get(fails_at.options(num_returns="dynamic").remote(2), timeout=T)
    assert ddlf.get([a, b], timeout=T) == [0, 1]
    with pytest.raises(KeyError):
        ddlf.get(c, timeout=T)


def test_generator_with_fixed_num_returns(gen_cluster):
    assert ddlf.get(count.options(num_returns=3).remote(3), timeout=T) == [0, 10, 20]
    r1, r2, r3, r4 = fails_at.options(num_returns=4).remote(2)
    assert ddlf.get([r1, r2], timeout=T) == [0, 1]
    for r in (r3, r4):
        with pytest.raises(KeyError):
            ddlf.get(r, timeout=T)
    # Raising after the k-th value (or yielding more) leaves the k returns standing, as in Ray.
    assert ddlf.get(fails_at.options(num_returns=2).remote(2), timeout=T) == [0, 1]
    assert ddlf.get(count.options(num_returns=2).remote(5), timeout=T) == [0, 10]
    short = count.options(num_returns=3).remote(2)
    with pytest.raises(ValueError, match="yielded 2 values"):
        ddlf.get(short[2], timeout=T)


# -- actors -------------------------------------------------------------------------------------
def test_actor_generator_methods_stream(gen_cluster):
    s = Streamer.remote()
    assert isinstance(s.sync_gen.remote(3), ObjectRefGenerator)
    assert [ddlf.get(r, timeout=T) for r in s.sync_gen.remote(3)] == [0, 1, 2]
    assert [ddlf.get(r, timeout=T) for r in s.async_gen.remote(3)] == [0, 1, 2]
    assert ddlf.get(s.pair.remote(), timeout=T) == ["a", "b"]
    assert ddlf.get(list(ddlf.get(s.dyn.remote(2), timeout=T)), timeout=T) == [0, 1]
    assert ddlf.get(s.sync_gen.options(num_returns=2).remote(2), timeout=T) == [0, 1]
    ddlf.kill(s)


def test_threaded_and_async_actors_stream_concurrently(gen_cluster):
    threaded = Streamer.options(max_concurrency=4).remote()
    gens = [threaded.sync_gen.remote(5) for _ in range(3)]
    assert [[ddlf.get(r, timeout=T) for r in g] for g in gens] == [list(range(5))] * 3
    asynchronous = Streamer.options(max_concurrency=4).remote()

    async def main():
        async def drain(g):
            return [await r async for r in g]
        return await asyncio.gather(*(drain(asynchronous.async_gen.remote(4)) for _ in range(3)))

    assert asyncio.run(asyncio.wait_for(main(), T)) == [list(range(4))] * 3
    ddlf.kill(threaded)
    ddlf.kill(asynchronous)


# -- backpressure -------------------------------------------------------------------------------
def test_backpressure_pauses_the_generator_until_the_caller_consumes(gen_cluster, tmp_path):
    log = str(tmp_path / "log")
    gen = logged.options(_generator_backpressure_num_objects=2).remote(10, log)
    assert wait_for(lambda: _lines(log) >= 2, timeout=T)
    time.sleep(0.5)   # it would have run to 10 by now without the bound
    assert _lines(log) == 2
    assert ddlf.get(next(gen), timeout=T) == 0
    assert wait_for(lambda: _lines(log) >= 3, timeout=T)
    time.sleep(0.3)
    assert _lines(log) == 3
    # Dropping the generator lifts the bound: the task runs to its end, as in Ray.
    del gen
    gc.collect()
    assert wait_for(lambda: _lines(log) == 10, timeout=T)


def test_backpressure_never_stalls_a_call_without_a_reader(gen_cluster, tmp_path):
    # "dynamic" has no reader to pace it: the option must not pause it forever.
    log = str(tmp_path / "log")
    ref = logged.options(num_returns="dynamic", _generator_backpressure_num_objects=1).remote(
        4, log)
    assert ddlf.get(list(ddlf.get(ref, timeout=T)), timeout=T) == [0, 1, 2, 3]
    # A dropped generator whose completed() ref is still held settles it at the end.
    gen = logged.options(_generator_backpressure_num_objects=1).remote(4, log)
    done = gen.completed()
    del gen
    gc.collect()
    assert ddlf.get(done, timeout=T) is None


def test_backpressure_on_actor_methods(gen_cluster, tmp_path):
    s = Streamer.remote()
    gen = s.async_gen.options(_generator_backpressure_num_objects=1).remote(5)
    assert [ddlf.get(r, timeout=T) for r in gen] == list(range(5))
    gen = s.sync_gen.options(_generator_backpressure_num_objects=1).remote(5)
    assert [ddlf.get(r, timeout=T) for r in gen] == list(range(5))
    ddlf.kill(s)


def test_backpressure_option_is_validated():
    with pytest.raises(ValueError, match="0 is not allowed"):
        count.options(_generator_backpressure_num_objects=0)
    with pytest.raises(ValueError, match="num_returns"):
        count.options(num_returns="sometimes")


# -- failures -----------------------------------------------------------------------------------
def test_worker_lost_mid_stream_fails_the_rest(gen_cluster):
    gen = dies_after.remote(2)
    assert ddlf.get(next(gen), timeout=T) == 0
    assert ddlf.get(next(gen), timeout=T) == 1
    with pytest.raises(WorkerCrashedError):
        ddlf.get(next(gen), timeout=T)
    with pytest.raises(StopIteration):
        next(gen)
    with pytest.raises(WorkerCrashedError):
        ddlf.get(gen.completed(), timeout=T)


def test_retried_task_replays_without_duplicates(gen_cluster, tmp_path):
    gen = dies_once_midway.remote(str(tmp_path / "crashed"))
    assert [ddlf.get(r, timeout=T) for r in gen] == [0, 1, 2, 3, 4]
    assert os.path.exists(tmp_path / "crashed")


def test_actor_lost_mid_stream_fails_the_rest(gen_cluster):
    s = Streamer.remote()
    gen = s.dies_after.remote(1)
    assert ddlf.get(next(gen), timeout=T) == 0
    with pytest.raises(ActorDiedError):
        ddlf.get(next(gen), timeout=T)
    with pytest.raises(StopIteration):
        next(gen)


def test_actor_restart_mid_stream_retries_the_call(gen_cluster, tmp_path):
    s = Streamer.options(max_restarts=1, max_task_retries=1).remote()
    gen = s.crash_first_run.remote(str(tmp_path / "crashed"))
    assert [ddlf.get(r, timeout=T) for r in gen] == [0, 1, 2, 3]
    assert ddlf.get(s.ping.remote(), timeout=T) == "pong"
    ddlf.kill(s)


def test_max_task_retries_of_one_retries_a_plain_call_once(gen_cluster, tmp_path):
    # Found with the test above: the lost call used to be failed and retried both.
    s = Streamer.options(max_restarts=1, max_task_retries=1).remote()
    assert ddlf.get(s.crash_once.remote(str(tmp_path / "crashed")), timeout=T) == "again"
    ddlf.kill(s)


def test_actor_restart_without_retries_fails_the_stream(gen_cluster, tmp_path):
    s = Streamer.options(max_restarts=1).remote()
    gen = s.crash_first_run.remote(str(tmp_path / "crashed"))
    got = []
    with pytest.raises(ActorDiedError):
        for r in gen:
            got.append(ddlf.get(r, timeout=T))
    assert got == [0, 1]
    assert ddlf.get(s.ping.remote(), timeout=T) == "pong"   # restarted, usable again
    ddlf.kill(s)


def test_object_ref_generator_cannot_travel(gen_cluster):
    gen = count.remote(1)
    with pytest.raises(TypeError, match="cannot be passed"):
        gen.__reduce__()
    list(gen)


# -- the Ray layer ------------------------------------------------------------------------------
def test_ray_layer_runs_generator_functions(gen_cluster):
    import ddlf_actors.compat.ray as ray
    from ddlf_actors.compat.ray import _raylet

    assert ray.ObjectRefGenerator is ObjectRefGenerator is _raylet.ObjectRefGenerator
    assert ray.DynamicObjectRefGenerator is DynamicObjectRefGenerator

    @ray.remote(_generator_backpressure_num_objects=1)
    def gen():
        yield 1
        yield 2

    @ray.remote
    class A:
        @ray.method(num_returns="dynamic")
        def dyn(self):
            yield "x"

    assert [ray.get(r, timeout=T) for r in gen.remote()] == [1, 2]
    a = A.remote()
    assert ray.get(list(ray.get(a.dyn.remote(), timeout=T)), timeout=T) == ["x"]
    ray.kill(a)
