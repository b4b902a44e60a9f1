"""Which row a trainer's work belongs to, by time interval.

A synchronous round holds every call it starts, so its row simply sums its calls. Where
rows are cut by something else (an asynchronous epoch ends when enough samples are in; a
round of ``backup_workers`` closes before the late trainers finish), a call can start in
one row and end in the next. Counting it whole where it ends made a row's ``compute_s``
larger than its wall time and ``overhead_s`` negative.

The ledger attributes each call's work to rows by interval instead. A call's busy interval
is the trainer-reported ``compute_s + eval_s`` ending when its reply reached the driver,
clipped to start no earlier than its dispatch (so one trainer's calls never overlap: it
runs them one at a time). When a row closes at time ``T``:

- finished calls count the part of their interval inside the row's window;
- calls still running count from ``max(dispatch, window start)`` to ``T``, as compute
  (the trainer is working on them), and only their part after ``T`` goes to later rows.

So for every trainer, the busy time given to a row is at most the row's wall time, and
``overhead_s = wall_s − busiest trainer`` is never negative.
"""

from __future__ import annotations

from typing import Any, Hashable

__all__ = ["WorkLedger"]


class WorkLedger:
    """Per-trainer busy time of the current row's window ``[start, now)``."""

    def __init__(self, start: float):
        self.start = start
        self._busy: dict[Any, list[float]] = {}     # trainer -> [compute_s, eval_s]
        self._running: dict[Hashable, tuple[Any, float]] = {}   # call -> (trainer, counted from)

    def dispatched(self, call: Hashable, trainer, when: float) -> None:
        """A call to ``trainer`` left the driver at ``when``."""
        self._running[call] = (trainer, when)

    def dropped(self, call: Hashable) -> None:
        """A call that will never report (its trainer was lost): its time is not work."""
        self._running.pop(call, None)

    def finished(self, call: Hashable, compute_s: float, eval_s: float, when: float) -> None:
        """The call's reply reached the driver at ``when``, with the trainer's own times."""
        trainer, counted_from = self._running.pop(call)
        busy = max(0.0, compute_s) + max(0.0, eval_s)
        begin = max(counted_from, when - busy, self.start)
        span = max(0.0, when - begin)
        if busy <= 0 or span <= 0:
            return
        # The clipped part is split between compute and evaluation in proportion.
        acc = self._busy.setdefault(trainer, [0.0, 0.0])
        acc[0] += span * max(0.0, compute_s) / busy
        acc[1] += span * max(0.0, eval_s) / busy

    def close(self, when: float) -> dict:
        """End the window at ``when``: ``{trainer: (compute_s, eval_s)}`` for it; the next
        window starts at ``when``."""
        for call, (trainer, counted_from) in list(self._running.items()):
            begin = max(counted_from, self.start)
            if when > begin:
                self._busy.setdefault(trainer, [0.0, 0.0])[0] += when - begin
            self._running[call] = (trainer, max(counted_from, when))
        out = {t: (c, e) for t, (c, e) in self._busy.items()}
        self._busy = {}
        self.start = when
        return out

    # -- checkpoints (an async run's position) -------------------------------------------------
    def position(self, now: float) -> dict:
        """What a resumed run needs: the busy time so far in the open window, by trainer."""
        return {"elapsed_s": now - self.start,
                "busy": {str(t): list(v) for t, v in self._busy.items()}}

    @classmethod
    def restore(cls, pos: dict, now: float) -> WorkLedger:
        ledger = cls(now - float(pos.get("elapsed_s", 0.0)))
        ledger._busy = {int(t): list(v) for t, v in pos.get("busy", {}).items()}
        return ledger
