"""Soak test: a stream of calls with known answers while actor workers and nodes are killed.

    python benchmarks/chaos/soak.py [--minutes 5] [--seed 1] [--actors 6] [--call-timeout 60]

Starts a cluster with the ``ddlf-node`` CLI in a private session folder
(``ddlf-node start --head`` gives the head and a first node, two ``ddlf-node start
--address`` add two more: 3 nodes), connects a driver and creates ``--actors`` actors
with a large ``max_restarts``. Then, for ``--minutes``:

* a stream of actor calls (``Calc(k).mul(x)`` must return ``k * x``: a restarted actor
  must have run ``__init__`` with the right argument) and tasks (``square(x)``), each
  with a known expected value, in batches; some calls sleep up to 50 ms first, so that
  kills find calls in flight;
* every ``--actor-kill-every`` seconds, SIGKILL to a random actor's worker process;
* every ``--node-kill-every`` seconds, SIGKILL to a random node daemon, and a new node
  joins with ``ddlf-node start --address``.

Every call must return the right value or raise a ``DDLFError`` within
``--call-timeout`` seconds; a ``GetTimeoutError`` there counts as a hang, anything that
is not a ``DDLFError`` as unexpected. The report gives calls made, wrong results, hangs,
errors by type, latencies, the faults injected, and descriptors and RSS of the head and
the nodes at the start and the end.

Why not ``max_restarts=-1``: the runtime treats -1 as 0 (see
tests/test_unlimited_restarts.py), so the actors get a large finite limit instead.

Only processes this run started are touched: the pids come from the session folder's
records (``ddlf-node`` writes one per process) and their descendants, and at the end
``ddlf-node stop`` runs for that folder, then anything still alive is killed by pid.
Exit status 0 when there were no wrong results, hangs, unexpected errors or leftovers.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run from a source checkout without installing
    sys.path.insert(0, _ROOT)

import ddlf_actors as ddlf  # noqa: E402
from ddlf_actors.errors import DDLFError, GetTimeoutError  # noqa: E402
from ddlf_actors.runtime import process_identity  # noqa: E402
from ddlf_actors.runtime.client import current  # noqa: E402
from ddlf_actors.runtime.wire.auth import read_token_file  # noqa: E402

CLI = [sys.executable, "-m", "ddlf_actors.runtime.cli"]
NODE_CPUS = 2
# Some calls take a while, so that a SIGKILL finds calls in flight, not only idle actors.
NAPS = (0.0, 0.0, 0.0, 0.01, 0.05)
# Large enough never to run out in a soak: -1 ("unlimited") does not work, see above.
MAX_RESTARTS = 1_000_000


@ddlf.remote(num_cpus=0)
class Calc:
    def __init__(self, k):
        self.k = k

    def mul(self, x, nap=0.0):
        time.sleep(nap)
        return self.k * x

    def pid(self):
        return os.getpid()


@ddlf.remote(num_cpus=1)
def square(x, nap=0.0):
    time.sleep(nap)
    return x * x


class Tracker:
    """Every process this run started: the session's records plus their descendants.

    Kept as (pid, start time) so that a reused pid is never mistaken for ours
    (``process_identity``: psutil's ``create_time()`` moves when the clock does).
    """

    def __init__(self, session: str):
        self.session = session
        self.seen: dict[int, float] = {}

    def records(self) -> list[dict]:
        out = []
        for path in glob.glob(os.path.join(self.session, "procs", "*.json")):
            with contextlib.suppress(OSError, ValueError), open(path) as f:
                out.append(json.load(f))
        return out

    def refresh(self) -> None:
        for rec in self.records():
            self._add_tree(rec["pid"])

    def _add_tree(self, pid: int) -> None:
        try:
            p = psutil.Process(pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.Error:
            return
        for q in procs:
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(q.pid, process_identity.start_time(q.pid))

    def ours(self, pid: int) -> bool:
        self.refresh()
        return process_identity.matches(pid, self.seen.get(pid))

    def alive(self) -> list[int]:
        return [pid for pid, started in self.seen.items()
                if process_identity.is_running(pid, started)]


def cli(*args, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def start_node(address: str) -> None:
    r = cli("start", "--address", address, "--num-cpus", str(NODE_CPUS))
    if r.returncode != 0:
        raise RuntimeError(f"ddlf-node start --address failed: {r.stderr.strip()[-500:]}")


def sample(pid: int) -> dict:
    try:
        p = psutil.Process(pid)
        return {"fds": p.num_fds(), "rss": p.memory_info().rss}
    except psutil.Error:
        return {}


def live_nodes() -> list[dict]:
    return [n for n in ddlf.nodes() if n["alive"]]


def wait_nodes(count: int, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = live_nodes()
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(0.2)


class Stats:
    def __init__(self):
        self.calls = collections.Counter()      # actor / task
        self.right = 0
        self.wrong: list[str] = []
        self.hangs: list[str] = []
        self.errors = collections.Counter()     # DDLFError subclass name -> count
        self.unexpected: list[str] = []         # not a DDLFError
        self.latency: list[float] = []
        self.faults = collections.Counter()


def run(a, tracker: Tracker, address: str) -> tuple[Stats, dict, dict]:
    rng = random.Random(a.seed)
    stats = Stats()
    actors = [(k, Calc.options(max_restarts=MAX_RESTARTS).remote(k)) for k in range(1, a.actors + 1)]
    for k, h in actors:
        assert ddlf.get(h.mul.remote(1), timeout=60) == k
    nodes = wait_nodes(3)
    head_pid = next(r["pid"] for r in tracker.records() if r["role"] == "head")
    tracker.refresh()
    before = {"head": sample(head_pid), **{f"node {n['pid']}": sample(n["pid"]) for n in nodes}}
    print(f"cluster at {address}: head pid {head_pid}, nodes "
          f"{[n['pid'] for n in nodes]}, {len(actors)} actors", file=sys.stderr, flush=True)

    start = time.monotonic()
    end = start + a.minutes * 60
    next_actor_kill = start + a.actor_kill_every
    next_node_kill = start + a.node_kill_every
    next_report = start + 30
    while time.monotonic() < end:
        # A batch: calls to every actor and a few tasks, each with its expected value.
        batch = []
        for k, h in actors:
            for _ in range(2):
                x = rng.randint(-10**6, 10**6)
                batch.append(("actor", h.mul.remote(x, rng.choice(NAPS)), k * x, time.monotonic()))
        for _ in range(4):
            x = rng.randint(-10**6, 10**6)
            batch.append(("task", square.remote(x, rng.choice(NAPS)), x * x, time.monotonic()))
        # Faults land while the batch is in flight.
        now = time.monotonic()
        if now >= next_actor_kill:
            next_actor_kill = now + a.actor_kill_every
            kill_actor_worker(rng, tracker, stats)
        if now >= next_node_kill:
            next_node_kill = now + a.node_kill_every
            kill_and_replace_node(rng, tracker, stats, address)
        for kind, ref, want, t0 in batch:
            stats.calls[kind] += 1
            try:
                got = ddlf.get(ref, timeout=max(0.1, t0 + a.call_timeout - time.monotonic()))
            except GetTimeoutError:
                stats.hangs.append(f"{kind} submitted at {t0 - start:.1f} s")
                continue
            except DDLFError as e:
                stats.errors[type(e).__name__] += 1
                continue
            except Exception as e:  # noqa: BLE001 - the point is to count what is not a DDLFError
                stats.unexpected.append(f"{kind}: {type(e).__name__}: {e}")
                continue
            stats.latency.append(time.monotonic() - t0)
            if got == want:
                stats.right += 1
            else:
                stats.wrong.append(f"{kind}: got {got!r}, want {want!r}")
        if time.monotonic() >= next_report:
            next_report += 30
            print(f"  {time.monotonic() - start:.0f} s: {sum(stats.calls.values()):,} calls, "
                  f"{len(stats.wrong)} wrong, {len(stats.hangs)} hangs, errors "
                  f"{dict(stats.errors)}, faults {dict(stats.faults)}", file=sys.stderr, flush=True)
        time.sleep(a.pause)
    nodes = live_nodes()
    tracker.refresh()
    after = {"head": sample(head_pid), **{f"node {n['pid']}": sample(n["pid"]) for n in nodes}}
    # The cluster still answers every actor once the faults stop.
    for k, h in actors:
        try:
            if ddlf.get(h.mul.remote(3), timeout=a.call_timeout) != 3 * k:
                stats.wrong.append(f"final check of actor {k}")
        except Exception as e:  # noqa: BLE001
            stats.unexpected.append(f"final check of actor {k}: {type(e).__name__}: {e}")
    return stats, before, after


def kill_actor_worker(rng, tracker: Tracker, stats: Stats) -> None:
    views = [v for v in current.get_core().head_call("list_actors")
             if v["state"] == "ALIVE" and v["pid"]]
    if not views:
        return
    v = rng.choice(views)
    if tracker.ours(v["pid"]):  # never signal a pid this run did not start
        with contextlib.suppress(ProcessLookupError):
            os.kill(v["pid"], signal.SIGKILL)
            stats.faults["actor workers SIGKILLed"] += 1


def kill_and_replace_node(rng, tracker: Tracker, stats: Stats, address: str) -> None:
    nodes = live_nodes()
    if not nodes:
        return
    n = rng.choice(nodes)
    if tracker.ours(n["pid"]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(n["pid"], signal.SIGKILL)
            stats.faults["nodes SIGKILLed"] += 1
    start_node(address)
    tracker.refresh()
    stats.faults["nodes started"] += 1


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(a, stats: Stats, before: dict, after: dict, leftovers: list, elapsed: float) -> str:
    total = sum(stats.calls.values())
    lines = [
        f"DDLF soak: {elapsed / 60:.1f} min, head + 3 nodes ({NODE_CPUS} CPUs each, via ddlf-node "
        f"start), {a.actors} actors (max_restarts={MAX_RESTARTS:,}), seed {a.seed}; "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "",
        f"{'calls made':<34} {total:>10,}  (actor calls {stats.calls['actor']:,}, "
        f"tasks {stats.calls['task']:,})",
        f"{'right results':<34} {stats.right:>10,}",
        f"{'wrong results':<34} {len(stats.wrong):>10,}",
        f"{'hangs (no answer in ' + f'{a.call_timeout:g} s)':<34} {len(stats.hangs):>10,}",
        f"{'errors that are not DDLFError':<34} {len(stats.unexpected):>10,}",
    ]
    for name, n in sorted(stats.errors.items()):
        lines.append(f"{'DDLFError: ' + name:<34} {n:>10,}")
    for name, n in sorted(stats.faults.items()):
        lines.append(f"{'faults: ' + name:<34} {n:>10,}")
    lines.append(f"{'latency of right results p50/p99/max':<34} "
                 f"{_pct(stats.latency, .5) * 1e3:.1f} / {_pct(stats.latency, .99) * 1e3:.1f} / "
                 f"{max(stats.latency, default=float('nan')) * 1e3:.0f} ms")
    lines.append(f"{'leftover processes after stop':<34} {len(leftovers):>10,}")
    lines += ["", f"{'process':<16} {'fds':>6} {'RSS MB':>8}   (start)"]
    for name, s in before.items():
        lines.append(f"{name:<16} {s.get('fds', '-'):>6} {s.get('rss', 0) / 2**20:>8.1f}")
    lines += [f"{'process':<16} {'fds':>6} {'RSS MB':>8}   (end)"]
    for name, s in after.items():
        lines.append(f"{name:<16} {s.get('fds', '-'):>6} {s.get('rss', 0) / 2**20:>8.1f}")
    for what, items in (("wrong", stats.wrong), ("hang", stats.hangs),
                        ("unexpected", stats.unexpected)):
        for item in items[:10]:
            lines.append(f"{what}: {item}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--actors", type=int, default=6)
    ap.add_argument("--actor-kill-every", type=float, default=3.0, help="seconds")
    ap.add_argument("--node-kill-every", type=float, default=60.0, help="seconds")
    ap.add_argument("--call-timeout", type=float, default=60.0,
                    help="seconds a call may take before it counts as a hang")
    ap.add_argument("--pause", type=float, default=0.01,
                    help="seconds between batches (keeps a shared machine usable)")
    a = ap.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = tempfile.mkdtemp(prefix="ddlf-soak-")
    session = os.path.join(tmp, "session")
    # The CLI, the cluster and this driver use this folder only: `ddlf-node stop` below
    # then stops this run's processes and nobody else's.
    os.environ["DDLF_TEMP_DIR"] = session
    os.environ.pop("DDLF_AUTH_TOKEN", None)
    tracker = Tracker(session)
    status = 1
    t0 = time.monotonic()
    try:
        r = cli("start", "--head", "--port", "0", "--num-cpus", str(NODE_CPUS))
        if r.returncode != 0:
            raise RuntimeError(f"ddlf-node start --head failed: {r.stderr.strip()[-500:]}")
        address = re.search(r"DDLF head started at (\S+)", r.stdout).group(1)
        token_file = re.search(r"token file: (\S+)", r.stdout).group(1)
        for _ in range(2):
            start_node(address)
        tracker.refresh()
        ddlf.init(address=address, token=read_token_file(token_file))
        stats, before, after = run(a, tracker, address)
        elapsed = time.monotonic() - t0
    finally:
        with contextlib.suppress(Exception):
            ddlf.shutdown()
        tracker.refresh()
        stopped = cli("stop")
        # Workers of killed nodes exit on their own (they watch their node's pid); give
        # them and the stopped processes time, then end by pid whatever is left.
        deadline = time.monotonic() + 20
        while tracker.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        leftovers = tracker.alive()
        for pid in leftovers:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        if leftovers:
            print(f"killed {len(leftovers)} leftover process(es): {leftovers}; "
                  f"ddlf-node stop said: {stopped.stdout.strip()}", file=sys.stderr)
    print()
    print(report(a, stats, before, after, leftovers, elapsed))
    print(f"processes started and tracked: {len(tracker.seen)}")
    ok = not (stats.wrong or stats.hangs or stats.unexpected or leftovers)
    status = 0 if ok else 1
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"session folder (logs) kept in {session}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
