"""An owner for background asyncio tasks (after Dask's ``AsyncTaskGroup``).

The event loop keeps only weak references to tasks, so a task nobody references can be
garbage-collected while it waits, and an exception in a task nobody awaits is reported
late (when the task is collected) or never. Every fire-and-forget task therefore goes
through a :class:`TaskGroup`, which holds it until it ends, logs its exception, and
cancels what is still running when its owner closes.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["TaskGroup"]

log = logging.getLogger("ddlf.tasks")


class TaskGroup:
    """The background tasks of one owner (the head, a node daemon, a core, a worker)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str):
        self.loop = loop
        self.name = name
        self.closed = False
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro, *, log_errors: bool = True) -> asyncio.Task | None:
        """Run ``coro`` as a task held by this group; None (and ``coro`` closed) once closed.

        With ``log_errors`` an exception that ends the task is logged with its traceback;
        pass False when a done-callback of the caller's consumes the outcome itself.
        """
        if self.closed:
            coro.close()
            return None
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done if log_errors else self._tasks.discard)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s: background task %s failed", self.name,
                      getattr(task.get_coro(), "__qualname__", task.get_name()),
                      exc_info=(type(exc), exc, exc.__traceback__))

    def close(self) -> None:
        """Refuse new tasks and cancel the running ones (except the caller's own task)."""
        self.closed = True
        try:
            current = asyncio.current_task(self.loop)
        except RuntimeError:   # not called from a task of this loop
            current = None
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    def __len__(self) -> int:
        return len(self._tasks)
