"""The emulation harness: hosts in network namespaces, links limited with ``tc ... tbf``,
trainer nodes capped in CPU, a DDLF cluster across them, and a teardown that leaves
nothing behind. ``cluster_emu.py`` (its modes), ``lm_emu.py`` (a GPT) and ``link_hosts.py``
(``torch_compare.py --link``) build on it; ``emu_streaming.py`` runs in its driver.

    results = run(plan, driver_script)   # build, run the driver, tear down; its RESULTs

The hosts come from ``tests/netns_cluster.py`` (``NetnsHosts``: one namespace per host,
each joined to one bridge by a veth pair, ``shape`` puts a token-bucket qdisc on both
ends of every veth); the caps from ``cpu_caps.py`` (``CpuGroups``). Host 0 runs the head,
hosts 1..K a 1-CPU node each, host K+1 the driver: ``driver_script _driver ADDRESS PLAN``,
which talks to the parent on its stdin and stdout (``RATE``, ``SNAP``, ``CAP``,
``RESULT`` lines; see :func:`run`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _p in (os.path.join(ROOT, "tests"), ROOT):   # netns_cluster; benchmarks.* from the checkout
    if _p not in sys.path:
        sys.path.insert(0, _p)

__all__ = ["BURST", "Parent", "run", "start_cluster", "snapshot", "cpu_between", "teardown",
           "leftovers", "model_fn", "load_results", "log"]

# tbf's bucket must hold the largest GSO packet a veth hands it (up to 64 KB), and enough
# for the rate at the kernel's timer granularity.
BURST = {"1gbit": "1mb", "100mbit": "256kb"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the parent (root namespace): hosts, links, CPU caps, processes -----------------------------

class Parent:
    """What a handler of the driver's requests (``run``'s ``handlers``) can reach: the
    hosts, the run's cgroups (None uncapped), the node groups, the head's and the
    driver's processes, the environment every process gets, the plan, the results so
    far and :meth:`keep` to add one."""

    def __init__(self, plan: dict, hosts, groups, ctl, nodes: list, env: dict):
        self.plan, self.hosts, self.groups, self.ctl = plan, hosts, groups, ctl
        self.nodes, self.env = nodes, env
        self.head = None
        self.driver = None
        self.results: list = []
        self.snaps: dict = {}

    def groups_v2(self) -> bool:
        """The caps are cgroup v2's (whose CPU counts include processes that ended)."""
        return bool(self.groups is not None and self.groups.v2)

    def snapshot(self) -> dict:
        return snapshot(self.nodes, self.ctl, {"head": self.head, "driver": self.driver})

    def keep(self, r: dict) -> None:
        """A finished run: into the results, and at once into ``plan["partial"]`` when set
        (a grid of hours cut short, by a deadline or Ctrl-C, keeps its finished runs, one
        JSON per line)."""
        self.results.append(r)
        if self.plan.get("partial"):
            with open(self.plan["partial"], "a") as f:
                f.write(json.dumps(r) + "\n")


