"""Plumbing shared by the head and node processes and whoever starts them.

* The ready line: a started head or node prints ``DDLF_READY {json}`` once it serves
  (:func:`announce_ready`); its parent waits for that line (:func:`start_child`).
* How they stop: SIGTERM, SIGINT, and for embedded clusters the end of a stdin
  "lifeline" held by the parent (:func:`stop_on_signals`); parents close those
  lifelines, wait, and kill what is left (:func:`stop_children`).
* Where the token comes from (:func:`resolve_token`) and which versions a peer must
  match (:func:`versions`, :func:`check_versions`).
* Memory that stays with the process (:func:`pin_malloc_mmap_threshold`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time

from . import config
from .errors import DDLFError, VersionMismatchError
from .wire.auth import read_token_file

__all__ = ["READY_PREFIX", "TOKEN_ENV", "PYTHON_VERSION", "announce_ready", "start_child",
           "terminate_then_kill",
           "start_daemon", "child_env", "stop_children", "stop_on_signals", "resolve_token", "versions",
           "check_versions", "pin_malloc_mmap_threshold"]

log = logging.getLogger("ddlf.process")

READY_PREFIX = "DDLF_READY "
TOKEN_ENV = "DDLF_AUTH_TOKEN"
# Pickles (and so every peer) must agree on the Python major.minor.
PYTHON_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"


# -- the ready line ------------------------------------------------------------------------------
def announce_ready(out, info: dict) -> None:
    """Print the ready line with ``info`` on ``out``, then stop writing to it."""
    out.write(READY_PREFIX + json.dumps(info) + "\n")
    out.flush()
    # Nobody reads our stdout after the ready line: send later output to stderr so a
    # full pipe can never block this process.
    os.dup2(2, 1)


def child_env() -> dict:
    """Our environment for a head or node child, able to import this same ddlf_actors."""
    env = dict(os.environ)
    # Children must import the same ddlf_actors as this driver, even from a source tree.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    here = os.path.dirname(os.path.abspath(__file__))
    roots = {pkg_parent, os.path.dirname(here)}
    extra = [r for r in roots if os.path.isfile(os.path.join(r, "pyproject.toml"))]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(extra + [env["PYTHONPATH"]] if env.get("PYTHONPATH") else extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start_child(args: list, what: str, *, stdin=subprocess.PIPE, stderr=None,
                new_session: bool = True, prefix: list | None = None,
                env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    """Start ``python -m args`` and wait for its ready line; return (process, its info).

    ``prefix`` goes before the interpreter, e.g. ``["ip", "netns", "exec", "h1"]``.
    Raises ``DDLFError`` with the child's exit code and last output if it exits first,
    or stays silent for ``config.START_TIMEOUT_S`` (it is killed then).
    """
    proc = subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", *args], stdin=stdin, stdout=subprocess.PIPE,
        stderr=stderr, env={**child_env(), **(env or {})}, start_new_session=new_session,
    )
    out = proc.stdout
    assert out is not None  # stdout=subprocess.PIPE above
    deadline = time.monotonic() + config.START_TIMEOUT_S
    marker = READY_PREFIX.encode()
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([out], [], [], 0.2)
        if ready:
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.split(b"\n"):
                if line.startswith(marker):
                    return proc, json.loads(line[len(marker):])
        elif proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    where = "printed above" if stderr is None else "in its log file"
    raise DDLFError(f"the DDLF {what} failed to start (exit code {proc.returncode}); "
                    f"its error is {where}: {buf.decode(errors='replace').strip()[-500:]}")


def start_daemon(args: list, what: str, log_path: str, env: dict | None = None,
                 prefix: list | None = None) -> tuple[subprocess.Popen, dict]:
    """Start ``python -m args`` in a session of its own (setsid: no terminal, no SIGHUP
    when the shell or the SSH session that started it ends), its stdin closed and its
    output appended to ``log_path``; wait for its ready line. Returns (process, info).

    ``DDLFError`` if it fails to start, with the tail of what it wrote to the log.
    """
    log = open(log_path, "ab")
    start = log.tell()
    try:
        return start_child(args, what, stdin=subprocess.DEVNULL, stderr=log, new_session=True,
                           env=env, prefix=prefix)
    except DDLFError as e:
        log.flush()
        with open(log_path, "rb") as f:
            f.seek(start)
            tail = f.read().decode(errors="replace").strip()[-2000:]
        raise DDLFError(f"{e}\n{tail}" if tail else str(e)) from None
    finally:
        log.close()


# -- stopping ------------------------------------------------------------------------------------
def stop_children(procs, timeout: float = 15.0) -> None:
    """Close the children's stdin lifelines, wait up to ``timeout`` s in all, kill the rest.

    Each child sees its stdin end and stops its own children first; only one that is
    still there at the deadline is killed.
    """
    procs = list(procs)
    for p in procs:
        try:
            if p.stdin is not None:
                p.stdin.close()
        except OSError as e:
            # A broken pipe: that child is gone already, which is what closing asks for.
            log.debug("closing the stdin of child %s: %r", p.pid, e)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        try:
            if p.stdout is not None:
                p.stdout.close()
        except OSError as e:
            # The child has exited: its pipe only had to be released, not read.
            log.debug("closing the stdout of child %s: %r", p.pid, e)


def terminate_then_kill(procs, grace_s: float) -> None:
    """SIGTERM every ``psutil.Process`` of ``procs`` at once, SIGKILL what is left after
    ``grace_s``, and reap it: for processes that are not our ``Popen`` children (a
    recorded pid, or what a library started)."""
    import psutil  # not at import time: the node's forkserver imports this module

    procs = list(procs)
    for p in procs:
        try:
            p.terminate()
        except psutil.Error as e:
            log.debug("SIGTERM to pid %s: %r (gone already)", p.pid, e)
    _gone, left = psutil.wait_procs(procs, timeout=grace_s)
    for p in left:
        try:
            p.kill()
        except psutil.Error as e:
            log.debug("SIGKILL to pid %s: %r (gone already)", p.pid, e)
    psutil.wait_procs(left, timeout=5)


def stop_on_signals(loop, stop, stdin_lifeline: bool = False) -> None:
    """Call ``stop()`` on SIGTERM or SIGINT, and (embedded clusters) at EOF on stdin.

    With ``stdin_lifeline`` the parent holds our stdin: EOF means it is gone, even if it
    died by SIGKILL, so we must not outlive it.
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    if not stdin_lifeline:
        return

    def on_readable():
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(0)
            stop()

    loop.add_reader(0, on_readable)


