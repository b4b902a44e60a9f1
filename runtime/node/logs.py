"""Forwarding what workers print: each worker's stdout and stderr go to files in the
node's log folder (``worker-<id>.out`` / ``.err``), which this reads as they grow and
sends on, line by line, to the head (which sends them to the driver).

Event-driven: one inotify descriptor watches the folder, so the event loop wakes only
when a worker writes. It then stops listening for ``config.LOG_BATCH_S``, so a burst of
prints is sent as one batch, reads just the files that were written, and listens again.
A quiet node does nothing at all (the old poll looked at 2 files per worker 20 times a
second: 12,000 stat calls a second at 300 workers). Where inotify is missing or refused
(another OS, or the per-user instance limit), it polls instead: every
``config.LOG_POLL_S`` while workers print, backing off to ``config.LOG_POLL_MAX_S``.

A line ``\\0ddlf:kind:name:job`` (``worker.output.log_marker``) is not forwarded: it says
whose output follows (an actor's class, a task's function), which prefixes the lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re

from .. import config
from .inotify import Watch

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
    ``events=False`` forces polling (tests; systems without inotify choose it anyway).
    """

    def __init__(self, loop, log_dir: str, workers, send, background, *, events: bool = True):
        self.loop = loop
        self.log_dir = log_dir
        self.workers = workers
        self._send = send
        self._background = background
        self._events = events
        self._tails: dict[str, _Tail] = {}
        self._watch: Watch | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._more: set = set()   # ids of workers with output left past a chunk
        self.closed = False

    @property
    def event_driven(self) -> bool:
        return self._watch is not None

    def start(self) -> None:
        if self._events:
            try:
                self._watch = Watch(self.log_dir)
            except OSError as e:
                log.info("cannot watch %s for worker output (%s); polling it instead",
                         self.log_dir, e)
        if self._watch is not None:
            self.loop.add_reader(self._watch.fd, self._woken, self._watch)
        else:
            self._background.spawn(self._poll())

    def close(self) -> None:
        """Stop watching (output still in the files stays there)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watch is not None:
            try:
                self.loop.remove_reader(self._watch.fd)
            except Exception as e:
                # The loop is closing with the node: nothing will call _woken again, and
                # the descriptor is closed just below either way.
                log.debug("unwatching %s: %r", self.log_dir, e)
            self._watch.close()

    # -- reading ---------------------------------------------------------------------------
    def finish(self, w) -> None:
        """``w`` exited: send the rest of its output, and forget it."""
        self._send_records(self.read(w))
        self._tails.pop(w.worker_id, None)
        self._more.discard(w.worker_id)

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
            if len(data) == _CHUNK:
                self._more.add(w.worker_id)   # read on at the next batch, event or not
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

    # -- event-driven: inotify ---------------------------------------------------------------
    # The callbacks get the watch as an argument: they are only ever scheduled once start()
    # made one, so they need not look at the Optional attribute.
    def _woken(self, watch: Watch) -> None:
        """A worker wrote: gather the burst for LOG_BATCH_S before reading it."""
        self.loop.remove_reader(watch.fd)
        if self._timer is None:
            self._timer = self.loop.call_later(config.LOG_BATCH_S, self._flush, watch)

    def _flush(self, watch: Watch) -> None:
        self._timer = None
        if self.closed:
            return
        events, overflow = watch.read()
        ids = set(self._more)
        self._more.clear()
        if overflow:
            ids.update(self.workers)
        else:
            for chunk in events:
                ids.update(m.decode() for m in _WORKER_FILE.findall(chunk))
        records = []
        for wid in ids:
            w = self.workers.get(wid)
            if w is not None:
                records.extend(self.read(w))
        self._send_records(records)
        if self._more:   # a file had more than a chunk: go on without waiting for a write
            self._timer = self.loop.call_later(config.LOG_BATCH_S, self._flush, watch)
        else:
            self.loop.add_reader(watch.fd, self._woken, watch)

    # -- polling, where inotify is not available ----------------------------------------------
    async def _poll(self) -> None:
        # Poll fast while workers print, back off while they are quiet: a node with
        # hundreds of idle actors must not spend its CPU looking at empty files.
        delay = config.LOG_POLL_S
        while not self.closed:
            delay = config.LOG_POLL_S if self.drain() else min(config.LOG_POLL_MAX_S, delay * 2)
            await asyncio.sleep(delay)


# A worker's output file, as its name appears in an inotify event (NUL-padded after it).
_WORKER_FILE = re.compile(rb"worker-([^./\x00]+)\.(?:out|err)\x00")


def _worker_id(name: str) -> str | None:
    """``worker-<id>.out`` -> ``<id>``; None for any other file in the folder."""
    m = _WORKER_FILE.fullmatch(os.fsencode(name) + b"\0")
    return m.group(1).decode() if m else None
