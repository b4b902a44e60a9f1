"""Evaluating a row's weights on the trainers, in shards, surviving a lost trainer.

The test set is split into as many shards as there are trainers when the evaluation is
submitted; trainer ``k`` evaluates shard ``k``, queued on it right before its next
``train`` call with the same ``put`` of the weights, so nothing extra is shipped and no
trainer idles while the driver evaluates. If a trainer is lost before its shard is back,
the shard is queued on another live trainer: a row never loses its test accuracy.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..records import HistoryRow
from ..trainer import combine_shards
from .wire import Broadcast

__all__ = ["ShardedEvaluation"]


class ShardedEvaluation:
    """The evaluation of one history row's weights over the trainers: ``weights_ref`` is a
    ref of them, or a :class:`~.wire.Broadcast` (which sends each trainer what it needs)."""

    def __init__(self, row: HistoryRow, weights_ref, num_test: int):
        self.row = row
        self.weights_ref = weights_ref
        self.num_test = num_test
        self.shards = 0
        self.results: list = []
        self.refs: dict = {}          # ref -> (shard, slot)
        self._orphans: list = []      # shards whose trainer was lost when none was live

    def submit(self, slots: Sequence) -> list:
        """Queue one shard on each of ``slots`` (at least one); return the refs."""
        self.shards = len(slots)
        self.results = [None] * self.shards
        return [self._queue(k, slot) for k, slot in enumerate(slots)]

    def _queue(self, shard: int, slot) -> Any:
        if isinstance(self.weights_ref, Broadcast):
            ref = self.weights_ref.evaluate(slot, (shard, self.shards))
        else:
            ref = slot.handle.evaluate.remote(self.weights_ref, (shard, self.shards))
        self.refs[ref] = (shard, slot)
        return ref

    def owns(self, ref) -> bool:
        return ref in self.refs

    def record(self, ref, value) -> None:
        shard, _slot = self.refs.pop(ref)
        self.results[shard] = value

    def reassign(self, ref, live: Sequence) -> Any | None:
        """The trainer evaluating ``ref``'s shard was lost: queue it on a live one.

        Returns the new ref, or None when no trainer is live (the caller retries later
        with :meth:`requeue_orphans`).
        """
        shard, _slot = self.refs.pop(ref)
        if not live:
            self._orphans.append(shard)
            return None
        return self._queue(shard, live[shard % len(live)])

    def requeue_orphans(self, live: Sequence) -> list:
        """Queue shards that found no live trainer on ``live``; return the new refs."""
        orphans, self._orphans = self._orphans, []
        return [self._queue(k, live[k % len(live)]) for k in orphans] if live else []

    @property
    def orphaned(self) -> bool:
        """Some shard lost its trainer when no other was live to take it."""
        return bool(self._orphans)

    def pending(self) -> list:
        return list(self.refs)

    @property
    def done(self) -> bool:
        return self.shards > 0 and all(r is not None for r in self.results)

    def finish(self) -> HistoryRow:
        """Write test loss and accuracy into the row and return it."""
        self.row["test_loss"], self.row["test_accuracy"] = combine_shards(self.num_test,
                                                                          self.results)
        return self.row
