"""Small polling helpers for tests that wait on asynchronous cluster state."""

from __future__ import annotations

import time

import psutil


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
