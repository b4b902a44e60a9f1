"""Shared fixtures: one context manager starts a cluster; every test checks for leaks."""

from __future__ import annotations

import contextlib
import os
import time

import psutil
import pytest

import ddlf_actors as ddlf

# Worker processes inherit this; keep BLAS from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


@pytest.fixture
def cluster(request):
    """An embedded cluster; size it with ``@pytest.mark.parametrize("cluster", [4], indirect=True)``."""
    num_cpus = getattr(request, "param", 2)
    with start_cluster(num_cpus=num_cpus) as info:
        yield info


@pytest.fixture
def no_leaks():
    with no_leaked_processes():
        yield
