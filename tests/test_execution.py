"""User code runs off the worker's event loop, so long calls never block its I/O.

Each test uses a ``get``/``wait`` timeout well below the slow call's duration: had the
slow call held the loop (or the only lease), the fast result could not arrive in time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import ddlf_actors as ddlf

SLOW_S = 6.0


@ddlf.remote
class Mixed:
    def fast(self):
        return "fast"

    def slow(self, seconds=SLOW_S):
        time.sleep(seconds)
        return time.time()

    def stamp(self):
        return time.time()

    async def status(self):
        return "alive"


@ddlf.remote
def slow_task(seconds=SLOW_S):
    time.sleep(seconds)
    return "slow"


@ddlf.remote
def fast_task():
    return "fast"


def test_a_result_is_not_held_behind_the_next_call(cluster):
    a = Mixed.remote()
    ddlf.get(a.fast.remote())  # the actor is up
    fast = a.fast.remote()
    slow = a.slow.remote()
    assert ddlf.get(fast, timeout=2.5) == "fast"
    ddlf.get(slow, timeout=SLOW_S + 10)


def test_async_method_answers_while_a_sync_call_runs(cluster):
    a = Mixed.remote()
    ddlf.get(a.fast.remote())
    slow = a.slow.remote()
    time.sleep(0.3)  # let the slow call start
    assert ddlf.get(a.status.remote(), timeout=2.5) == "alive"
    ddlf.get(slow, timeout=SLOW_S + 10)


def test_calls_from_one_caller_still_run_in_order(cluster):
    a = Mixed.remote()
    slow = a.slow.remote(1.0)
    after = a.stamp.remote()
    assert ddlf.get(after, timeout=10) >= ddlf.get(slow)


@ddlf.remote
class Sink:
    def __init__(self):
        self.seen = []

    def put(self, i):
        self.seen.append(i)

    def seen_list(self):
        return self.seen


def test_many_pipelined_calls_keep_submission_order(cluster):
    s = Sink.remote()
    refs = [s.put.remote(i) for i in range(2000)]
    ddlf.get(refs, timeout=60)
    assert ddlf.get(s.seen_list.remote()) == list(range(2000))


def test_a_fast_task_does_not_queue_behind_a_slow_one(cluster):
    ddlf.get(fast_task.remote(), timeout=30)  # a lease exists and is idle
    slow = slow_task.remote()
    fast = fast_task.remote()
    assert ddlf.get(fast, timeout=2.5) == "fast"
    ddlf.get(slow, timeout=SLOW_S + 10)


def test_wait_returns_the_fast_ref_first(cluster):
    slow = slow_task.remote()
    fast = fast_task.remote()
    ready, not_ready = ddlf.wait([slow, fast], num_returns=1, timeout=SLOW_S - 2)
    assert ready == [fast] and not_ready == [slow]
    ddlf.get(slow, timeout=SLOW_S + 10)


def test_tasks_still_pipeline_when_every_cpu_is_busy(cluster):
    # 2 CPUs, 40 short tasks: all complete, and with only 2 leases, more than 2 tasks were
    # in flight per lease at some point (the queue drained without 40 lease requests).
    refs = [fast_task.remote() for _ in range(40)]
    assert ddlf.get(refs, timeout=60) == ["fast"] * 40


LONG_S = 7.0  # longer than the 5 s handshake deadline


def test_a_second_driver_connects_during_a_long_sync_call(cluster):
    a = Mixed.options(name="busy").remote()
    ddlf.get(a.fast.remote())
    slow = a.slow.remote(LONG_S)
    time.sleep(0.5)
    script = textwrap.dedent(f"""
        import time, ddlf_actors as ddlf
        ddlf.init(address={cluster.address!r}, token={cluster.token!r})
        h = ddlf.get_actor("busy")
        print("STATUS", ddlf.get(h.status.remote(), timeout=3), flush=True)
        t = ddlf.get(h.stamp.remote(), timeout=30)
        print("STAMP", t, time.time(), flush=True)
        ddlf.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "STATUS alive" in out.stdout  # authenticated and answered mid-call
    slow_end = ddlf.get(slow, timeout=30)
    stamp_line = [ln for ln in out.stdout.splitlines() if ln.startswith("STAMP")][0]
    ran_at, received_at = map(float, stamp_line.split()[1:])
    assert ran_at >= slow_end           # queued behind the long call, in order
    assert received_at - slow_end < 3.0  # and answered as soon as it ended
