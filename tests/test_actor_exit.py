"""``sys.exit`` and ``exit_actor()`` inside actors end the actor, never the driver."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError, TaskError


@ddlf.remote
class Leaver:
    def pid(self):
        return os.getpid()

    def leave(self, code):
        sys.exit(code)

    def leave_on_purpose(self):
        ddlf.actor.exit_actor()

    def hard_exit(self):
        os._exit(0)

    def slow(self, s):
        time.sleep(s)
        return s


@ddlf.remote(max_concurrency=2)
class AsyncLeaver:
    async def pid(self):
        return os.getpid()

    async def leave(self):
        sys.exit(4)


def _gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def test_sys_exit_ends_the_actor_with_actor_died_error(cluster):
    a = Leaver.remote()
    pid = ddlf.get(a.pid.remote())
    with pytest.raises(ActorDiedError) as info:
        ddlf.get(a.leave.remote(3), timeout=30)
    assert not isinstance(info.value, SystemExit)
    assert "sys.exit(3)" in str(info.value) and "exit status 3" in str(info.value)
    assert _gone(pid)
    with pytest.raises(ActorDiedError, match="exit code 3"):
        ddlf.get(a.pid.remote(), timeout=30)


def test_calls_queued_behind_the_exit_fail_too(cluster):
    a = Leaver.remote()
    ddlf.get(a.pid.remote())
    first = a.leave.remote(2)
    later = [a.slow.remote(0) for _ in range(5)]
    with pytest.raises(ActorDiedError):
        ddlf.get(first, timeout=30)
    for r in later:
        with pytest.raises(ActorDiedError):
            ddlf.get(r, timeout=30)


def test_a_non_zero_exit_is_a_crash_and_restarts(cluster):
    a = Leaver.options(max_restarts=1).remote()
    pid = ddlf.get(a.pid.remote())
    with pytest.raises(ActorDiedError):
        ddlf.get(a.leave.remote(1), timeout=30)
    new_pid = ddlf.get(a.pid.remote(), timeout=30)
    assert new_pid != pid


def test_exit_actor_is_on_purpose_and_never_restarts(cluster):
    a = Leaver.options(max_restarts=3).remote()
    pid = ddlf.get(a.pid.remote())
    with pytest.raises(ActorDiedError, match=r"exit_actor\(\)"):
        ddlf.get(a.leave_on_purpose.remote(), timeout=30)
    assert _gone(pid)
    with pytest.raises(ActorDiedError, match="not restarted"):
        ddlf.get(a.pid.remote(), timeout=30)


def test_sys_exit_zero_does_not_restart(cluster):
    a = Leaver.options(max_restarts=3).remote()
    ddlf.get(a.pid.remote())
    with pytest.raises(ActorDiedError):
        ddlf.get(a.leave.remote(0), timeout=30)
    with pytest.raises(ActorDiedError, match="on purpose"):
        ddlf.get(a.pid.remote(), timeout=30)


def test_os_exit_zero_is_a_crash_and_restarts(cluster):
    # Only an announced exit (sys.exit(0), exit_actor) is on purpose, as in Ray.
    a = Leaver.options(max_restarts=1).remote()
    pid = ddlf.get(a.pid.remote())
    with pytest.raises(ActorDiedError):
        ddlf.get(a.hard_exit.remote(), timeout=30)
    assert ddlf.get(a.pid.remote(), timeout=30) != pid


def test_sys_exit_in_an_async_method(cluster):
    a = AsyncLeaver.remote()
    pid = ddlf.get(a.pid.remote())
    with pytest.raises(ActorDiedError, match="sys.exit"):
        ddlf.get(a.leave.remote(), timeout=30)
    assert _gone(pid)


def test_exit_actor_outside_an_actor_is_a_type_error():
    with pytest.raises(TypeError, match="inside an actor method"):
        ddlf.actor.exit_actor()


@ddlf.remote
def task_exits():
    sys.exit(5)


@ddlf.remote
def task_ok():
    return 7


def test_sys_exit_in_a_task_fails_the_task_only(cluster):
    with pytest.raises(TaskError, match="SystemExit"):
        ddlf.get(task_exits.remote(), timeout=30)
    assert ddlf.get(task_ok.remote(), timeout=30) == 7


def test_an_uncaught_remote_exit_fails_the_driver_script(tmp_path, no_leaks):
    # The reproduction: the script used to stop silently with status 0.
    script = tmp_path / "leave.py"
    script.write_text(textwrap.dedent("""
        import sys
        import ddlf_actors as ddlf

        @ddlf.remote
        class W:
            def leave(self):
                sys.exit(1)

        ddlf.init(num_cpus=1)
        ddlf.get(W.remote().leave.remote(), timeout=60)
        print("not reached")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode != 0
    assert "not reached" not in out.stdout
    assert "ActorDiedError" in out.stderr and "sys.exit(1)" in out.stderr
