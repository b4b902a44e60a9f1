"""Two emulated hosts for ``torch_compare.py --link``: network namespaces joined by
rate-limited veth links, each host capped at ``host_cpus`` CPUs (root only).

    hosts = LinkHosts("100mbit", host_cpus=1.0).up()   # namespaces, links, cgroups
    try:
        a = hosts.popen(0, [sys.executable, "script.py", ...])   # in host A
        b = hosts.popen(1, [...])                                 # in host B
        address = hosts.start_ddlf()                             # head + node in A, node in B
        ...
        hosts.end_run()     # every process of this run gone, hosts kept for the next run
    finally:
        hosts.close()       # harness.teardown: processes, namespaces, bridge, cgroups

It reuses the emulation harness: ``tests/netns_cluster.NetnsHosts`` for the namespaces,
the bridge and the ``tc ... tbf`` shaping, ``cpu_caps.CpuGroups`` for the caps, and
``harness.BURST`` and ``harness.teardown`` (``harness.py``) for the bounded, complete
teardown. Host i is namespace ``hosts.ns[i]`` at ``hosts.ips[i]``; its link
to the bridge is full duplex at the rate both ways, as a machine's link to its switch, so
traffic from A to B crosses A's uplink and B's downlink. There is no netem here: the
links add a rate and no delay.

Every process of a run is started in its host's cgroup (so the cap covers it and
everything it forks) and in a session of its own; :meth:`LinkHosts.end_run` closes the
DDLF processes' stdin lifelines, SIGTERMs then SIGKILLs the other sessions, and finally
empties the hosts' cgroups, so nothing of one run can slow the next. Every wait is
bounded.

The bookkeeping (link counters, bytes per step, the time a step's bytes need on the wire,
torchrun's per-node command) is in plain functions, tested without namespaces in
``tests/test_link_hosts.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for _p in (os.path.join(ROOT, "tests"), ROOT):   # netns_cluster; benchmarks.* from the checkout
    if _p not in sys.path:
        sys.path.insert(0, _p)

__all__ = ["LinkHosts", "LinkMeter", "RATES", "link_unavailable", "rate_bits",
           "torchrun_node_cmd", "link_figures", "wire_seconds", "counter_delta"]

#: The rates this mode offers, in bits per second (tc's units: 1 mbit = 10^6 bit).
RATES = {"100mbit": 100e6, "1gbit": 1e9}
#: The env var that names, inside a host, the interface whose counters a run reads.
LINK_IF_ENV = "TORCH_COMPARE_LINK_IF"
#: torchrun's static rendezvous port on host A (the namespace is ours: nothing else there).
MASTER_PORT = 29500


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rate_bits(rate: str) -> float:
    """Bits per second of a rate this mode offers; ValueError names the others."""
    try:
        return RATES[rate]
    except KeyError:
        raise ValueError(f"link rate {rate!r}: use one of {', '.join(RATES)}") from None


def link_unavailable(host_cpus: float | None) -> str | None:
    """Why two emulated hosts cannot be made here (None: they can): root, ``ip netns``,
    ``tc``, and with ``host_cpus`` a cgroup with a CPU cap."""
    import shutil

    from netns_cluster import netns_unavailable

    from benchmarks.emulation.cpu_caps import cgroup_unavailable

    why = netns_unavailable()
    if why is None and shutil.which("tc") is None:
        why = "needs iproute2's `tc` to rate-limit the links"
    if why is None and host_cpus:
        why = cgroup_unavailable()
    return why


# -- bookkeeping (no namespaces needed) -----------------------------------------------------


def counter_delta(before: dict, after: dict) -> dict:
    """``{"tx": bytes, "rx": bytes}`` between two readings of the same counters."""
    return {k: after[k] - before[k] for k in ("tx", "rx")}


def wire_seconds(nbytes: float, rate: str) -> float:
    """Seconds ``nbytes`` take on a link of ``rate`` in one direction (no overhead)."""
    return 8.0 * nbytes / rate_bits(rate)


def link_figures(link: dict | None, rate: str | None) -> dict:
    """From a run's ``link`` record (``{"tx", "rx", "steps", "exchanges"}``: the bytes
    host A's interface sent and received over the timed training, the local steps each
    trainer took meanwhile and the exchanges, i.e. all-reduces, syncs or rounds, in it):
    MB per local step and per exchange (both directions added), and the seconds per step
    the busier direction needs on the wire at ``rate`` (a lower bound: the link is full
    duplex, so the two directions overlap at best). Empty without a record."""
    if not link or not link.get("steps"):
        return {}
    both = link["tx"] + link["rx"]
    out = {"mb_per_step": both / link["steps"] / 1e6,
           "mb_per_exchange": both / max(1, link.get("exchanges") or 0) / 1e6
           if link.get("exchanges") else None}
    if rate:
        out["wire_s_per_step"] = wire_seconds(max(link["tx"], link["rx"]) / link["steps"],
                                              rate)
    return out


def torchrun_node_cmd(node_rank: int, master_addr: str, script_args: list,
                      master_port: int = MASTER_PORT, nnodes: int = 2) -> list:
    """torchrun on one emulated host: ``nnodes`` nodes of one process each, the static
    rendezvous on a TCP store that node 0's agent serves at ``master_addr:master_port``
    (host A's veth address: reachable from every namespace on the bridge)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--nproc-per-node", "1", "--master-addr",
            master_addr, "--master-port", str(master_port), "--max-restarts", "0",
            *script_args]


