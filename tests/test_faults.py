"""Actor process death: pending and later calls fail fast; ``max_restarts`` brings actors back."""

from __future__ import annotations

import os
import signal
import time

import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError


@ddlf.remote
class Slow:
    def __init__(self):
        self.inits = 1
        self.calls = 0

    def pid(self):
        return os.getpid()

    def nap(self, s):
        time.sleep(s)
        self.calls += 1
        return self.calls

    def state(self):
        return self.calls


def test_sigkill_with_ten_queued_calls_fails_all_of_them(cluster):
    a = Slow.remote()
    pid = ddlf.get(a.pid.remote(), timeout=20)
    first = a.nap.remote(30)  # the actor is busy in this one when it dies
    queued = [a.nap.remote(0) for _ in range(10)]
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    # A hang would surface as GetTimeoutError here, not as ActorDiedError.
    for ref in [first, *queued]:
        with pytest.raises(ActorDiedError):
            ddlf.get(ref, timeout=15)
    with pytest.raises(ActorDiedError):
        ddlf.get(a.state.remote(), timeout=15)


def test_a_call_queued_behind_one_that_waits_for_a_lost_call_is_not_lost(cluster):
    """``second`` waits (head of line) for the value of ``first``, which runs when the
    actor is killed; ``third`` is queued behind it. Failing ``first`` unblocks the queue
    while the connection is already gone: ``third`` must fail with the actor, not be
    "sent" on no connection and then wait forever."""
    a = Slow.remote()
    pid = ddlf.get(a.pid.remote(), timeout=20)
    first = a.nap.remote(30)
    second = a.nap.remote(first)   # its argument is first's value
    third = a.nap.remote(0)
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    # A hang would surface as GetTimeoutError here, not as ActorDiedError.
    for ref in (first, second, third):
        with pytest.raises(ActorDiedError):
            ddlf.get(ref, timeout=15)


def test_sigkill_does_not_affect_other_actors(cluster):
    a, b = Slow.remote(), Slow.remote()
    pid_a = ddlf.get(a.pid.remote(), timeout=20)
    ddlf.get(b.nap.remote(0), timeout=20)
    os.kill(pid_a, signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        ddlf.get(a.nap.remote(0), timeout=15)
    assert ddlf.get(b.nap.remote(0), timeout=15) == 2


def test_max_restarts_reruns_init_and_later_calls_succeed(cluster):
    a = Slow.options(max_restarts=1).remote()
    pid1 = ddlf.get(a.pid.remote(), timeout=20)
    assert ddlf.get(a.nap.remote(0), timeout=20) == 1
    os.kill(pid1, signal.SIGKILL)
    deadline = time.monotonic() + 20
    pid2 = None
    while time.monotonic() < deadline:
        try:
            pid2 = ddlf.get(a.pid.remote(), timeout=15)
            break
        except ActorDiedError:
            # Calls caught in flight at the moment of death may fail; later ones must not.
            time.sleep(0.2)
    assert pid2 is not None and pid2 != pid1
    # __init__ ran again: state restarted from scratch.
    assert ddlf.get(a.state.remote(), timeout=15) == 0
    assert ddlf.get(a.nap.remote(0), timeout=15) == 1


def test_restarts_are_bounded_by_max_restarts(cluster):
    a = Slow.options(max_restarts=1).remote()
    for _ in range(2):
        deadline = time.monotonic() + 20
        pid = None
        while time.monotonic() < deadline and pid is None:
            try:
                pid = ddlf.get(a.pid.remote(), timeout=15)
            except ActorDiedError:
                time.sleep(0.2)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    # The second death exhausts max_restarts=1: calls fail for good, including ones made
    # well after a restart would have finished.
    for _ in range(3):
        with pytest.raises(ActorDiedError):
            ddlf.get(a.state.remote(), timeout=15)
        time.sleep(1)
