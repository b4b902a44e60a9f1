"""The parent's side of ``train_compare.py``: each column-run in a fresh process group of
its own, its process tree sampled for CPU time, whatever it leaves behind ended, and its
one result line read back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import protocol
from benchmarks.protocol import Job
from benchmarks.training.column_process import RESULT_PREFIX, load_average, log, now


def become_subreaper() -> bool:
    """Make orphaned descendants (Ray's daemons, Spark's JVM) our children, so that
    nothing a column started can outlive this script unseen. Linux only."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


class ProcessTree:
    """Every process this script started: the column, its descendants, and orphans that
    Linux re-parents to us (see ``become_subreaper``), each with the CPU time it had
    used when last sampled.

    Sampling, not ``RUSAGE_CHILDREN``: Ray's raylet ignores SIGCHLD, so its workers are
    reaped by the kernel and their CPU time is never added to any parent's total.
    A process that ends between two samples loses at most one interval of CPU time.
    """

    def __init__(self):
        # keyed (pid, start): process_identity's start does not move with the clock, as
        # create_time() does, which would count a process's CPU twice across a clock step
        self.procs: dict = {}  # (pid, start) -> psutil.Process
        self.cpu: dict = {}  # (pid, start) -> user + system CPU s when last seen

    def sample(self) -> None:
        import psutil

        from ddlf_actors.runtime import process_identity

        for p in psutil.Process().children(recursive=True):
            try:
                with p.oneshot():
                    key = (p.pid, process_identity.start_time(p.pid))
                    t = p.cpu_times()  # a zombie still reports its final figures
            except psutil.Error:
                continue
            self.procs[key] = p
            self.cpu[key] = t.user + t.system

    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    def running(self) -> list:
        """Processes not yet reaped (zombies included: they wait for us to reap them)."""
        return [p for p in self.procs.values() if p.is_running()]

    def wait(self, timeout: float) -> list:
        """Reap what exits within ``timeout`` s, sampling meanwhile; return the rest."""
        import psutil

        deadline = now() + timeout
        while True:
            self.sample()
            _, alive = psutil.wait_procs(self.running(), timeout=0)
            if not alive or now() >= deadline:
                return alive
            time.sleep(0.2)

    def end_leftovers(self, grace: float = 10.0) -> list[str]:
        """Give the column's processes ``grace`` s to exit, then SIGTERM and SIGKILL the
        rest; return the names of those we had to end."""
        ended = []
        for i, alive in enumerate((self.wait(grace), self.wait(5))):
            for p in alive:
                try:
                    if i == 0:
                        ended.append(f"{p.name()} ({p.pid})")
                        p.terminate()
                    else:
                        p.kill()
                except Exception:  # gone meanwhile
                    pass
        self.wait(5)
        return ended


def _kill_group(proc) -> None:
    """SIGTERM, then SIGKILL, the process group we started the column in."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores, all processes)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _wait_column(proc, tree: ProcessTree, timeout: float):
    """Wait for the column process, sampling its tree; return an error status or None."""
    import psutil

    started = now()
    column = psutil.Process(proc.pid)
    # Sample before reaping: the column's own final CPU time is readable while it is a
    # zombie, and gone once ``poll`` reaps it.
    while column.status() != psutil.STATUS_ZOMBIE:
        if now() - started > timeout:
            tree.sample()
            _kill_group(proc)
            return f"timed out after {timeout:g} s"
        tree.sample()
        time.sleep(0.5)
    tree.sample()
    proc.wait()
    return None




def run_job(script: str, job: Job, settings: dict, timeout: float) -> dict:
    """Run one column-run (``script --job JSON``) in a fresh process group; return its
    result with the 1-minute
    load average at its start, its wall time, and ``other_cpu_s``: the CPU other
    processes took from the machine meanwhile."""
    spec = json.dumps({"job": job.to_json(), "settings": settings})
    cmd = [sys.executable, script, "--job", spec]
    load = load_average()
    log(f"== seed {job.seed} {job.column} {protocol.candidate_label(job.candidate)} "
        f"({job.stage}, load {load if load is None else round(load, 2)})")
    tree = ProcessTree()
    busy0 = _busy_cpu_s()
    started = now()
    with tempfile.TemporaryFile("w+") as out:
        # stdout to a file, not a pipe: a daemon holding the pipe open would block us.
        proc = subprocess.Popen(cmd, stdout=out, stderr=None, start_new_session=True)
        try:
            error = _wait_column(proc, tree, timeout)
        except BaseException:  # Ctrl-C: the column is in its own session, end it here
            _kill_group(proc)
            tree.end_leftovers(grace=0)
            raise
        ended = tree.end_leftovers()
        out.seek(0)
        res = _parse_result(out.read(), job, proc.returncode)
    if error:
        res = {"column": job.column, "stage": job.stage, "seed": job.seed,
               "candidate": job.candidate, "status": "error", "reason": error}
    res["load_1min"] = load
    res["process_s"] = now() - started
    res["other_cpu_s"] = max(0.0, _busy_cpu_s() - busy0 - tree.cpu_s())
    if ended:
        res["ended_leftovers"] = ended
        log(f"== {job.column}: ended processes left behind: {', '.join(ended)}")
    return res


def _parse_result(stdout: str, job: Job, returncode) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"column": job.column, "stage": job.stage, "seed": job.seed,
            "candidate": job.candidate, "status": "error",
            "reason": f"no result line (exit code {returncode}; see stderr above)"}
