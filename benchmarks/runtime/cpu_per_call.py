"""CPU time per operation, summed over every process of a local cluster (driver, head,
node, forkserver, workers): a measure that holds up on a busy machine, where the
throughputs of ``microbench.py`` swing by several times between runs.

    python benchmarks/runtime/cpu_per_call.py [--rounds 5]

Run it on two checkouts (``PYTHONPATH=<checkout>``), alternating, to compare them. Each
workload reports the lowest of ``--rounds`` measurements, in microseconds of CPU per call
(or per 100 MB transfer, in milliseconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import psutil  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ddlf_actors as ddlf  # noqa: E402


@ddlf.remote(num_cpus=0)
class Box:
    def small_value(self):
        return b"ok"

    def nbytes(self, arr):
        return int(arr.nbytes)

    def big(self, n):
        return np.ones(n, np.float32)


@ddlf.remote
def nothing():
    return None


def _cluster_cpu() -> float:
    """CPU seconds used so far by this process and every process of the local cluster.

    Summed over threads from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds) where
    Linux has it: ``cpu_times`` counts 10 ms ticks, too coarse for a few thousand calls
    spread over eight processes.
    """
    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            total += _schedstat(p.pid)
        except OSError:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def _schedstat(pid: int) -> float:
    ns = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass   # a thread that ended meanwhile
    return ns / 1e9


def _measure(fn, n: int) -> float:
    c0 = _cluster_cpu()
    fn(n)
    return (_cluster_cpu() - c0) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    ddlf.init(num_cpus=2)
    try:
        box = Box.remote()
        ddlf.get(box.small_value.remote(), timeout=60)
        ddlf.get([nothing.remote() for _ in range(20)], timeout=60)
        big = np.ones(25_000_000, np.float32)   # 100 MB

        def sync_calls(n):
            for _ in range(n):
                ddlf.get(box.small_value.remote())

        def async_calls(n):
            ddlf.get([box.small_value.remote() for _ in range(n)])

        def sync_tasks(n):
            for _ in range(n):
                ddlf.get(nothing.remote())

        def async_tasks(n):
            ddlf.get([nothing.remote() for _ in range(n)])

        def put_to_actor(n):
            for _ in range(n):
                ddlf.get(box.nbytes.remote(ddlf.put(big)))

        def actor_to_driver(n):
            for _ in range(n):
                ddlf.get(box.big.remote(big.size))

        work = [("1:1 actor calls sync", sync_calls, 3000, 1e6, "us/call"),
                ("1:1 actor calls async", async_calls, 10000, 1e6, "us/call"),
                ("tasks sync", sync_tasks, 1500, 1e6, "us/task"),
                ("tasks async", async_tasks, 4000, 1e6, "us/task"),
                ("100 MB driver put -> actor arg", put_to_actor, 6, 1e3, "ms/100 MB"),
                ("100 MB actor return -> driver get", actor_to_driver, 6, 1e3, "ms/100 MB")]
        best = {name: float("inf") for name, *_ in work}
        for _ in range(a.rounds):
            for name, fn, n, scale, _unit in work:
                best[name] = min(best[name], _measure(fn, n) * scale)
            time.sleep(0.2)
    finally:
        ddlf.shutdown()
    print(f"{'workload':36} | {'CPU, all processes':>20}")
    for name, _fn, _n, _scale, unit in work:
        print(f"{name:36} | {best[name]:10.1f} {unit:>9}")


if __name__ == "__main__":
    main()