# -- the token -----------------------------------------------------------------------------------
def resolve_token(explicit: str | None = None, token_file: str | None = None) -> str | None:
    """The token given outright, else ``DDLF_AUTH_TOKEN``, else the one in ``token_file``."""
    return explicit or os.environ.get(TOKEN_ENV) or (
        read_token_file(token_file) if token_file else None)


# -- versions ------------------------------------------------------------------------------------
def versions() -> dict:
    """What a peer tells the head about itself: DDLF's version and Python's major.minor."""
    from . import __version__  # read when called, so a test can pose as another version

    return {"version": __version__, "python": PYTHON_VERSION}


def check_versions(info: dict, who: str) -> None:
    """Raise ``VersionMismatchError`` unless ``info`` (from :func:`versions`) matches ours."""
    ours = versions()
    if info.get("version") != ours["version"] or info.get("python") != ours["python"]:
        raise VersionMismatchError(
            f"{who} runs DDLF {info.get('version')} on Python {info.get('python')}, but the head "
            f"runs DDLF {ours['version']} on Python {ours['python']}. Install the same DDLF and "
            "Python major.minor on every host.")


_M_MMAP_THRESHOLD = -3   # mallopt's parameter number, from glibc's malloc.h


def pin_malloc_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Keep glibc's mmap threshold at ``nbytes`` for good; True if this malloc took it.

    glibc serves an allocation of at least the threshold (128 KiB to start with) with its
    own mmap, unmapped when freed. But when such a block of under 32 MiB is freed, glibc
    *raises* the threshold to its size: from then on, blocks up to that size come from
    the heap, and freed heap blocks between live ones are never given back to the system.
    For a server that is how RSS creeps up: one large frame segment (a peer declaring a
    20 MB segment is enough) and every later 256 KiB receive buffer of a new connection
    comes from the heap and stays resident after the connection closes (measured: the
    head's RSS 44 -> 70 MB over a 10-minute wire fuzz, up to 108 MB during it). Setting
    the threshold explicitly turns that adjustment off. Processes that move large data
    (workers, drivers) benefit from the adjustment (no page faults for each 1 MB frame),
    so only processes that don't should call this: the head.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, int(nbytes)) == 1
    except (OSError, AttributeError):   # no mallopt (a libc without it)
        return False
