"""``max_task_retries``: calls lost with a crashed actor run again on the restarted one."""

from __future__ import annotations

import os
import signal
import sys
import time

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


@ddlf.remote
class Journal:
    """Appends each call's tag to a file that outlives restarts; the first call asked to
    crash does, once (the way Ray's doc example actor_checkpointing.py crashes)."""

    def __init__(self, path, delay):
        # Calls made meanwhile wait in the caller and leave together once the actor is
        # up: every one of them is in flight when the first one crashes.
        time.sleep(delay)
        self.path = path

    def log(self, tag, how=None):
        marker = self.path + ".crashed"
        if how and not os.path.exists(marker):
            open(marker, "w").close()
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(1)
        with open(self.path, "a") as f:
            f.write(tag + "\n")
        return tag


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_calls_in_flight_behind_a_crash_are_retried_in_order(cluster, tmp_path, how):
    # Ray's actor_checkpointing.py (update("1"), update("2"), then get("1"), sent without
    # waiting) failed with KeyError: '1' when update("1") called sys.exit: the exiting call
    # was queued for its retry at once, and the calls sent after it, retried when the
    # connection closed, were put in front of it.
    path = str(tmp_path / "journal")
    a = Journal.options(max_restarts=1, max_task_retries=-1).remote(path, 0.5)
    refs = [a.log.remote("0", how)] + [a.log.remote(str(i)) for i in range(1, 5)]
    assert ddlf.get(refs, timeout=60) == ["0", "1", "2", "3", "4"]
    with open(path) as f:
        assert f.read().split() == ["0", "1", "2", "3", "4"]


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
