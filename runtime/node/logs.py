"""Forwarding what workers print: each worker's stdout and stderr go to files in the
node's log folder (``worker-<id>.out`` / ``.err``), which this reads as they grow and
sends on, line by line, to the head (which sends them to the driver).

The files are polled every ``config.LOG_POLL_S`` while workers print, backing off to
``config.LOG_POLL_MAX_S`` while they are quiet.

A line ``\\0ddlf:kind:name:job`` (``worker.output.log_marker``) is not forwarded: it says
whose output follows (an actor's class, a task's function), which prefixes the lines.
"""

from __future__ import annotations

import asyncio
import logging
import os

from .. import config

__all__ = ["LogTailer", "MARKER"]

log = logging.getLogger("ddlf.node")

MARKER = "\x00ddlf:"   # the same as worker.output.MARKER
_SUFFIXES = (".out", ".err")
_CHUNK = 1 << 20   # read at most this much of one file at a time


class _Tail:
    """How far one worker's files have been read, and the last line if unfinished."""

    __slots__ = ("offsets", "partial")

    def __init__(self):
        self.offsets = {".out": 0, ".err": 0}
        self.partial = {".out": b"", ".err": b""}


class LogTailer:
    """Reads the output of ``workers`` (worker id -> ``WorkerProc``, the pool's live
    dict) from ``log_dir`` and hands the records to ``send(records)``.

    Each record is ``(job id, name, pid, "out" | "err", line)`` (a ``LogBatch`` record).
    """

    def __init__(self, loop, log_dir: str, workers, send, background):
        self.loop = loop
        self.log_dir = log_dir
        self.workers = workers
        self._send = send
        self._background = background
        self._tails: dict[str, _Tail] = {}
        self.closed = False

    def start(self) -> None:
        self._background.spawn(self._poll())

    def close(self) -> None:
        self.closed = True

    # -- reading ---------------------------------------------------------------------------
    def finish(self, w) -> None:
        """``w`` exited: send the rest of its output, and forget it."""
        self._send_records(self.read(w))
        self._tails.pop(w.worker_id, None)

    def drain(self) -> bool:
        """Read every worker's new output now and send it; True if there was any."""
        records = []
        for w in list(self.workers.values()):
            records.extend(self.read(w))
        self._send_records(records)
        return bool(records)

    def read(self, w) -> list:
        """``w``'s output written since the last read, as records (markers applied)."""
        tail = self._tails.get(w.worker_id)
        if tail is None:
            tail = self._tails[w.worker_id] = _Tail()
        records = []
        for suffix in _SUFFIXES:
            path = w.log_prefix + suffix
            try:
                if os.stat(path).st_size <= tail.offsets[suffix]:
                    continue  # one stat instead of open/seek/read/close per quiet file
                with open(path, "rb") as f:
                    f.seek(tail.offsets[suffix])
                    data = f.read(_CHUNK)
            except OSError:
                continue
            if not data:
                continue
            tail.offsets[suffix] += len(data)
            lines = (tail.partial[suffix] + data).split(b"\n")
            tail.partial[suffix] = lines.pop()
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if line.startswith(MARKER):
                    parts = line[len(MARKER):].split(":")
                    if len(parts) >= 3:
                        w.name, w.job_id = parts[1], parts[2] or None
                    continue
                records.append((w.job_id, w.name, w.pid, suffix[1:], line))
        return records

    def _send_records(self, records: list) -> None:
        if records:
            self._send(records)

    # -- polling ------------------------------------------------------------------------------
    async def _poll(self) -> None:
        # Poll fast while workers print, back off while they are quiet: a node with
        # hundreds of idle actors must not spend its CPU looking at empty files.
        delay = config.LOG_POLL_S
        while not self.closed:
            delay = config.LOG_POLL_S if self.drain() else min(config.LOG_POLL_MAX_S, delay * 2)
            await asyncio.sleep(delay)

