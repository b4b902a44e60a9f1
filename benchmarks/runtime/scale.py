"""Scale on one machine: a head, N node daemons and M actors of ``num_cpus=0``.

    python benchmarks/runtime/scale.py                       # 50 nodes, 1,000 actors
    python benchmarks/runtime/scale.py --nodes 20 --actors 200

Reports, as a table:

* how long the N nodes take to come up and register;
* actor creations per second (from the first ``.remote()`` to every actor's first
  reply), overall and per batch, so a slowdown as the cluster fills shows up;
* the CPU time each kind of process spent per actor created (driver, head, node daemons,
  their forkservers, workers), and the creation rate that much CPU allows on this
  machine's cores if nothing else ran (a figure that other load on the machine does not
  change, unlike creations/s);
* the head's RSS, a node daemon's RSS (with its forkserver and idle workers), and the
  memory per actor (USS: the pages that process alone holds, and RSS);
* how long ``ddlf-node status`` and ``ddlf.nodes()`` take with everything up.

Every process it starts is its own child; it stops them all (by pid) at the end, also
on Ctrl-C or an error. Sized for a 2-core, 24 GiB machine: 1,000 actors take about
9 GB of memory in all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time

import psutil

import ddlf_actors as ddlf
from ddlf_actors.runtime.process import child_env as _child_env
from ddlf_actors.runtime.process import start_child as _start
from ddlf_actors.runtime.process import stop_children
from ddlf_actors.runtime.wire.auth import read_token_file


@ddlf.remote(num_cpus=0)
class Tiny:
    def ping(self):
        return os.getpid()


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _rss(procs) -> int:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def _uss(procs) -> list[int]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out.append(p.memory_full_info().uss)
    return out


def _cpu_s(p: psutil.Process) -> float:
    """CPU seconds ``p`` has used: exact (scheduler nanoseconds of each thread) on Linux,
    clock ticks elsewhere."""
    try:
        return sum(int(open(f"/proc/{p.pid}/task/{t}/schedstat").read().split()[0])
                   for t in os.listdir(f"/proc/{p.pid}/task")) / 1e9
    except (OSError, ValueError, IndexError):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            return t.user + t.system
    return 0.0


def _cpu_by_role(head_pid: int, node_pids: set) -> dict:
    """pid -> (role, CPU seconds) for the driver, the head, and every node's tree."""
    out = {os.getpid(): ("driver", _cpu_s(psutil.Process()))}
    with contextlib.suppress(psutil.Error):
        out[head_pid] = ("head", _cpu_s(psutil.Process(head_pid)))
    for pid in node_pids:
        for p in _tree(pid):
            with contextlib.suppress(psutil.Error):
                if p.pid == pid:
                    role = "node"
                elif p.ppid() == pid:
                    role = "forkserver" if "forkserver" in " ".join(p.cmdline()) else "node"
                else:
                    role = "worker"
                out[p.pid] = (role, _cpu_s(p))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--actors", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100, help="actors created per timed batch")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after this long")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    rows: list[tuple[str, str]] = []
    procs: list[subprocess.Popen] = []
    t_start = time.monotonic()
    try:
        head, info = _start(["ddlf_actors.runtime.head", "--port", "0", "--stdin-lifeline"],
                            "head", new_session=False)
        procs.append(head)
        address, token_file = info["address"], info["token_file"]
        t0 = time.monotonic()
        for i in range(a.nodes):
            node, _ = _start(["ddlf_actors.runtime.node", "--address", address,
                              "--token-file", token_file, "--num-cpus", "1",
                              "--stdin-lifeline"], "node", new_session=False)
            procs.append(node)
            print(f"node {i + 1}/{a.nodes} up", file=sys.stderr, end="\r")
        ddlf.init(address=address, token=read_token_file(token_file))
        while len([n for n in ddlf.nodes() if n.get("alive", True)]) < a.nodes:
            if time.monotonic() - t0 > a.timeout:
                raise TimeoutError("nodes did not all register")
            time.sleep(0.1)
        nodes_s = time.monotonic() - t0
        rows.append((f"{a.nodes} nodes up and registered", f"{nodes_s:.1f} s"))
        head_rss0 = _rss([psutil.Process(head.pid)])
        node_trees = [_tree(p.pid) for p in procs[1:]]
        node_rss = statistics.mean(_rss(t) for t in node_trees)
        rows.append(("head RSS, no actors", _mb(head_rss0)))
        rows.append(("node daemon + forkserver + idle workers, RSS", _mb(node_rss)))

        actors, pids, batch_rates = [], [], []
        cpu0 = _cpu_by_role(head.pid, {p.pid for p in procs[1:]})
        t1 = time.monotonic()
        while len(actors) < a.actors:
            n = min(a.batch, a.actors - len(actors))
            tb = time.monotonic()
            batch = [Tiny.remote() for _ in range(n)]
            pids += ddlf.get([h.ping.remote() for h in batch], timeout=a.timeout)
            batch_rates.append(n / (time.monotonic() - tb))
            actors += batch
            print(f"{len(actors)}/{a.actors} actors", file=sys.stderr, end="\r")
            if time.monotonic() - t_start > a.timeout:
                raise TimeoutError(f"only {len(actors)} actors after {a.timeout} s")
        create_s = time.monotonic() - t1
        cpu1 = _cpu_by_role(head.pid, {p.pid for p in procs[1:]})
        rows.append((f"{a.actors} actors created and answering", f"{create_s:.1f} s"))
        rows.append(("creations/s overall", f"{a.actors / create_s:.1f}"))
        rows.append(("creations/s per batch (first, slowest, last)",
                     f"{batch_rates[0]:.1f}, {min(batch_rates):.1f}, {batch_rates[-1]:.1f}"))
        spent: dict = {}
        for pid, (role, after) in cpu1.items():
            spent[role] = spent.get(role, 0.0) + after - cpu0.get(pid, (role, 0.0))[1]
        ms = {role: 1e3 * spent.get(role, 0.0) / a.actors
              for role in ("driver", "head", "node", "forkserver", "worker")}
        rows.append(("CPU per actor: driver, head (ms)", f"{ms['driver']:.1f}, {ms['head']:.1f}"))
        rows.append(("CPU per actor: node daemons, forkservers, workers (ms)",
                     f"{ms['node']:.1f}, {ms['forkserver']:.1f}, {ms['worker']:.1f}"))
        total_ms = sum(ms.values())
        rows.append(("CPU per actor, all processes (ms)", f"{total_ms:.1f}"))
        rows.append((f"creations/s that CPU allows on {os.cpu_count()} free cores",
                     f"{1e3 * (os.cpu_count() or 1) / total_ms:.0f}"))
        per_node = [n["num_actors"] for n in ddlf.nodes() if n["alive"]]
        rows.append(("actors per node (min, max)", f"{min(per_node)}, {max(per_node)}"))
        rows.append(("head RSS with every actor", _mb(_rss([psutil.Process(head.pid)]))))
        actor_procs = [psutil.Process(p) for p in set(pids)]
        uss = _uss(actor_procs)
        rows.append(("per actor: USS (median)", _mb(statistics.median(uss))))
        rows.append(("per actor: RSS (median)",
                     _mb(statistics.median(_rss([p]) for p in actor_procs))))
        every = [p for pr in procs for p in _tree(pr.pid)]
        rows.append(("all DDLF processes: count", f"{len(every)}"))
        rows.append(("all DDLF processes: USS sum", _mb(sum(_uss(every)))))

        ts = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "ddlf_actors.runtime.cli", "status",
                              "--address", address, "--token-file", token_file],
                             capture_output=True, text=True, timeout=60, env=_child_env())
        status_s = time.monotonic() - ts
        if out.returncode != 0:
            raise RuntimeError(f"ddlf-node status failed: {out.stderr.strip()}")
        rows.append(("`ddlf-node status` (a new process, all included)", f"{status_s:.2f} s"))
        ts = time.monotonic()
        ddlf.nodes()
        rows.append(("ddlf.nodes() from a connected driver", f"{(time.monotonic() - ts) * 1e3:.0f} ms"))
    finally:
        with contextlib.suppress(Exception):
            ddlf.shutdown()
        stop_children(procs, 30)

    width = max(len(r[0]) for r in rows)
    print(f"\nScale: {a.nodes} node daemons, {a.actors} actors (num_cpus=0), "
          f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB\n")
    print(f"| {'measure'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
