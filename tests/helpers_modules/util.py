"""Small polling helpers for tests that wait on asynchronous cluster state."""

from __future__ import annotations

import time


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
