"""What forwarding worker output costs a node: its CPU with N idle actors, then while one
of them prints 100 lines a second.

    python benchmarks/runtime/node_logs.py [--actors 200] [--seconds 20] 2>/dev/null

Run it on two checkouts (PYTHONPATH=<checkout>) to compare them: the node's log tailer
polled every worker's two files (backing off to 0.4 s while all were quiet); it now
sleeps on inotify until a worker writes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import psutil  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ddlf_actors as ddlf  # noqa: E402


@ddlf.remote(num_cpus=0)
class Tiny:
    def pid(self):
        return os.getpid()

    def talk(self, seconds: float) -> int:
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            print(f"line {n}", file=sys.stderr, flush=True)   # the driver's stderr, not the table's
            n += 1
            time.sleep(0.01)
        return n


def _cpu_percent(proc: psutil.Process, run) -> tuple[float, object]:
    t0, w0 = sum(proc.cpu_times()[:2]), time.monotonic()
    out = run()
    t1, w1 = sum(proc.cpu_times()[:2]), time.monotonic()
    return 100 * (t1 - t0) / (w1 - w0), out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--actors", type=int, default=200)
    p.add_argument("--seconds", type=float, default=20.0)
    a = p.parse_args()
    ddlf.init(num_cpus=1)
    try:
        actors = [Tiny.remote() for _ in range(a.actors)]
        ddlf.get([x.pid.remote() for x in actors], timeout=300)
        node = psutil.Process(ddlf.nodes()[0]["pid"])
        time.sleep(3)   # let start-up settle
        idle, _ = _cpu_percent(node, lambda: time.sleep(a.seconds))
        busy, lines = _cpu_percent(
            node, lambda: ddlf.get(actors[0].talk.remote(a.seconds), timeout=a.seconds + 60))
        fds = node.num_fds()
    finally:
        ddlf.shutdown()
    print(f"{'node CPU':<40} | {'':>8}")
    print(f"{f'{a.actors} idle actors, {a.seconds:g} s':<40} | {idle:7.2f}%")
    print(f"{f'one of them printing ({lines} lines)':<40} | {busy:7.2f}%")
    print(f"{'node descriptors':<40} | {fds:>8}")


if __name__ == "__main__":
    main()
