"""Small polling helpers for tests that wait on asynchronous cluster state."""

from __future__ import annotations

import glob
import json
import time

import psutil

import ddlf_actors as ddlf


def wait_for(predicate, timeout: float = 10.0, step: float = 0.05):
    """Call ``predicate`` until it returns a truthy value or ``timeout`` passes.

    Returns the last value the predicate returned (falsy on timeout).
    """
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(step)
        value = predicate()
    return value


def wait_gone(pids, timeout: float = 15.0) -> set[int]:
    """Wait until every pid has exited (zombies count as gone); return those still alive."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    alive.discard(pid)
            except psutil.NoSuchProcess:
                alive.discard(pid)
        time.sleep(0.1)
    return alive


def recorded_tree(session) -> set[int]:
    """The pids a session folder records (``procs/*.json``) plus all their descendants."""
    pids = set()
    for path in glob.glob(str(session / "procs" / "*.json")):
        with open(path) as f:
            pid = json.load(f)["pid"]
        pids.add(pid)
        try:
            pids.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            pass
    return pids


def kill_leftovers(proc, kids) -> None:
    """End a child driver and the pids it reported, if a test failed before they exited."""
    for pid in kids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@ddlf.remote
def crash_once(marker_path):
    """Crash the first time (no marker file yet), succeed when retried."""
    import os

    if not os.path.exists(marker_path):
        with open(marker_path, "w") as f:
            f.write(str(os.getpid()))
        os._exit(1)
    return "recovered"
