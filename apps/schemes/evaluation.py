"""Evaluating a row's weights on the trainers, in shards, surviving a lost trainer.

The test set is split into as many shards as there are trainers when the evaluation is
submitted; trainer ``k`` evaluates shard ``k``, queued on it right before its next
``train`` call with the same ``put`` of the weights, so nothing extra is shipped and no
trainer idles while the driver evaluates. If a trainer is lost before its shard is back,
the shard is queued on another live trainer: a row never loses its test accuracy.

:class:`Evaluations` keeps a run's evaluations in row order (several can be out at once in
an asynchronous run) and hands rows over in that order as they complete: the one place a
scheme's machine deals with shards and lost trainers.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..arrays import combine_shards
from ..records import HistoryRow
from .orders import EVALUATE, Call, EmitRow, Order
from .wire import Broadcast

__all__ = ["ShardedEvaluation", "Evaluations"]

# make_call(slot, (method, args, kwargs), kind) -> Call: the machine's call factory.
MakeCall = Callable[..., Call]


class ShardedEvaluation:
    """The evaluation of one history row's weights over the trainers: ``weights_ref`` is a
    ref of them, a :class:`~.wire.Broadcast` or anything with its ``evaluate(slot, shard)``
    and ``take_bytes()`` (``streaming.StreamEval``), which sends each trainer what it
    needs, or None for the weights the trainers hold (allreduce)."""

    def __init__(self, row: HistoryRow, weights_ref, num_test: int, make_call: MakeCall):
        self.row = row
        self.weights_ref = weights_ref
        self.num_test = num_test
        self.make_call = make_call
        self.shards = 0
        self.results: list = []
        self.calls: dict[int, tuple[int, Any]] = {}   # call id -> (shard, slot)
        self._orphans: list[int] = []    # shards whose trainer was lost when none was live

    def submit(self, slots: Sequence) -> list[Call]:
        """One shard on each of ``slots`` (at least one): the calls."""
        self.shards = len(slots)
        self.results = [None] * self.shards
        return [self._queue(k, slot) for k, slot in enumerate(slots)]

    def _queue(self, shard: int, slot) -> Call:
        ref = self.weights_ref
        if isinstance(ref, Broadcast) or hasattr(ref, "evaluate"):
            spec = ref.evaluate(slot, (shard, self.shards))
        else:
            spec = ("evaluate", (ref, (shard, self.shards)), {})
        call = self.make_call(slot, spec, EVALUATE)
        self.calls[call.id] = (shard, slot)
        return call

    def owns(self, call_id: int) -> bool:
        return call_id in self.calls

    def record(self, call_id: int, value) -> None:
        shard, _slot = self.calls.pop(call_id)
        self.results[shard] = value

    def reassign(self, call_id: int, live: Sequence) -> list[Call]:
        """The trainer evaluating ``call_id``'s shard was lost: queue it on a live one (or
        keep it for :meth:`requeue_orphans` when none is live)."""
        shard, _slot = self.calls.pop(call_id)
        if not live:
            self._orphans.append(shard)
            return []
        return [self._queue(shard, live[shard % len(live)])]

    def requeue_orphans(self, live: Sequence) -> list[Call]:
        """Queue shards that found no live trainer on ``live``."""
        if not live:
            return []
        orphans, self._orphans = self._orphans, []
        return [self._queue(k, live[k % len(live)]) for k in orphans]

    @property
    def orphaned(self) -> bool:
        """Some shard lost its trainer when no other was live to take it."""
        return bool(self._orphans)

    def pending(self) -> list[int]:
        return list(self.calls)

    @property
    def done(self) -> bool:
        return self.shards > 0 and all(r is not None for r in self.results)

    def finish(self) -> HistoryRow:
        """Write test loss and accuracy into the row and return it."""
        self.row["test_loss"], self.row["test_accuracy"] = combine_shards(self.num_test,
                                                                          self.results)
        return self.row


class Evaluations:
    """A run's evaluations in row order: each row is handed over (:meth:`ready`) once its
    own and every earlier row's evaluation is complete. A row of a run without a test set
    is ready at once."""

    def __init__(self, num_test: int, make_call: MakeCall):
        self.num_test = num_test
        self.make_call = make_call
        self.queue: list[tuple[HistoryRow, ShardedEvaluation | None]] = []

    def add(self, row: HistoryRow, weights_ref, live: Sequence) -> list[Order]:
        """Evaluate ``row``'s weights on ``live`` (queued later if none is live)."""
        if not self.num_test:
            self.queue.append((row, None))
            return []
        ev = ShardedEvaluation(row, weights_ref, self.num_test, self.make_call)
        self.queue.append((row, ev))
        return [*ev.submit(live)] if live else []

    def owns(self, call_id: int) -> bool:
        return any(ev is not None and ev.owns(call_id) for _row, ev in self.queue)

    def record(self, call_id: int, value) -> None:
        for _row, ev in self.queue:
            if ev is not None and ev.owns(call_id):
                ev.record(call_id, value)
                return

    def lost(self, call_ids, live: Sequence) -> list[Order]:
        """Calls of a lost trainer: every shard among them goes to a live trainer."""
        out: list[Order] = []
        for call_id in call_ids:
            for _row, ev in self.queue:
                if ev is not None and ev.owns(call_id):
                    out += ev.reassign(call_id, live)
                    break
        return out

    def joined(self, live: Sequence) -> list[Order]:
        """Trainers are live again: submit what waited for one, requeue orphaned shards."""
        out: list[Order] = []
        for _row, ev in self.queue:
            if ev is None:
                continue
            if ev.shards == 0:
                out += ev.submit(live) if live else []
            elif ev.orphaned:
                out += ev.requeue_orphans(live)
        return out

    def pending(self) -> list[int]:
        return [c for _row, ev in self.queue if ev is not None for c in ev.pending()]

    def take_bytes(self) -> int:
        """Bytes the broadcasts of the rows out sent since last asked (shards submitted
        or moved after their row was made)."""
        return sum(ev.weights_ref.take_bytes() for _row, ev in self.queue
                   if ev is not None and hasattr(ev.weights_ref, "take_bytes"))

    @property
    def busy(self) -> bool:
        """Some row is still waiting for its evaluation."""
        return any(ev is not None and not ev.done for _row, ev in self.queue)

    def __len__(self) -> int:
        return len(self.queue)

    def ready(self) -> list[HistoryRow]:
        """The rows whose evaluations are complete, in order, taken off the queue."""
        out = []
        while self.queue:
            row, ev = self.queue[0]
            if ev is not None and not ev.done:
                break
            self.queue.pop(0)
            out.append(ev.finish() if ev is not None else row)
        return out

    def emit_ready(self) -> list[Order]:
        """:meth:`ready`'s rows as orders to hand them to the callbacks."""
        return [EmitRow(row) for row in self.ready()]

    def rows(self) -> list[HistoryRow]:
        """The rows still out (a checkpoint's position)."""
        return [row for row, _ev in self.queue]
