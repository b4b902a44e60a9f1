"""``max_task_retries``: calls lost with a crashed actor run again on the restarted one."""

from __future__ import annotations

import os
import signal
import sys

import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError


@ddlf.remote
class Flaky:
    def __init__(self, marker):
        self.marker = marker

    def crash_first(self, how, value):
        # Crashes on the first `crashes` attempts (counted in a file, across restarts).
        n = int(open(self.marker).read()) if os.path.exists(self.marker) else 0
        if n < value["crashes"]:
            with open(self.marker, "w") as f:
                f.write(str(n + 1))
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(1)
        return value["answer"]

    def pid(self):
        return os.getpid()


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_call_lost_in_a_crash_is_retried(cluster, tmp_path, how):
    a = Flaky.options(max_restarts=2, max_task_retries=2).remote(str(tmp_path / "m"))
    pid = ddlf.get(a.pid.remote())
    assert ddlf.get(a.crash_first.remote(how, {"crashes": 1, "answer": 42}), timeout=60) == 42
    assert ddlf.get(a.pid.remote(), timeout=30) != pid


def test_calls_queued_behind_the_crash_run_in_order(cluster, tmp_path):
    a = Flaky.options(max_restarts=1, max_task_retries=-1).remote(str(tmp_path / "m"))
    first = a.crash_first.remote("kill", {"crashes": 1, "answer": "first"})
    later = [a.crash_first.remote("kill", {"crashes": 1, "answer": i}) for i in range(5)]
    assert ddlf.get(first, timeout=60) == "first"
    assert ddlf.get(later, timeout=60) == list(range(5))


def test_without_max_task_retries_the_call_fails(cluster, tmp_path):
    a = Flaky.options(max_restarts=1).remote(str(tmp_path / "m"))
    with pytest.raises(ActorDiedError):
        ddlf.get(a.crash_first.remote("kill", {"crashes": 1, "answer": 1}), timeout=60)
    # The actor itself restarted; a new call works.
    assert ddlf.get(a.crash_first.remote("kill", {"crashes": 1, "answer": 2}), timeout=60) == 2


def test_retries_run_out(cluster, tmp_path):
    a = Flaky.options(max_restarts=5, max_task_retries=1).remote(str(tmp_path / "m"))
    with pytest.raises(ActorDiedError):
        ddlf.get(a.crash_first.remote("exit", {"crashes": 3, "answer": 1}), timeout=60)