class LinkMeter:
    """The bytes an interface of this host sent and received between :meth:`start` and
    :meth:`stop`, read from ``/sys/class/net/<if>/statistics`` (inside a namespace,
    ``ip netns exec`` mounts that namespace's sysfs). The interface is ``ifname`` or the
    one named by ``$TORCH_COMPARE_LINK_IF``; without either the meter records nothing."""

    def __init__(self, ifname: str | None = None):
        self.ifname = ifname or os.environ.get(LINK_IF_ENV)
        self.first: dict | None = None
        self.last: dict | None = None

    def read(self) -> dict | None:
        if not self.ifname:
            return None
        base = f"/sys/class/net/{self.ifname}/statistics"
        try:
            with open(f"{base}/tx_bytes") as f, open(f"{base}/rx_bytes") as g:
                return {"tx": int(f.read()), "rx": int(g.read())}
        except OSError:
            return None

    def start(self) -> None:
        self.first = self.read()

    def stop(self) -> None:
        self.last = self.read()

    def record(self, steps: float, exchanges: int) -> dict | None:
        """``{"ifname", "tx", "rx", "steps", "exchanges"}`` or None (nothing read)."""
        if self.first is None or self.last is None:
            return None
        return {"ifname": self.ifname, **counter_delta(self.first, self.last),
                "steps": steps, "exchanges": exchanges}


# -- the hosts (root only) --------------------------------------------------------------------


