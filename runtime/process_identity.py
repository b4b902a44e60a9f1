"""Which process a pid names: its start time, steady when the clock moves.

A pid alone is reused, so DDLF names a process by ``(pid, start time)``: a host's records
of its head, node and jobs (``launch/records.py``) and the owner tag of each shared-memory
segment (``shm_store.py``). psutil's ``create_time()`` will not do for that on Linux: it
is the process's start in ticks since boot plus the boot time of ``/proc/stat``, which is
whole seconds, computed from the wall clock on each read (and, since psutil 7, re-read on
each call). When NTP, a user or a virtual machine's restore moves the clock, the same
process's ``create_time()`` moves by whole seconds (psutil #1724, #2526), and a live head
read as dead: ``ddlf status`` said DIED while the head still held its port (a fresh-machine
run of the tests, across a VM snapshot the kernel logged as "crng reseeded due to virtual
machine fork").

On Linux, :func:`start_time` is the start in seconds since boot, from ``/proc/PID/stat``:
fixed for the process's life, and the same number in every process that reads it.
Elsewhere it is psutil's ``create_time()``, compared with a second's tolerance.
"""

from __future__ import annotations

import os
import sys

import psutil

__all__ = ["start_time", "is_running", "is_exiting", "matches"]

_LINUX = sys.platform.startswith("linux")
_TICKS = os.sysconf("SC_CLK_TCK") if _LINUX else 0
# Linux: a hundredth, what shared-memory segment names keep. Elsewhere the value rests
# on the wall clock: allow the whole second of a boot time.
_TOLERANCE_S = 0.01 if _LINUX else 1.0


# The kernel's flag on a task that has begun to exit (include/linux/sched.h).
_PF_EXITING = 0x4


def _stat_after_name(pid: int) -> list:
    """The fields of ``/proc/PID/stat`` after the name (field 3 on): the name (field 2) is
    in parentheses and may hold spaces or ")", so split after its last ")"."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(int(pid)) from None
    return stat[stat.rindex(b")") + 2:].split()


def start_time(pid: int) -> float:
    """When ``pid`` started: seconds since boot on Linux, else since the epoch.
    ``psutil.NoSuchProcess`` if there is no such process."""
    if _LINUX:
        return int(_stat_after_name(pid)[19]) / _TICKS   # field 22
    return psutil.Process(pid).create_time()


def is_exiting(pid: int) -> bool:
    """True if ``pid`` has begun to exit (Linux; elsewhere always False).

    A process killed by SIGKILL closes its files, and so its children's stdin lifelines,
    before the kernel marks it a zombie: a child that wakes on that EOF can still find it
    "running". Its flags already say it is exiting; it will never run user code again."""
    if not _LINUX:
        return False
    try:
        return bool(int(_stat_after_name(pid)[6]) & _PF_EXITING)   # field 9, the flags
    except (psutil.Error, OSError, ValueError, IndexError):
        return False


def matches(pid: int, recorded: float | None) -> bool:
    """True if ``pid`` runs and started at ``recorded`` (a :func:`start_time`)."""
    if recorded is None:
        return False
    try:
        return abs(start_time(pid) - float(recorded)) <= _TOLERANCE_S
    except (psutil.Error, OSError, ValueError):
        return False


def is_running(pid: int, recorded: float | None) -> bool:
    """:func:`matches`, and not a zombie (exited, not yet reaped)."""
    if not matches(pid, recorded):
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
