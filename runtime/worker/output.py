"""A worker's stdout and stderr: files its node daemon tails and forwards to the driver."""

from __future__ import annotations

import io
import logging
import os
import sys

__all__ = ["MARKER", "log_marker", "redirect_output"]

log = logging.getLogger("ddlf.worker")

# Starts a line that names whose output follows (runtime/node/logs.py reads it).
MARKER = "\x00ddlf:"


_last_marker = ""


def log_marker(text: str) -> None:
    """Tell the node's log tailer whose output follows (Ray does the same with magic lines).

    ``text`` is ``kind:name:job``, e.g. ``task:f:job1`` or ``actor:Counter:``. Written
    only when it changes: a worker running the same task again and again says so once,
    instead of writing (and waking the node's tailer) twice per task.
    """
    global _last_marker
    if text == _last_marker:
        return
    _last_marker = text
    line = f"{MARKER}{text}\n"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            stream.write(line)
            stream.flush()
        except Exception as e:
            # User code closed or replaced the stream: its lines are not ours to forward
            # then, and a missing marker only leaves them under the previous name.
            log.debug("writing the output marker to %r: %r", stream, e)


def redirect_output(log_prefix: str | None) -> None:
    """Send fds 1 and 2 to per-worker files that the node daemon tails and forwards."""
    if not log_prefix:
        return
    for fd, suffix in ((1, ".out"), (2, ".err")):
        f = os.open(log_prefix + suffix, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(f, fd)
        os.close(f)
    for stream in (sys.stdout, sys.stderr):
        # Python's own streams are TextIOWrappers; one replaced before us (a test's
        # capture) keeps the buffering it has.
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