class LinkHosts:
    """``n`` namespaces on a bridge with links of ``rate``, each in a cgroup of
    ``host_cpus`` CPUs (None: uncapped) under a run group of CPU weight ``priority``
    ordinary processes. Raises RuntimeError (after tearing down what it made) when the
    hosts cannot be built; see :func:`link_unavailable` first."""

    def __init__(self, rate: str, host_cpus: float | None = 1.0, priority: float = 8.0,
                 n: int = 2):
        from netns_cluster import NetnsHosts

        rate_bits(rate)   # a bad rate fails before anything is made
        self.rate = rate
        self.host_cpus = host_cpus
        self.priority = priority
        self.hosts = NetnsHosts(n)
        self.groups: Any = None   # a cpu_caps.CpuGroups once up (benchmarks/ has no package)
        self.host_groups: list = [None] * n
        self.run_procs: list[subprocess.Popen] = []   # this run's sessions (torchrun...)
        self.ddlf_procs: list[subprocess.Popen] = []  # this run's head and nodes
        self.token = ""

    # names and prefixes

    @property
    def ips(self) -> list[str]:
        return self.hosts.ips

    def ifname(self, i: int) -> str:
        """Host i's interface, as its namespace names it."""
        return self.hosts.veth[i] + "p"

    def prefix(self, i: int) -> list:
        group = self.host_groups[i]
        return [*(group.prefix() if group is not None else []), *self.hosts.prefix(i)]

    def env(self, i: int) -> dict:
        """What a process in host i needs: gloo on its veth, one OpenMP thread, the link
        meter's interface, DDLF's token, and no shared memory between hosts."""
        return {"GLOO_SOCKET_IFNAME": self.ifname(i), LINK_IF_ENV: self.ifname(i),
                "OMP_NUM_THREADS": "1", "DDLF_SHM": "0", "DDLF_AUTH_TOKEN": self.token,
                "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(
                    p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}

    # life cycle

    def up(self) -> LinkHosts:
        from benchmarks.emulation.cpu_caps import CpuGroups
        from ddlf_actors.runtime.wire.auth import generate_token

        self.token = generate_token()
        try:
            if self.host_cpus:
                self.groups = CpuGroups(f"ddlf-tc-{os.getpid()}", weight=self.priority)
                self.host_groups = [self.groups.child(f"host{i}", self.host_cpus)
                                    for i in range(len(self.hosts.ns))]
            log(f"link: namespaces {' '.join(self.hosts.ns)}, bridge {self.hosts.bridge}, "
                f"cgroups {self.groups.run.path if self.groups else 'none'}")
            self.hosts.up()
            self.hosts.shape(self.rate, _burst(self.rate))
        except BaseException:
            self.close()
            raise
        log(f"link: {len(self.hosts.ns)} hosts at {self.rate} each way, "
            f"{self.host_cpus or 'uncapped'} CPU each")
        return self

    def popen(self, i: int, cmd: list, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start ``cmd`` in host i (its namespace and cgroup), in a session of its own,
        with :meth:`env` over the parent's environment. Tracked for :meth:`end_run`."""
        proc = subprocess.Popen([*self.prefix(i), *cmd], start_new_session=True,
                                env={**os.environ, **self.env(i), **(env or {})}, **kw)
        self.run_procs.append(proc)
        self.hosts.procs.append(proc)   # teardown's leftover check covers it too
        return proc

    def start_ddlf(self) -> str:
        """A DDLF head and a 1-CPU node in host A, a 1-CPU node in host B, each bound to
        its host's address; the head's address. The driver then runs in host A, as it
        would on the first of two machines: trainer A's traffic stays in A, trainer B's
        crosses the links."""
        from ddlf_actors.runtime.process import start_child

        proc, info = start_child(
            ["ddlf_actors.runtime.head", "--host", self.ips[0], "--port", "0",
             "--stdin-lifeline"], "head", prefix=self.prefix(0), env=self.env(0),
            new_session=True)
        self._track_ddlf(proc)
        for i in range(len(self.hosts.ns)):
            node, _ = start_child(
                ["ddlf_actors.runtime.node", "--address", info["address"], "--host",
                 self.ips[i], "--num-cpus", "1", "--stdin-lifeline"], "node",
                prefix=self.prefix(i), env=self.env(i), new_session=True)
            self._track_ddlf(node)
        return info["address"]

    def _track_ddlf(self, proc: subprocess.Popen) -> None:
        self.ddlf_procs.append(proc)
        self.hosts.procs.append(proc)

    def counters(self) -> list[dict]:
        """Each host's link as the bridge side sees it, read from the root namespace:
        ``tx`` is what went to the host, ``rx`` what came from it."""
        out = []
        for veth in self.hosts.veth:
            base = f"/sys/class/net/{veth}/statistics"
            with open(f"{base}/tx_bytes") as f, open(f"{base}/rx_bytes") as g:
                out.append({"tx": int(f.read()), "rx": int(g.read())})
        return out

    def end_run(self, grace_s: float = 10.0) -> None:
        """Stop every process of the run, bounded: DDLF's by their stdin lifelines (then
        killed), the other sessions by SIGTERM then SIGKILL, then whatever is still in
        the hosts' cgroups. The hosts stay up for the next run."""
        from ddlf_actors.runtime.process import stop_children

        stop_children(self.ddlf_procs, grace_s)
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            alive = [p for p in self.run_procs if p.poll() is None]
            for p in alive:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
                time.sleep(0.05)
        # A session leader that exited may have left children behind; they are in its
        # host's cgroup, which is emptied here (not killpg on a reaped pid: reusable).
        for g in self.host_groups:
            if g is not None:
                g.empty(3.0)
        done = set(map(id, self.ddlf_procs + self.run_procs))
        self.hosts.procs = [p for p in self.hosts.procs if id(p) not in done]
        self.ddlf_procs, self.run_procs = [], []

    def close(self) -> list:
        """End the run, then ``harness.teardown``: namespaces, bridge, cgroups, with
        the check that nothing is left (returned, and logged)."""
        from benchmarks.emulation import harness

        old = {sig: signal.signal(sig, signal.SIG_IGN)
               for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            self.end_run(grace_s=5.0)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return harness.teardown(self.hosts, self.groups)


def _burst(rate: str) -> str:
    from benchmarks.emulation import harness

    return harness.BURST.get(rate, "1mb")
