"""What ``ddlf up`` started on this host, kept in the session folder (read by the agent).

    <session root>/clusters/<cluster name>/
        head.json  node.json     pid, start time, address ... of what up started here
        token                    the cluster token on a node host (0600; the head keeps its own)
        logs/head.log  logs/node.log
        jobs/<job id>/job.json, output.log, wd/

A record names a process by pid *and* start time: pids are reused, so ``down`` never
signals a process that merely inherited a recorded number (:func:`alive`).
"""

from __future__ import annotations

import json
import os

import psutil

from .. import config, process_identity

__all__ = ["HostState", "alive", "process_start_time"]


def process_start_time(pid: int) -> float | None:
    """What a record keeps as ``start_time`` (``process_identity.start_time``), or None
    if ``pid`` is gone."""
    try:
        return process_identity.start_time(pid)
    except (psutil.Error, OSError):
        return None


def alive(rec: dict | None, marker: str = "ddlf_actors") -> bool:
    """True if the process ``rec`` names still runs: same pid, same start, DDLF code."""
    if not rec or not rec.get("pid"):
        return False
    try:
        pid = int(rec["pid"])
        if "start_time" in rec:
            if not process_identity.is_running(pid, rec["start_time"]):
                return False
        else:   # a record of a DDLF before start_time: the wall-clock start, to a second
            proc = psutil.Process(pid)
            if abs(proc.create_time() - float(rec.get("create_time", -1))) > 1.0 or \
                    proc.status() == psutil.STATUS_ZOMBIE:
                return False
        return marker in " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, ValueError, TypeError):
        return False


class HostState:
    """The records of one cluster on this host."""

    def __init__(self, cluster: str):
        if not cluster or "/" in cluster or cluster.startswith("."):
            raise ValueError(f"bad cluster name {cluster!r}")
        self.cluster = cluster
        self.root = os.path.join(config.session_root(), "clusters", cluster)

    def _dir(self, *parts: str) -> str:
        path = os.path.join(self.root, *parts)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    @property
    def logs_dir(self) -> str:
        return self._dir("logs")

    @property
    def jobs_dir(self) -> str:
        return self._dir("jobs")

    @property
    def token_path(self) -> str:
        return os.path.join(self._dir(), "token")

    def log_path(self, role: str) -> str:
        return os.path.join(self.logs_dir, f"{role}.log")

    def read(self, role: str) -> dict | None:
        try:
            with open(os.path.join(self.root, f"{role}.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def write(self, role: str, rec: dict) -> None:
        path = os.path.join(self._dir(), f"{role}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, path)

    def forget(self, role: str) -> None:
        try:
            os.unlink(os.path.join(self.root, f"{role}.json"))
        except FileNotFoundError:
            pass

    def running(self, role: str) -> dict | None:
        """The record of ``role`` ("head" or "node") if its process still runs."""
        rec = self.read(role)
        return rec if alive(rec) else None

    def job_dir(self, job_id: str) -> str:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return os.path.join(self.jobs_dir, job_id)

    def jobs(self) -> list:
        """Every job's record on this host, oldest first."""
        out: list = []
        try:
            names = os.listdir(self.jobs_dir)
        except OSError:
            return out
        for name in names:
            try:
                with open(os.path.join(self.jobs_dir, name, "job.json")) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
        return sorted(out, key=lambda r: r.get("started", 0))

    def write_job(self, rec: dict) -> None:
        path = os.path.join(self.job_dir(rec["job_id"]), "job.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, path)
