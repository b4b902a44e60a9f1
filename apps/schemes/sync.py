"""Synchronous data parallelism: the paper's Algorithm 6, surviving lost trainers.

Each round the driver ``put``s the weights once, sends every live trainer its index
partition, waits for their deltas and applies their mean weighted by samples,
``w ← w − Σ_j (n_j / Σn) delta_j``. ``rounds_per_epoch = r`` averages r times per
epoch, each on 1/r of the epoch's permutation (local SGD).

A trainer lost mid-round costs only its own share of that round: the round completes
with the deltas that arrived, each weighted by its samples, and the lost trainer's
replacement (started at once, in its reserved slot) joins at the next round with the
current weights. A round in which every trainer was lost is run again once trainers are
back. Everything the round depends on (the epoch's permutation, the trainers present,
the order of the sum) is a function of the seed, the round number and the slots, so a
run resumed from a checkpoint ends with the same weights as one that was never stopped.
"""

from __future__ import annotations

import time

from ..config import ASYNC_ONLY, TrainConfig
from ..records import HistoryRow
from ..trainer import nbytes
from .averaging import apply_delta, weighted_mean
from .base import Scheme

__all__ = ["SyncScheme", "train_sync"]


class SyncScheme(Scheme):
    name = "sync"

    def __init__(self, model_fn, dataset, config: TrainConfig, trainers=None):
        defaults = TrainConfig()
        for option in ASYNC_ONLY:
            if getattr(config, option) != getattr(defaults, option):
                raise ValueError(f"{option}= applies to train_async only; train_sync "
                                 "waits for every trainer each round")
        super().__init__(model_fn, dataset, config, trainers)
        self.pending_row: HistoryRow | None = None   # the last row, whose weights the next round evaluates

    def total_rows(self) -> int:
        return self.config.master_epochs * self.config.rounds_per_epoch

    def position(self) -> dict:
        return {"pending_row": self.pending_row}

    def restore_position(self, ckpt) -> None:
        self.pending_row = ckpt.meta["position"].get("pending_row")

    def loop(self, w: list) -> list:
        cfg = self.config
        R = cfg.rounds_per_epoch
        while self.round_no < self.total_rows():
            epoch, r = divmod(self.round_no, R)
            stopped, w = self._round(w, epoch + 1, r)
            if stopped:
                return w
        if self.pending_row is not None:   # the last weights' evaluation
            evaluation = self.evaluation(self.pending_row, self.put_weights(w))
            self.pending_row = None
            if evaluation is not None:
                live = self.members()
                self.bytes_sent += len(live) * nbytes(w)
                evaluation.submit(live)
                self._gather({}, evaluation, {})
        return w

    def _round(self, w: list, epoch: int, r: int) -> tuple[bool, list]:
        """Run one round; return (stopped early, weights)."""
        cfg = self.config
        t_round = time.perf_counter()
        live = self.members()
        pieces = self.plan.round_pieces(epoch, r, [s.index for s in live])
        w_ref = self.put_weights(w)
        evaluation = None
        if self.pending_row is not None:
            # Evaluate the previous round's weights on the trainers, queued before their
            # train call so it costs no extra shipping; see evaluation.py.
            evaluation = self.evaluation(self.pending_row, w_ref)
            if evaluation is not None:
                evaluation.submit(live)
            self.pending_row = None
        want_state = self.checkpoint_due(self.round_no + 1)
        calls = {}
        for slot in live:
            ref = slot.handle.train.remote(w_ref, pieces[slot.index], cfg.worker_epochs,
                                           cfg.batch_size, return_state=want_state)
            calls[ref] = slot
        self.bytes_sent += len(live) * nbytes(w) + sum(p.nbytes for p in pieces.values())
        results: dict = {}
        stopped = self._gather(calls, evaluation, results)
        if stopped or not results:
            # Stopped: the round's deltas are not applied, so result.weights are the
            # weights of the last reported row. No results: every trainer of the round was
            # lost; it runs again with the trainers that come back.
            return stopped, w
        slots = sorted(results)    # a fixed order of summation: resumes are bit-equal
        deltas = [results[j][0] for j in slots]
        stats = [results[j][1] for j in slots]
        for j, s in zip(slots, stats):
            self.keep_state(j, s)
        self.bytes_received += sum(nbytes(d) for d in deltas)
        w = apply_delta(w, weighted_mean(deltas, [s["samples"] for s in stats]))
        self.round_no += 1
        self.pending_row = self.new_row(self.round_no, epoch - 1 + (r + 1) / cfg.rounds_per_epoch,
                                        stats, time.perf_counter() - t_round)
        if self.checkpoint_due(self.round_no):
            self.save_checkpoint(w)
        return False, w

    def _gather(self, calls: dict, evaluation, results: dict) -> bool:
        """Collect a round's train calls and the previous row's evaluation, replacing
        what a lost trainer held. Returns True if a callback stopped the run."""
        stopped = False
        while calls or (evaluation is not None and not evaluation.done):
            refs = list(calls) + (evaluation.pending() if evaluation is not None else [])
            if not refs:   # shards orphaned by a loss, and no trainer was live to take them
                evaluation.requeue_orphans(self.members())
                continue
            ref, value, lost = self.next_done(refs)
            if evaluation is not None and evaluation.owns(ref):
                if lost is not None:
                    self.lose(evaluation.refs[ref][1], lost)
                    evaluation.reassign(ref, self.pool.live())
                    continue
                evaluation.record(ref, value)
                if evaluation.done:
                    self.finish_row(evaluation.finish())
                    stopped = self.run_state.stop
                continue
            slot = calls.pop(ref)
            if lost is not None:
                self.lose(slot, lost)
            elif not stopped:
                results[slot.index] = value
        return stopped


