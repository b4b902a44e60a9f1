"""How long a new actor takes to start and to run its first call, idle and under CPU load.

    python benchmarks/runtime/actor_start.py [--n 30] [--busy 2] [--only fresh|warm]

Ray's doc example ``actors.py`` creates an actor, calls it at once, sleeps 1 s and cancels
the call, expecting it to be running by then. This measures what that assumes, per actor:

* ``init``: from ``Actor.remote()`` until ``__init__`` starts in the actor's process;
* ``call``: from ``Actor.remote()`` until the first method (called right after) starts;
* ``get``:  from ``Actor.remote()`` until ``get`` of that call returns;
* and for ``fresh``, how long ``ddlf.init()`` itself took, and from calling it to the
  first call starting (what a script waits for in all).

To compare two versions of DDLF side by side, run this file once with each on
``PYTHONPATH`` (e.g. a ``git worktree`` of the older commit).

Two scenarios, each ``--n`` actors:

* ``fresh``: what the example does: ``ddlf.init()`` (a new embedded cluster), then the
  actor at once; the cluster is shut down after each actor;
* ``warm``: one cluster, one new actor after another (each killed after its call).

Each runs twice, side by side in the same invocation: on the machine as it is, then with
``--busy`` busy loops (``python -c 'while 1: pass'``, killed by pid at the end) competing
for the cores. The load average is printed beside every row. Times are wall-clock
(``time.time()`` in both processes: same host).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import ddlf_actors as ddlf  # noqa: E402


@ddlf.remote
class Probe:
    def __init__(self):
        self.init_at = time.time()

    def first(self):
        return self.init_at, time.time()


def _one(out: list, init_s: float = float("nan")) -> None:
    t0 = time.time()
    a = Probe.remote()
    ref = a.first.remote()
    init_at, call_at = ddlf.get(ref, timeout=120)
    out.append((init_at - t0, call_at - t0, time.time() - t0, init_s, init_s + call_at - t0))
    ddlf.kill(a)


def fresh(n: int) -> list:
    out: list = []
    for _ in range(n):
        t0 = time.time()
        ddlf.init(num_cpus=2)
        try:
            _one(out, time.time() - t0)
        finally:
            ddlf.shutdown()
    return out


def warm(n: int) -> list:
    out: list = []
    ddlf.init(num_cpus=2)
    try:
        _one(out)          # the first one is the fresh case: not counted here
        out.clear()
        for _ in range(n):
            _one(out)
            time.sleep(0.05)
    finally:
        ddlf.shutdown()
    return out


def _busy(k: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(k)]


def _stop(procs: list) -> None:
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def _q(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def row(scenario: str, load: str, busy: int, samples: list) -> str:
    cells = [f"{scenario:<6}", f"{busy:>4}", f"{load:>11}", f"{len(samples):>3}"]
    for i in range(5):
        xs = [s[i] * 1000 for s in samples]
        cells.append(f"{statistics.median(xs):7.0f} {_q(xs, 0.95):7.0f} {max(xs):7.0f}"
                     if xs and xs[0] == xs[0] else " " * 23)   # NaN: not measured here
    return " | ".join(cells)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=30, help="actors per scenario and load (>= 30)")
    p.add_argument("--busy", type=int, default=2, help="busy loops for the loaded runs")
    p.add_argument("--only", choices=["fresh", "warm"])
    a = p.parse_args(argv)
    scenarios = [("fresh", fresh), ("warm", warm)]
    if a.only:
        scenarios = [s for s in scenarios if s[0] == a.only]
    print(f"{os.cpu_count()} CPUs; ms from Actor.remote(): p50 p95 max", flush=True)
    print("scen.  | busy | load before-after | n | __init__ starts        | first call starts"
          "      | get returns            | ddlf.init() took       | init + first call",
          flush=True)
    for name, fn in scenarios:
        for busy in (0, a.busy):
            procs = _busy(busy)
            try:
                if busy:
                    time.sleep(3)   # let the loops take the cores
                before = _load()
                samples = fn(a.n)
                load = f"{before}-{_load()}"
            finally:
                _stop(procs)
            print(row(name, load, busy, samples), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
