"""``max_restarts=-1`` and ``max_retries=-1`` mean "unlimited", as in Ray.

``ddlf_actors/options.py`` accepts -1 and its error message says "-1 for unlimited"; the
head and the task pool used to treat -1 as 0 (never restarted, never retried). Found
while writing benchmarks/chaos/soak.py. The controls with 1 show the same scenario with a
positive limit.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers_modules.util import crash_once

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError


@ddlf.remote
class Pid:
    def pid(self):
        return os.getpid()


def _pid_after_restart(actor, old_pid, timeout=10.0):
    """The actor's pid once a call succeeds again; ActorDiedError if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ddlf.get(actor.pid.remote(), timeout=10)
        except ActorDiedError:
            # Calls caught in flight at the moment of death may fail; later ones must not.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("max_restarts", [1, -1])
def test_actor_restarts_after_sigkill(cluster, max_restarts):
    a = Pid.options(max_restarts=max_restarts).remote()
    pid1 = ddlf.get(a.pid.remote(), timeout=20)
    os.kill(pid1, signal.SIGKILL)
    pid2 = _pid_after_restart(a, pid1)
    assert pid2 != pid1


def test_unlimited_restarts_survive_several_deaths(cluster):
    a = Pid.options(max_restarts=-1).remote()
    pid = ddlf.get(a.pid.remote(), timeout=20)
    for _ in range(3):
        os.kill(pid, signal.SIGKILL)
        new = _pid_after_restart(a, pid)
        assert new != pid
        pid = new


@pytest.mark.parametrize("max_retries", [1, -1])
def test_crashed_task_is_retried(cluster, tmp_path, max_retries):
    marker = str(tmp_path / "crashed-once")
    assert ddlf.get(crash_once.options(max_retries=max_retries).remote(marker),
                    timeout=30) == "recovered"
    assert os.path.exists(marker)