def train_sync(model_fn, dataset, *, trainers=None, initial_weights=None, resume=None,
               **options):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers, synchronously.

    ``dataset``: a registered name, a callable returning ``((x, y), (x_test, y_test))``
    (shipped once, run on each trainer), or ``datasets.partitioned(path)``. ``options``
    are the fields of :class:`TrainConfig` (``workers``, ``master_epochs``,
    ``worker_epochs``, ``batch_size``, ``rounds_per_epoch``, ``min_workers``,
    ``rejoin_timeout_s``, ``checkpoint_dir``, ``checkpoint_every``, ``target_accuracy``,
    ``patience``, ``seed``, ``callbacks``, ...). Stops after ``master_epochs``, or when
    ``target_accuracy`` is reached, or after ``patience`` evaluations without a better
    test loss. Returns a ``TrainResult`` (``history``, ``weights``, ``model``,
    ``events``). Starts an embedded cluster if ``ddlf.init()`` was not called.

    The trainers' CPUs are reserved first, together, as a placement group
    (``placement_strategy``, one bundle per trainer), so a run never starts half-placed.
    A trainer lost mid-run is replaced; see ``docs/training.md``. ``resume=DIR``
    continues from the newest checkpoint in DIR (and keeps checkpointing there).

    Raises ``TypeError`` for an unknown option, ``ValueError`` for a bad value or an
    unknown dataset, ``UnschedulableError`` (naming the demand) when the cluster can
    never hold the first trainers or has not freed them within ``placement_timeout_s``,
    ``TrainerStartError`` when ``model_fn`` or the dataset fails on a trainer,
    ``TooFewTrainersError`` when fewer than ``min_workers`` are left for longer than
    ``rejoin_timeout_s``, ``FileNotFoundError``/``CheckpointMismatchError`` for a
    ``resume`` directory without a checkpoint or of another model or dataset.
    """
    if resume is not None and options.get("checkpoint_dir") is None:
        options["checkpoint_dir"] = resume
    config = TrainConfig.from_options(options, caller="train_sync")
    return SyncScheme(model_fn, dataset, config, trainers).run(initial_weights, resume)
