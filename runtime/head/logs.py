"""The head's fan-out of worker output (which driver prints which lines), and its own
rate-limited warnings.

Nodes tail their workers' stdout and stderr and push the lines to the head (``logs``,
a :class:`~..messages.LogBatch` of ``(job_id, worker name, pid, stream, line)``
records). A line goes to the driver of its job; a line of no job (a worker between
jobs) goes to every driver. Pure state with no I/O: :meth:`LogFanout.route` says what to
send where, the head's shell sends it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..wire.messages import LogBatch

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["LogFanout", "WarnLimiter"]


class LogFanout:
    """The drivers connected now, by job id."""

    def __init__(self):
        self.drivers: dict[str, object] = {}   # job id -> its driver's connection

    def add_driver(self, job_id: str, conn: Connection) -> None:
        self.drivers[job_id] = conn

    def remove_driver(self, job_id: str, conn: Connection) -> None:
        """Forget ``job_id``'s driver, if ``conn`` is still the one registered for it."""
        if self.drivers.get(job_id) is conn:
            del self.drivers[job_id]

    def connections(self) -> list:
        return list(self.drivers.values())

    def route(self, batch: LogBatch) -> list[tuple[Connection, LogBatch]]:
        """``(driver connection, the part of batch for it)`` for each driver that gets
        lines of ``batch``."""
        by_job: dict = {}
        for rec in batch.records:
            by_job.setdefault(rec[0], []).append(rec)
        out: list = []
        for job_id, recs in by_job.items():
            if job_id in self.drivers:
                targets = [self.drivers[job_id]]
            elif job_id is None:
                targets = self.connections()
            else:
                targets = []
            part = LogBatch(recs, batch.host, batch.node_id)
            out.extend((conn, part) for conn in targets)
        return out


class WarnLimiter:
    """``log.warning``, at most once per ``every_s`` per key: a peer repeating a refused
    push must not flood the head's log. Later ones are counted and the count is logged
    with the next one let through."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0):
        self.log = logger
        self.every_s = every_s
        self._last: dict[str, tuple] = {}   # key -> (when last logged, how many skipped)

    def __call__(self, key: str, msg: str, *args) -> None:
        now = time.monotonic()
        last, skipped = self._last.get(key, (None, 0))
        if last is not None and now - last < self.every_s:
            self._last[key] = (last, skipped + 1)
            return
        self._last[key] = (now, 0)
        if skipped:
            msg += f" ({skipped} more like it not logged)"
        self.log.warning(msg, *args)
