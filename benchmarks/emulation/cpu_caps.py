"""CPU caps for emulated nodes: a cgroup per node under one group per run (root only).

    run = CpuGroups(f"ddlf-emu-{os.getpid()}", weight=8)   # the run's group
    node = run.child("node1", cpus=0.5)                     # a node of half a CPU
    subprocess.Popen(node.prefix() + ["python", ...])       # starts inside it
    node.usage()                                            # its CPU seconds so far
    run.close()                                             # kills what is left, removes all

cgroup v2 (``cpu.max``, ``cpu.weight``, ``cpu.stat``) where the ``cpu`` controller is on
the unified hierarchy, else cgroup v1 (``cpu.cfs_quota_us``, ``cpu.shares``), as this
machine mounts it; ``benchmarks/training/stragglers.py`` does the same for its trainers. A node
process is started inside its group (``prefix()`` writes the shell's pid to
``cgroup.procs`` and execs the command), so every process it forks — the forkserver and
the trainers — is capped with it: the cap is the node's, shared by its processes.

The run's group has the CPU weight of ``weight`` ordinary processes: on a machine loaded
by other jobs the capped nodes still get what their caps allow (the caps bound what they
can take), and the driver and head, put in the run's group uncapped, are not starved.

:meth:`CpuGroups.close` is bounded: each group's remaining processes get SIGTERM, then
SIGKILL after ``grace_s``, and the directories are removed with retries for a few
seconds; what could not be removed is returned (and printed), never waited on forever.
"""

from __future__ import annotations

import os
import signal
import sys
import time

__all__ = ["CpuGroups", "CpuGroup", "cgroup_unavailable"]

V2_ROOT = "/sys/fs/cgroup"
V1_ROOT = "/sys/fs/cgroup/cpu"
PERIOD_US = 100_000


def _layout() -> tuple[bool, str] | None:
    """(v2?, root) of the hierarchy that has the cpu controller, or None."""
    controllers = os.path.join(V2_ROOT, "cgroup.controllers")
    if os.path.exists(controllers):
        with open(controllers) as f:
            if "cpu" in f.read().split():
                return True, V2_ROOT
    if os.path.exists(os.path.join(V1_ROOT, "cpu.cfs_quota_us")):
        return False, V1_ROOT
    return None


def cgroup_unavailable() -> str | None:
    """Why no CPU cap can be made here, or None: a probe group with a capped child is
    made and removed (in a container, cgroup v2 may refuse to delegate the controller)."""
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    if _layout() is None:
        return "no cgroup cpu controller (neither v2 cpu.max nor v1 cpu.cfs_quota_us)"
    try:
        probe = CpuGroups(f"ddlf-probe-{os.getpid()}", weight=1)
    except OSError as e:
        return f"cannot make a cgroup with a CPU cap here: {e}"
    try:
        probe.child("probe", 0.5)
    except OSError as e:
        return f"cannot cap a cgroup's CPU here: {e}"
    finally:
        probe.close()
    return None


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


class CpuGroup:
    """One cgroup: a node's (capped) or the run's (weighted)."""

    def __init__(self, path: str, v2: bool):
        self.path = path
        self.v2 = v2
        os.mkdir(path)

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def prefix(self) -> list[str]:
        """A command prefix that runs the command inside this group (``sh`` moves itself
        in, then execs the command, which keeps its pid)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', self.procs_file]

    def add(self, pid: int) -> None:
        _write(self.procs_file, pid)

    def limit(self, cpus: float | None) -> None:
        """At most ``cpus`` CPUs for the group's processes together (None: no cap)."""
        if self.v2:
            quota = "max" if cpus is None else str(max(1000, int(cpus * PERIOD_US)))
            _write(os.path.join(self.path, "cpu.max"), f"{quota} {PERIOD_US}")
        else:
            _write(os.path.join(self.path, "cpu.cfs_quota_us"), -1)
            _write(os.path.join(self.path, "cpu.cfs_period_us"), PERIOD_US)
            if cpus is not None:
                _write(os.path.join(self.path, "cpu.cfs_quota_us"),
                       max(1000, int(cpus * PERIOD_US)))

    def weight(self, processes: float) -> None:
        """The group's CPU weight against its siblings, in ordinary processes."""
        if self.v2:
            _write(os.path.join(self.path, "cpu.weight"),
                   max(1, min(10000, round(processes * 100))))
        else:
            _write(os.path.join(self.path, "cpu.shares"), max(2, int(processes * 1024)))

    def pids(self) -> list[int]:
        try:
            with open(self.procs_file) as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def usage(self) -> float:
        """CPU seconds of the group's processes: v2's ``cpu.stat`` (every process that was
        in it), else the sum over the processes in it now (psutil), each with the children
        it has reaped: a trainer that ended counts in its forkserver's figures."""
        if self.v2:
            with open(os.path.join(self.path, "cpu.stat")) as f:
                stats = dict(line.split() for line in f if line.strip())
            return int(stats["usage_usec"]) / 1e6
        import psutil

        total = 0.0
        for pid in self.pids():
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass   # exited between the listing and now
        return total

    def throttled(self) -> tuple[int, int]:
        """(periods, periods in which the cap stopped the group): proof that it binds."""
        with open(os.path.join(self.path, "cpu.stat")) as f:
            stats = dict(line.split() for line in f if line.strip())
        return int(stats.get("nr_periods", 0)), int(stats.get("nr_throttled", 0))

    def empty(self, grace_s: float) -> None:
        """End the processes still in the group: SIGTERM, then SIGKILL after ``grace_s``.
        They are this run's (started in the group, or forked there)."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.05)

    def remove(self, grace_s: float = 3.0) -> str | None:
        """Empty the group and remove it; None, or why it could not be removed."""
        self.empty(grace_s)
        deadline = time.monotonic() + 3.0
        while True:
            try:
                os.rmdir(self.path)
                return None
            except FileNotFoundError:
                return None
            except OSError as e:
                # An exiting process leaves the group a moment after it is killed.
                if time.monotonic() > deadline:
                    return f"{self.path}: {e} (processes left: {self.pids()})"
                time.sleep(0.05)


class CpuGroups:
    """The run's group and its nodes' groups. Raises OSError when a group cannot be made
    (see :func:`cgroup_unavailable` first)."""

    def __init__(self, name: str, weight: float | None = None):
        layout = _layout()
        if layout is None:
            raise OSError("no cgroup cpu controller (neither v2 cpu.max nor v1 "
                          "cpu.cfs_quota_us)")
        self.v2, root = layout
        if self.v2:   # children of the root get the cpu controller
            _write(os.path.join(root, "cgroup.subtree_control"), "+cpu")
        self.run = CpuGroup(os.path.join(root, name), self.v2)
        self.children: list[CpuGroup] = []
        try:
            if self.v2:
                _write(os.path.join(self.run.path, "cgroup.subtree_control"), "+cpu")
            if weight is not None:
                self.run.weight(weight)
        except OSError:
            self.close()
            raise

    def child(self, name: str, cpus: float | None) -> CpuGroup:
        group = CpuGroup(os.path.join(self.run.path, name), self.v2)
        self.children.append(group)
        group.limit(cpus)
        return group

    def close(self, grace_s: float = 3.0) -> list[str]:
        """Remove every group (children first), ending what is left in them; return the
        groups that could not be removed (also printed), after a bounded wait."""
        problems = [p for p in (g.remove(grace_s) for g in self.children) if p]
        self.children = []
        p = self.run.remove(grace_s)
        if p:
            problems.append(p)
        for p in problems:
            print(f"cpu_caps: could not remove {p}", file=sys.stderr)
        return problems