def run(plan: dict, driver_script: str, handlers: dict | None = None) -> list:
    """Build the hosts (and the nodes' cgroups), run ``driver_script _driver ADDRESS PLAN``
    in the driver's host, shape the links and read the caps when it asks; return the
    driver's results. Everything is torn down however this ends (see :func:`teardown`).

    The driver asks on its stdout and waits for ``OK`` on its stdin: ``RATE r`` (shape
    every link to r), ``SNAP name`` (record the nodes', the head's and the driver's CPU
    seconds), ``CAP none|on`` (lift or restore the caps); ``RESULT json`` is a finished
    run (kept at once, see :meth:`Parent.keep`; one naming ``"run_id"`` gets ``"cpu"``,
    what every process took between its ``SNAP run_id:start`` and ``:end``). A line
    ``KIND body`` whose KIND is in ``handlers`` is answered with ``handlers[KIND](body,
    parent)`` (a :class:`Parent`); any other line is logged."""
    from netns_cluster import NetnsHosts

    from benchmarks.emulation.cpu_caps import CpuGroups
    from ddlf_actors.runtime.wire.auth import generate_token

    k = plan["k"]
    # DDLF_SHM=0: the namespaces share one /dev/shm and one boot id, so DDLF would take
    # them for one host and pass every object of 1 MiB or more through shared memory,
    # past the shaped links. Without it, every byte between hosts crosses a veth.
    env = {"DDLF_AUTH_TOKEN": generate_token(), "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2", "DDLF_SHM": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.path.join(ROOT, "tests"),
                                                     os.environ.get("PYTHONPATH")) if p)}
    hosts = NetnsHosts(k + 2)
    groups = None
    try:
        ctl, nodes = None, [None] * k
        if plan["node_cpus"] is not None:
            groups = CpuGroups(f"ddlf-emu-{os.getpid()}", weight=plan["priority"])
            ctl = groups.child("ctl", None)   # head and driver: uncapped
            nodes = [groups.child(f"node{i}", plan["node_cpus"]) for i in range(1, k + 1)]
        parent = Parent(plan, hosts, groups, ctl, nodes, env)
        log(f"emu: namespaces {' '.join(hosts.ns)}, bridge {hosts.bridge}, cgroups "
            f"{groups.run.path if groups else 'none'}")
        hosts.up()
        info = start_cluster(hosts, env, ctl, nodes)
        parent.head = hosts.procs[0]
        log(f"emu: up, {k} node(s) at {plan['node_cpus'] or 'uncapped'} CPU each")
        driver = subprocess.Popen(
            [*(ctl.prefix() if ctl else []), *hosts.prefix(k + 1), sys.executable,
             driver_script, "_driver", info["address"], json.dumps(plan)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
        hosts.procs.append(driver)
        parent.driver = driver
        snaps = parent.snaps

        def reply(text: str) -> None:
            driver.stdin.write(text + "\n")
            driver.stdin.flush()

        for line in driver.stdout:
            kind, _, body = line.rstrip("\n").partition(" ")
            if kind == "RATE":
                hosts.shape(body, BURST.get(body, "1mb"))
                log(f"links: {body} each way on all {k + 2} hosts")
                reply("OK")
            elif kind == "SNAP":   # each node's (and the head's, the driver's) CPU seconds now
                snaps[body] = parent.snapshot()
                reply("OK")
            elif kind == "CAP":    # caps mode: lift ("none") or restore the caps
                for g in nodes:
                    if g is not None:
                        g.limit(None if body == "none" else plan["node_cpus"])
                reply("OK")
            elif kind == "RESULT":
                r = json.loads(body)
                if plan["mode"] == "caps":
                    r["snaps"] = snaps
                    r["groups"] = [None if g is None else g.pids() for g in nodes]
                elif r.get("run_id") and f"{r['run_id']}:end" in snaps:
                    r["cpu"] = cpu_between(snaps.pop(f"{r['run_id']}:start"),
                                           snaps.pop(f"{r['run_id']}:end"))
                parent.keep(r)
                if "column" in r:
                    log(f"  {r.get('rate') or '-':>8} K={r['k']} {r['column']:<14} seed "
                        f"{r['seed']}: {r.get('status')}, {r.get('total_s', 0):.1f} s")
                elif plan["mode"] != "caps":
                    log(f"  {r['rate']:>8} {r['codec']:<10} done in {r['total_s']:.1f} s")
            elif handlers and kind in handlers:
                reply(handlers[kind](body, parent))
            else:
                log(f"driver: {line.rstrip()}")
        code = driver.wait()
        if code != 0:
            raise RuntimeError(f"the driver exited with status {code} (its errors are above)")
        return parent.results
    finally:
        teardown(hosts, groups)


def start_cluster(hosts, env: dict, ctl, nodes: list) -> dict:
    """The head in host 0 (in the ``ctl`` group) and a 1-CPU node in hosts 1..K, each
    started inside its own group (``nodes[i]``, or none); returns the head's info. The
    processes are in ``hosts.procs``, so ``hosts.down()`` stops them."""
    from ddlf_actors.runtime.process import start_child

    proc, info = start_child(
        ["ddlf_actors.runtime.head", "--host", hosts.ips[0], "--port", "0",
         "--stdin-lifeline"], "head", prefix=[*(ctl.prefix() if ctl else []), *hosts.prefix(0)],
        env=env, new_session=False)
    hosts.procs.append(proc)
    for i, group in enumerate(nodes, start=1):
        node, _ = start_child(
            ["ddlf_actors.runtime.node", "--address", info["address"], "--host", hosts.ips[i],
             "--num-cpus", "1", "--stdin-lifeline"], "node",
            prefix=[*(group.prefix() if group else []), *hosts.prefix(i)], env=env,
            new_session=False)
        hosts.procs.append(node)
    return info


def _proc_cpu(proc) -> float | None:
    """CPU seconds of a process and of its children it has waited for; None once gone."""
    import psutil

    try:
        t = psutil.Process(proc.pid).cpu_times()
    except (psutil.Error, AttributeError):
        return None
    return t.user + t.system + t.children_user + t.children_system


def snapshot(nodes: list, ctl=None, procs: dict | None = None) -> dict:
    """Each node group's CPU seconds and throttle counts, the uncapped group's (head and
    driver) and each process of ``procs`` (name -> Popen), with the time."""
    return {"t": time.monotonic(),
            "cpu_s": [None if g is None else g.usage() for g in nodes],
            "throttled": [None if g is None else g.throttled() for g in nodes],
            "ctl_cpu_s": None if ctl is None else ctl.usage(),
            "procs": {name: _proc_cpu(p) for name, p in (procs or {}).items()}}


def cpu_between(a: dict, b: dict) -> dict:
    """What each process took between two snapshots (:func:`snapshot`): wall seconds, CPU
    seconds of each node, of the head and the driver (and their group), and each node's
    share of cap periods throttled."""
    def diff(x, y):
        return None if x is None or y is None else y - x

    throttled = []
    for ta, tb in zip(a["throttled"], b["throttled"]):
        periods = None if ta is None or tb is None else tb[0] - ta[0]
        throttled.append(None if not periods else (tb[1] - ta[1]) / periods)
    return {"wall_s": b["t"] - a["t"],
            "nodes_cpu_s": [diff(x, y) for x, y in zip(a["cpu_s"], b["cpu_s"])],
            "ctl_cpu_s": diff(a.get("ctl_cpu_s"), b.get("ctl_cpu_s")),
            **{f"{name}_cpu_s": diff(a.get("procs", {}).get(name), v)
               for name, v in b.get("procs", {}).items()},
            "throttled": throttled}


def teardown(hosts, groups) -> list:
    """Stop the processes (by pid), delete the namespaces and the bridge, remove the
    cgroups (ending anything left in them); then check that nothing is left. Signals are
    ignored meanwhile, so a second Ctrl-C cannot cut the teardown short; every step is
    bounded. Returns what is left (also logged): empty when all went."""
    sigs = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        hosts.down()
        if groups is not None:
            groups.close()
        left = leftovers(hosts, groups)
        for item in left:
            log(f"emu: LEFT BEHIND: {item}")
        if not left:
            log("emu: torn down, nothing left (namespaces, bridge, cgroups, processes)")
        return left
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def leftovers(hosts, groups) -> list:
    """What this run created and is still there."""
    out = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    present = {line.split()[0] for line in names.splitlines() if line.strip()}
    out += [f"namespace {ns}" for ns in hosts.ns if ns in present]
    if subprocess.run(["ip", "link", "show", "dev", hosts.bridge],
                      capture_output=True).returncode == 0:
        out.append(f"bridge {hosts.bridge}")
    if groups is not None and os.path.exists(groups.run.path):
        out.append(f"cgroup {groups.run.path}")
    out += [f"process {p.pid}" for p in hosts.procs if p.poll() is None]
    return out


# -- what the driver and the tables share ------------------------------------------------------

def model_fn(spec: str):
    """``paper_cnn``, ``wide_cnn`` or ``wide_cnn:<f1>-<f2>-<dense>`` (apps/models.py), as a
    callable the trainers unpickle by reference."""
    import functools

    from ddlf_actors.apps import models

    name, _, arg = spec.partition(":")
    if name not in ("paper_cnn", "wide_cnn") or (arg and name != "wide_cnn"):
        raise SystemExit(f"--model {spec!r}: use paper_cnn, wide_cnn or "
                         "wide_cnn:<filters1>-<filters2>-<dense>")
    if not arg:
        return getattr(models, name)
    f1, f2, dense = (int(v) for v in arg.split("-"))
    return functools.partial(models.wide_cnn, filters=(f1, f2), dense=dense)


def load_results(path: str) -> list:
    """The runs of a ``--json`` file, or of the ``.partial.jsonl`` a run writes as it goes;
    either may be gzipped (``.gz``: how ``benchmarks/results/`` keeps them)."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        if path.removesuffix(".gz").endswith(".jsonl"):
            return [json.loads(line) for line in f if line.strip()]
        return json.load(f)["results"]
