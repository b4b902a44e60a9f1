"""A process's identity, ``(pid, start time)``, holds when the wall clock moves.

psutil's ``create_time()`` on Linux adds the boot time of ``/proc/stat``, whole seconds
computed from the wall clock on every read: an NTP step moves it. Records compared with
it read a live head as DIED (``ddlf status``), and would let a sweep unlink a live
process's shared-memory segments. These tests move psutil's boot time by two seconds, as a
clock step does, and check that nothing DDLF keeps about a process changes with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from ddlf_actors.runtime import process_identity, shm_store
from ddlf_actors.runtime.launch import records

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the clock-free start is /proc's (Linux)")


@pytest.fixture
def clock_step(monkeypatch):
    """Moves psutil's boot time (so its create_time()) two seconds later when called."""
    from psutil import _pslinux

    real = _pslinux.boot_time

    def step():
        monkeypatch.setattr(_pslinux, "boot_time", lambda: real() + 2.0)

    return step


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@linux_only
def test_the_start_is_psutils_without_the_boot_time_and_steady_across_a_clock_step(
        child, clock_step):
    pid = child.pid
    start = process_identity.start_time(pid)
    assert start == pytest.approx(psutil.Process(pid).create_time() - psutil.boot_time(),
                                  abs=0.011)
    before = psutil.Process(pid).create_time()
    clock_step()
    assert psutil.Process(pid).create_time() == pytest.approx(before + 2.0)   # it moved
    assert process_identity.start_time(pid) == start and process_identity.matches(pid, start)


@linux_only
def test_a_live_heads_record_stays_alive_across_a_clock_step(child, clock_step):
    rec = {"role": "head", "pid": child.pid, "start_time": records.process_start_time(child.pid)}
    assert records.alive(rec, marker="time.sleep")
    clock_step()
    assert records.alive(rec, marker="time.sleep"), "a clock step read a live process as dead"


def test_another_start_a_gone_pid_and_a_zombie_are_not_the_process(child):
    start = process_identity.start_time(child.pid)
    assert not process_identity.matches(child.pid, start + 5.0)
    assert not process_identity.matches(child.pid, None)
    rec = {"role": "node", "pid": child.pid, "start_time": start}
    assert not records.alive(rec)   # not DDLF code: its command line lacks the marker
    child.kill()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.02)
    assert process_identity.matches(child.pid, start)   # exited, pid and start kept
    assert not process_identity.is_running(child.pid, start)
    child.wait()
    assert not process_identity.matches(child.pid, start)
    with pytest.raises(psutil.NoSuchProcess):
        process_identity.start_time(child.pid)


@linux_only
def test_a_name_with_spaces_and_parentheses_parses(tmp_path):
    """The name in /proc/PID/stat is the process's own (``comm``): any bytes."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "open('/proc/self/comm', 'w').write('a) b (c'); "
                             "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).name() != "a) b (c":
            assert time.monotonic() < deadline, "the child did not rename itself"
            time.sleep(0.02)
        assert process_identity.start_time(proc.pid) == pytest.approx(
            psutil.Process(proc.pid).create_time() - psutil.boot_time(), abs=0.011)
    finally:
        proc.kill()
        proc.wait()


def test_a_record_from_before_start_time_is_judged_by_its_wall_clock_start(child):
    created = psutil.Process(child.pid).create_time()
    assert records.alive({"pid": child.pid, "create_time": created}, marker="time.sleep")
    assert not records.alive({"pid": child.pid, "create_time": created - 100},
                             marker="time.sleep")


@linux_only
def test_a_sweep_after_a_clock_step_keeps_a_live_creators_segments(tmp_path, clock_step):
    store = shm_store._Store(str(tmp_path))
    mine = os.path.join(store.dir, f"{store.tag}-1-abcdef")
    with open(mine, "wb") as f:
        f.write(b"x")
    clock_step()
    assert shm_store.sweep(store) == 0 and os.path.exists(mine)
    os.unlink(mine)


@linux_only
def test_a_live_process_is_not_exiting_and_a_zombie_is(child):
    assert not process_identity.is_exiting(child.pid)
    assert not process_identity.is_exiting(os.getpid())
    child.kill()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.02)
    assert process_identity.is_exiting(child.pid)   # the kernel's own flag, read from /proc
    child.wait()
    assert not process_identity.is_exiting(child.pid)   # gone: nothing to read


@linux_only
def test_a_sweep_unlinks_the_segments_of_a_creator_that_is_exiting(child, tmp_path, monkeypatch):
    """A node wakes on its killed driver's closed lifeline before the kernel marks the
    driver a zombie, and sweeps once more before it exits: the driver, still "running",
    must not keep its segments then. Its flags already say it is exiting (posed here: the
    window is too short to catch on purpose)."""
    start = process_identity.start_time(child.pid)
    name = f"{child.pid}-{round(start * 100)}-1-abcdef"
    store = shm_store._Store(str(tmp_path))
    seg = os.path.join(store.dir, name)
    with open(seg, "wb") as f:
        f.write(b"x")
    assert shm_store.sweep(store) == 0 and os.path.exists(seg)   # alive: kept
    real = process_identity._stat_after_name

    def exiting(pid):
        fields = real(pid)
        if pid == child.pid:
            fields[6] = str(int(fields[6]) | process_identity._PF_EXITING).encode()
        return fields

    monkeypatch.setattr(process_identity, "_stat_after_name", exiting)
    assert process_identity.is_running(child.pid, start)   # not yet a zombie
    assert shm_store.sweep(store) == 1 and not os.path.exists(seg)
