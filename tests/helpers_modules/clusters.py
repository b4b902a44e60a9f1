"""Cluster context managers shared by every test folder: start one, check for leaks."""

from __future__ import annotations

import contextlib
import time

import psutil
import pytest

import ddlf_actors as ddlf

__all__ = ["no_leaked_processes", "start_cluster"]


def _descendants() -> dict[int, psutil.Process]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out[p.pid] = p
        except psutil.NoSuchProcess:
            pass
    return out


def _describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid}: {' '.join(p.cmdline())[:120]}"
    except psutil.Error:
        return f"pid {p.pid}"


@contextlib.contextmanager
def no_leaked_processes(grace_s: float = 10.0):
    """Fail if a child process started inside the block is still alive ``grace_s`` after it."""
    before = set(_descendants())
    yield
    deadline = time.monotonic() + grace_s
    while True:
        leaked = {pid: p for pid, p in _descendants().items() if pid not in before}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if leaked:
        names = [_describe(p) for p in leaked.values()]
        for p in leaked.values():  # end only what this test started, by pid
            with contextlib.suppress(psutil.Error):
                p.kill()
        pytest.fail(f"test left {len(leaked)} child process(es) behind: {names}")


@contextlib.contextmanager
def start_cluster(num_cpus: float = 2, **kwargs):
    """Start an embedded cluster (head + one node on 127.0.0.1) and stop it afterwards."""
    with no_leaked_processes():
        info = ddlf.init(num_cpus=num_cpus, **kwargs)
        try:
            yield info
        finally:
            ddlf.shutdown()
