"""What the web dashboard costs the head: its CPU and RSS with the page open during a
1,000-actor run, against the same run with the dashboard off.

    python benchmarks/runtime/dashboard_cost.py                    # 1,000 actors on 4 nodes
    python benchmarks/runtime/dashboard_cost.py --actors 200 --seconds 10

Each mode starts its own head and ``--nodes`` node daemons, creates ``--actors`` actors of
``num_cpus=0`` in batches, then holds a steady window of ``--seconds`` in which the driver
calls 50 actors and publishes a training run's row five times a second (as a fast
training run does). With the dashboard on, a client polls it as the open page does: once
a second ``/api/snapshot`` and ``/api/runs/<id>?since=<seq>``, for the whole run. The
table gives the head's CPU seconds while creating and its CPU share in the steady
window (from its own process times, so other load on the machine does not count), its
RSS at the end, and what a poll costs.

Sized for a 2-core, 24 GiB machine: 1,000 actors take about 9 GB, one mode at a time.
Every process it starts is its own child; it stops them (by pid) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import psutil

import ddlf_actors as ddlf
from ddlf_actors.runtime.process import start_child, stop_children
from ddlf_actors.runtime.wire.auth import read_token_file
from ddlf_actors.util import dashboard


@ddlf.remote(num_cpus=0)
class Tiny:
    def ping(self):
        return os.getpid()


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Poller(threading.Thread):
    """What an open page does: one snapshot and one run poll a second."""

    def __init__(self, url: str, every_s: float = 1.0):
        super().__init__(daemon=True)
        self.url, self.every_s = url, every_s
        self.stop = threading.Event()
        self.times: list[float] = []
        self.sizes: list[int] = []
        self.seq = 0

    def _get(self, path: str) -> bytes:
        t = time.perf_counter()
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            body = r.read()
        self.times.append(time.perf_counter() - t)
        self.sizes.append(len(body))
        return body

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                runs = json.loads(self._get("/api/snapshot"))["runs"]
                if runs:
                    d = json.loads(self._get(f"/api/runs/{runs[0]['run_id']}?since={self.seq}"))
                    self.seq = d["seq"]
            except OSError as e:
                print(f"poll failed: {e}", file=sys.stderr)
            self.stop.wait(max(0.0, self.every_s - (time.monotonic() - t)))


def one_mode(a, with_dashboard: bool) -> dict:
    procs: list[subprocess.Popen] = []
    poller = None
    try:
        head_args = ["ddlf_actors.runtime.head", "--port", "0", "--stdin-lifeline"]
        if with_dashboard:
            head_args += ["--dashboard-port", str(_free_port()), "--dashboard-port-fallback"]
        head, info = start_child(head_args, "head", new_session=False)
        procs.append(head)
        hp = psutil.Process(head.pid)
        for _ in range(a.nodes):
            node, _ = start_child(["ddlf_actors.runtime.node", "--address", info["address"],
                                   "--token-file", info["token_file"], "--num-cpus", "1",
                                   "--stdin-lifeline"], "node", new_session=False)
            procs.append(node)
        ddlf.init(address=info["address"], token=read_token_file(info["token_file"]))
        while len(ddlf.nodes()) < a.nodes:
            time.sleep(0.1)
        if with_dashboard:
            poller = Poller(info["dashboard_url"])
            poller.start()
        run_id = "bench"
        dashboard.publish_run(run_id, info={"scheme": "sync", "workers": 4})

        cpu0, t0 = _cpu_s(hp), time.monotonic()
        actors: list = []
        while len(actors) < a.actors:
            batch = [Tiny.remote() for _ in range(min(100, a.actors - len(actors)))]
            ddlf.get([x.ping.remote() for x in batch], timeout=600)
            actors += batch
            print(f"{'on ' if with_dashboard else 'off'}: {len(actors)} actors",
                  file=sys.stderr, end="\r")
        create_cpu, create_s = _cpu_s(hp) - cpu0, time.monotonic() - t0

        cpu0, t0, row = _cpu_s(hp), time.monotonic(), 0
        rng = random.Random(0)
        while time.monotonic() - t0 < a.seconds:
            row += 1
            dashboard.publish_run(run_id, rows=[{"round": row, "epoch": row / 10,
                                                 "time_s": time.monotonic() - t0,
                                                 "test_accuracy": 0.5 + row / 1e4,
                                                 "test_loss": 1 / row, "bytes_sent": 1e6}])
            ddlf.get([x.ping.remote() for x in rng.sample(actors, min(50, len(actors)))])
            time.sleep(0.2)
        steady_s = time.monotonic() - t0
        steady_cpu = _cpu_s(hp) - cpu0
        rss = hp.memory_info().rss
        out = {"create_cpu": create_cpu, "create_s": create_s,
               "steady_pct": 100 * steady_cpu / steady_s, "rss": rss}
        if poller is not None:
            poller.stop.set()
            poller.join()
            out["poll_ms"] = 1000 * statistics.median(poller.times)
            out["poll_kb"] = statistics.median(poller.sizes) / 1e3
            out["polls"] = len(poller.times)
        return out
    finally:
        if poller is not None:
            poller.stop.set()
        ddlf.shutdown()
        stop_children(reversed(procs), 30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--actors", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0, help="steady window")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    off = one_mode(a, False)
    on = one_mode(a, True)
    print(file=sys.stderr)

    def ratio(k):
        return f"{on[k] / off[k]:.2f}" if off[k] else "-"

    print(f"Dashboard cost to the head: {a.actors:,} actors on {a.nodes} nodes, "
          f"steady window {a.seconds:g} s\n")
    print(f"| {'':44} | {'dashboard off':>14} | {'on, page open':>14} | {'on/off':>6} |")
    print(f"|{'-' * 46}|{'-' * 15}:|{'-' * 15}:|{'-' * 7}:|")
    print(f"| {f'head CPU s creating {a.actors:,} actors':44} | {off['create_cpu']:14.2f} | "
          f"{on['create_cpu']:14.2f} | {ratio('create_cpu'):>6} |")
    print(f"| {'creation wall time s':44} | {off['create_s']:14.1f} | {on['create_s']:14.1f} | "
          f"{ratio('create_s'):>6} |")
    print(f"| {'head CPU % in the steady window':44} | {off['steady_pct']:14.1f} | "
          f"{on['steady_pct']:14.1f} | {ratio('steady_pct'):>6} |")
    print(f"| {'head RSS MB at the end':44} | {off['rss'] / 1e6:14.1f} | {on['rss'] / 1e6:14.1f} | "
          f"{ratio('rss'):>6} |")
    print(f"\npolls: {on['polls']} requests, median answer {on['poll_ms']:.1f} ms, "
          f"median body {on['poll_kb']:.1f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
