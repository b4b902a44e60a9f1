"""Execution threads: where sync methods, sync tasks and ``__init__`` run, off the loop."""

from __future__ import annotations

import collections
import queue
import threading
import traceback

__all__ = ["Executor"]


class Executor:
    """Threads that run user code, in arrival order, off the event loop.

    ``submit(job)`` queues a job; a job runs on an execution thread and returns a
    callable (its *completion*, e.g. "send this reply") that then runs on the loop, or
    None. Completions are handed back in batches: the loop is woken once per burst, not
    once per job, which keeps pipelined calls fast. (A job that must order what it sends
    against items it posted itself, a generator's end after its values, posts it with
    ``call_soon_threadsafe`` too and returns None.)
    """

    def __init__(self, loop, threads: int = 1, name: str = "ddlf-exec"):
        self._loop = loop
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: collections.deque = collections.deque()
        self._wake_pending = False
        self.stopped = False
        self._threads = threads
        for i in range(threads):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def submit(self, job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """Run no job queued from now on; idle threads end now, busy ones after their job."""
        self.stopped = True
        for _ in range(self._threads):
            self._jobs.put(None)

    def _run(self) -> None:
        jobs, done = self._jobs, self._done
        while True:
            job = jobs.get()
            if self.stopped:  # the actor is exiting: queued calls fail when it is gone
                return
            try:
                completion = job()
            except BaseException:  # jobs report their own errors; this is a bug guard
                traceback.print_exc()
                continue
            # Waiting for the next job must not keep this call's arguments (or result)
            # alive: they may be large, or map a shared-memory object its owner freed.
            job = None
            if completion is None:
                continue
            done.append(completion)
            completion = None
            # Same wake-once pattern as the client core: the loop clears the flag before
            # draining, so a completion appended after the drain schedules a new one.
            if not self._wake_pending:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop is closed: the process is exiting
                    return

    def _drain(self) -> None:
        self._wake_pending = False
        done = self._done
        while done:
            try:
                done.popleft()()
            except Exception:
                traceback.print_exc()
