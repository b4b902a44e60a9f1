"""Asynchronous data parallelism: the paper's Algorithm 3, improved, surviving lost trainers.

Trainers never wait for each other. As each delta arrives the driver applies
``delta_j / K`` (divided by ``staleness + 1`` with ``staleness_scaling``), where K is the
number of trainers live now, then gives that trainer the newest weights and a fresh piece
of work. ``staleness_bound = s`` is SSP: a trainer may start its next update only while it
is at most ``s`` updates ahead of the slowest *live* trainer. An epoch ends when the
trainers together have processed as many samples as the training set holds; there is
one history row per epoch.

A lost trainer's piece goes back to the front of the queue for another trainer (so
each sample is still seen once per epoch), the bound stops counting it, and its
replacement joins as soon as it is built, with the newest weights and the update count
of the slowest live trainer.

A call can start in one epoch and end in the next: its work is given to each epoch's row
by time interval (``ledger.py``), so a row's ``compute_s`` never exceeds its wall time.

``easgd.py`` and ``downpour.py`` are asynchronous too: they subclass this scheme and
change what a call does (``_call``) and how its result is applied (``_absorb``).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

import numpy as np

from ..config import TrainConfig
from ..records import HistoryRow, UpdateRecord
from .averaging import apply_delta
from .base import Scheme, TooFewTrainersError
from .ledger import WorkLedger
from .pool import Slot
from .rates import InnerRate
from .stragglers import refuse_sync_only
from .wire import PLAIN, WHOLE, Broadcast

__all__ = ["AsyncScheme", "train_async"]

_SHARED = "shared"   # the queue key when every trainer holds the whole dataset


@dataclasses.dataclass
class _Update:
    """A train call in flight."""

    slot: Slot
    start_version: int
    lead: int
    piece: tuple      # (epoch, piece_no): what to redo if the trainer is lost


class AsyncScheme(Scheme):
    name = "async"
    # Trainers hold different versions, so weights go down whole (encoded or not); a down
    # codec that sends changes of one shared replica is refused (schemes/wire.py).
    wire_modes: tuple[str, ...] = (PLAIN, WHOLE)
    options: tuple[str, ...] = ("rounds_per_epoch", "staleness_bound", "staleness_scaling",
                                "lr_schedule")
    defaults = {"rounds_per_epoch": 1, "staleness_scaling": False}

    def __init__(self, model_fn, dataset, config: TrainConfig, trainers=None):
        refuse_sync_only(config)
        super().__init__(model_fn, dataset, config, trainers)
        self.inner = InnerRate(self.config.lr_schedule)
        self.ledger: WorkLedger | None = None
        self.updates: list[UpdateRecord] = []
        self.counts: dict[int, int] = {}            # updates completed per slot
        self.queues: dict[str, collections.deque] = {}
        self.planned: dict[str, int] = {}           # epochs planned into each queue
        self.inflight: dict[Any, _Update] = {}
        self.samples_done = 0
        self.epoch_done = 0
        self.epoch_stats: list = []
        self.t_epoch = 0.0
        self.evaluations: list = []                 # [row, ShardedEvaluation | None], in order
        self.weights_at: dict[int, list] = {}       # row round -> the weights it reports
        self.w: list = []
        self._w_ref: Any = None   # a wire Broadcast of the weights of round _w_ref_version
        self._w_ref_version = -1
        self._pieces: dict = {}

    def total_rows(self) -> int:
        return self.config.master_epochs

    # -- the loop ----------------------------------------------------------------------------
    def loop(self, w: list) -> list:
        self.w = w
        now = time.perf_counter()
        self.t_epoch = now - getattr(self, "_epoch_elapsed", 0.0)
        self.ledger = (WorkLedger.restore(self._ledger_pos, now) if hasattr(self, "_ledger_pos")
                       else WorkLedger(self.t_epoch))
        self.epoch_samples = (self.plan.num_train if not self.plan.partitioned
                              else sum(self.plan.part_sizes.values()))
        for row, snapshot in getattr(self, "_resumed_rows", []):
            self._evaluate(row, snapshot)
        self._feed(self.members())
        while not self.run_state.stop:
            if not self.inflight and not self._evaluating():
                if not self._work_left():
                    break
                live = self.members()        # every trainer was lost: wait for some
                self._feed(live)
                if not self.inflight:
                    self._wait_for_partition(live)
                continue
            refs = list(self.inflight) + self._evaluating()
            ref, value, lost = self.next_done(refs)
            if ref in self.inflight:
                update = self.inflight.pop(ref)
                if lost is not None:
                    self.ledger.dropped(ref)
                    self.lose(update.slot, lost)
                    self._lost_update(update)
                else:
                    self._apply(ref, update, value)
            else:
                self._evaluation_done(ref, value, lost)
            joined = self.pool.poll()
            if joined:
                self.admit(joined)
            self._feed(self.pool.live())
        if self.inflight:   # stopped early: let running calls end; their deltas are dropped
            while self.inflight:
                ref, _value, _lost = self.next_done(list(self.inflight))
                del self.inflight[ref]
        # Evaluations still out: wait for them, unless a callback stopped the run.
        while not self.run_state.stop and self._evaluating():
            ref, value, lost = self.next_done(self._evaluating())
            self._evaluation_done(ref, value, lost)
        if self.run_state.stop and self.history.rows:
            return self.weights_at.get(self.history.rows[-1]["round"], self.w)
        return self.wire.model(self.w)

    def _wait_for_partition(self, live: list) -> None:
        """Work is left only in partitions whose trainer is gone: wait for its replacement."""
        joined = self.pool.wait_for(len(live) + 1, self.config.rejoin_timeout_s)
        if joined:
            self.admit(joined)
            return
        missing = sorted(k for k in self.queues if self.queues[k] and k != _SHARED
                         and int(k) not in {s.index for s in live})
        raise TooFewTrainersError(
            f"partition(s) {', '.join(missing)} still hold work but their trainers were lost and "
            f"not replaced within rejoin_timeout_s={self.config.rejoin_timeout_s:g} s; with a "
            "partitioned dataset only a partition's own trainer can train it. Add a node "
            "(ddlf-node start --address ...) or resume later from the last checkpoint.")

    def _work_left(self) -> bool:
        keys = [_SHARED] if not self.plan.partitioned else [str(j) for j in self.plan.part_sizes]
        return any(self.queues.get(k) or self.planned.get(k, 0) < self.config.master_epochs
                   for k in keys) and self.epoch_done < self.config.master_epochs

    # -- work --------------------------------------------------------------------------------
    def _key(self, slot_index: int) -> str:
        return str(slot_index) if self.plan.partitioned else _SHARED

    def _queue(self, slot_index: int) -> collections.deque:
        """The queue slot ``slot_index`` takes pieces from, planned one epoch at a time."""
        key = self._key(slot_index)
        q = self.queues.setdefault(key, collections.deque())
        if not q and self.planned.get(key, 0) < self.config.master_epochs:
            epoch = self.planned[key] = self.planned.get(key, 0) + 1
            q.extend((epoch, n) for n in range(len(self._epoch_pieces(epoch, slot_index))))
        return q

    def _epoch_pieces(self, epoch: int, slot_index: int) -> list:
        """Epoch ``epoch``'s pieces of work (for ``slot_index``'s partition), cached."""
        part = slot_index if self.plan.partitioned else None
        key = (epoch, part)
        pieces = self._pieces.get(key)
        if pieces is None:
            pieces = self._cut_epoch(epoch, part)
            for old in [k for k in self._pieces if k[0] < epoch - 1]:
                del self._pieces[old]
            self._pieces[key] = pieces
        return pieces

    def _cut_epoch(self, epoch: int, part: int | None) -> list:
        """How an epoch's permutation is cut: ``rounds_per_epoch`` pieces per trainer."""
        return [p for _, p in self.plan.async_pieces(epoch, self.config.workers, part)]

    def _piece(self, slot_index: int, piece: tuple) -> np.ndarray:
        epoch, n = piece
        return self._epoch_pieces(epoch, slot_index)[n]

    def _feed(self, live: list) -> None:
        """Give every idle live trainer its next piece, as far as the SSP bound allows."""
        busy = {u.slot.index for u in self.inflight.values()}
        for slot in live:
            if slot.index not in busy:
                self._dispatch(slot, live)

    def _dispatch(self, slot: Slot, live: list) -> None:
        cfg = self.config
        counts = self.counts
        lead = counts.setdefault(slot.index, 0) - min(counts.setdefault(s.index, 0) for s in live)
        q = self._queue(slot.index)
        want_state = self.writer is not None and counts[slot.index] % cfg.checkpoint_every == 0
        if not q:
            # No work left for it (the bound does not apply: nothing new is trained).
            piece, ref = None, self._call_without_work(slot, want_state)
            if ref is None:
                return
        elif cfg.staleness_bound is not None and lead > cfg.staleness_bound:
            return   # SSP: wait for the slowest live trainer to catch up
        else:
            piece = q.popleft()
            ref = self._call(slot, self._piece(slot.index, piece), want_state)
        self.ledger.dispatched(ref, slot.index, time.perf_counter())
        self.inflight[ref] = _Update(slot, self._start_version(slot), lead, piece)

    def _call_without_work(self, slot: Slot, want_state: bool):
        """A call for an idle trainer when no work is left (Downpour's last push); None."""
        return None

    def _start_version(self, slot: Slot) -> int:
        """The weights version a call's result is relative to (for its staleness)."""
        return self.round_no

    def _rate_kwargs(self) -> dict:
        """``learning_rate=`` for the next call when ``lr_schedule`` is set; the step is
        the samples applied so far over ``workers * batch_size`` (one trainer's steps)."""
        cfg = self.config
        step = self.samples_done * cfg.worker_epochs // (cfg.workers * cfg.batch_size)
        rate = self.inner.at(self.round_no, step, cfg.workers)
        return {} if rate is None else {"learning_rate": rate}

    def _shared_weights_ref(self):
        """One broadcast of the current weights per version (a ``put``, encoded as
        ``compression=`` says: schemes/wire.py), shared by every call."""
        if self._w_ref_version != self.round_no:
            self._w_ref, self._w_ref_version = self.broadcast(self.w), self.round_no
        return self._w_ref

    def _call(self, slot: Slot, indices: np.ndarray, want_state: bool):
        """Start ``slot``'s trainer on ``indices``; return the call's ref."""
        cfg = self.config
        bc = self._shared_weights_ref()
        # A checkpoint call also brings back the trainer's error-feedback residual, as it
        # brings its optimizer state: both are saved as of that trainer's last such call.
        ref = bc.train(slot, indices, cfg.worker_epochs, cfg.batch_size,
                       return_state=want_state, residual=want_state, **self._rate_kwargs())
        self.bytes_sent += bc.take_bytes() + indices.nbytes
        return ref

    def _lost_update(self, update: _Update) -> None:
        """``update``'s trainer was lost: its piece goes back to the front of the queue."""
        if update.piece is not None:
            self._queue(update.slot.index).appendleft(update.piece)

    def _absorb(self, update: _Update, value) -> bool:
        """Apply a call's result to the weights; False if it changed nothing (a Downpour
        call that did not push). The call's ``stats["samples"]`` count toward the epoch."""
        cfg = self.config
        payload, stats = value
        delta, size = self.wire.received(payload)
        self.bytes_received += size
        staleness = self.round_no - update.start_version
        scale = 1.0 / max(1, len(self.pool.live()))
        if cfg.staleness_scaling:
            scale /= staleness + 1
        self.w = apply_delta(self.w, delta, scale)
        return True

    def _apply(self, ref, update: _Update, value) -> None:
        j = update.slot.index
        stats = value[1]
        self.ledger.finished(ref, stats["compute_s"], stats.get("eval_s", 0.0),
                             time.perf_counter())
        self.keep_state(j, stats)
        staleness = self.round_no - update.start_version
        self.counts[j] = self.counts.get(j, 0) + 1
        self.epoch_stats.append(dict(stats))
        if not self._absorb(update, value):
            return
        self.round_no += 1
        self.updates.append({"trainer": j, "start_version": update.start_version,
                             "applied_version": self.round_no, "staleness": staleness,
                             "lead": update.lead, "loss": stats["loss"]})
        self.samples_done += stats["samples"]
        self._close_epochs()
        if self.checkpoint_due(self.round_no):
            self.save_checkpoint(self.w, self._pending_arrays())

    def _close_epochs(self) -> None:
        cfg = self.config
        while (self.epoch_done < cfg.master_epochs
               and self.samples_done >= (self.epoch_done + 1) * self.epoch_samples):
            self.epoch_done += 1
            now = time.perf_counter()
            # By interval: calls that straddle the epoch's end count on both sides of it.
            row = self.new_row(self.round_no, self.epoch_done, self.epoch_stats, now - self.t_epoch,
                               work=self.ledger.close(now))
            row["workers"] = len({s["index"] for s in self.epoch_stats})
            self.epoch_stats, self.t_epoch = [], now
            self._evaluate(row, self.w)

    # -- evaluation --------------------------------------------------------------------------
    def _evaluate(self, row: HistoryRow, weights: list) -> None:
        evaluation = None
        if self.num_test:
            # Evaluated in shards, each queued on a trainer behind its train call.
            bc = self.broadcast(weights)
            evaluation = self.evaluation(row, bc)
            live = self.pool.live()
            if live:
                evaluation.submit(live)
                self.bytes_sent += bc.take_bytes()
            else:
                evaluation.submit([])   # no trainer now: queued when one joins
        # What the row reports: the weights the trainers evaluate (``weights`` unless a
        # lossy codec sends them).
        self.weights_at[row["round"]] = self.wire.model(weights)
        self.evaluations.append([row, evaluation])
        self._finish_rows()

    def _evaluating(self) -> list:
        live = None
        out = []
        for _row, ev in self.evaluations:
            if ev is None:
                continue
            if ev.shards == 0 or ev.orphaned:
                live = live if live is not None else self.pool.live()
                if live:
                    if ev.shards == 0:
                        ev.submit(live)
                    else:
                        ev.requeue_orphans(live)
                    if isinstance(ev.weights_ref, Broadcast):
                        self.bytes_sent += ev.weights_ref.take_bytes()
            out += ev.pending()
        return out

    def _evaluation_done(self, ref, value, lost) -> None:
        for _row, ev in self.evaluations:
            if ev is not None and ev.owns(ref):
                if lost is not None:
                    self.lose(ev.refs[ref][1], lost)
                    ev.reassign(ref, self.pool.live())
                else:
                    ev.record(ref, value)
                break
        self._finish_rows()

    def _finish_rows(self) -> None:
        """Hand rows to the callbacks in order, as their evaluations complete."""
        while self.evaluations:
            row, ev = self.evaluations[0]
            if ev is not None and not ev.done:
                return
            self.evaluations.pop(0)
            self.finish_row(ev.finish() if ev is not None else row)
            for old in [r for r in self.weights_at if r < row["round"]]:
                del self.weights_at[old]

    # -- membership and checkpoints ----------------------------------------------------------
    def admit(self, slots) -> None:
        super().admit(slots)
        live = [s for s in self.pool.live() if s not in slots]
        floor = min((self.counts.get(s.index, 0) for s in live), default=None)
        for slot in slots:
            # A newcomer counts as the slowest live trainer: SSP neither waits for it nor
            # lets it run ahead.
            self.counts[slot.index] = floor if floor is not None else self.counts.get(slot.index, 0)

    def event_round(self) -> int:
        return self.round_no + 1

    def checkpoint_due(self, round_no: int) -> bool:
        """Every ``checkpoint_every`` rounds, a round being ``workers`` updates."""
        every = self.config.checkpoint_every
        return (self.writer is not None and every is not None and round_no > 0
                and round_no % (every * self.config.workers) == 0)

    def position(self) -> dict:
        queues = {k: [list(p) for p in q] for k, q in self.queues.items()}
        for piece, slot_index in self._unapplied():   # redone after a resume
            queues.setdefault(self._key(slot_index), []).insert(0, list(piece))
        return {"counts": {str(k): v for k, v in self.counts.items()}, "queues": queues,
                "planned": dict(self.planned), "samples_done": self.samples_done,
                "epoch_done": self.epoch_done, "epoch_stats": list(self.epoch_stats),
                "epoch_elapsed": time.perf_counter() - self.t_epoch,
                "ledger": self.ledger.position(time.perf_counter()) if self.ledger else {},
                "pending_rows": [dict(row) for row, ev in self.evaluations]}

    def _unapplied(self) -> list:
        """``(piece, slot index)`` of the work whose result the weights do not hold yet."""
        return [(u.piece, u.slot.index) for u in self.inflight.values() if u.piece is not None]

    def _pending_arrays(self) -> dict:
        out = {}
        for i, (row, _ev) in enumerate(self.evaluations):
            out[f"pending{i}"] = self.weights_at[row["round"]]
        return out

    def restore_position(self, ckpt) -> None:
        pos = ckpt.meta["position"]
        self.counts = {int(k): v for k, v in pos["counts"].items()}
        self.queues = {k: collections.deque(tuple(p) for p in q) for k, q in pos["queues"].items()}
        self.planned = dict(pos["planned"])
        self.samples_done = pos["samples_done"]
        self.epoch_done = pos["epoch_done"]
        self.epoch_stats = list(pos["epoch_stats"])
        self._epoch_elapsed = float(pos["epoch_elapsed"])
        self._ledger_pos = pos.get("ledger", {})
        self._resumed_rows = [(row, [np.array(a, copy=True) for a in ckpt.arrays[f"pending{i}"]])
                              for i, row in enumerate(pos["pending_rows"])]


def train_async(model_fn, dataset, *, trainers=None, initial_weights=None, resume=None,
                **options):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers, asynchronously.

    Same arguments and errors as :func:`train_sync`, plus the options
    ``staleness_bound`` (SSP: no trainer runs more than that many updates ahead of the
    slowest live one) and ``staleness_scaling`` (divide a delta by its staleness + 1).
    ``result.updates`` records, per applied update, the trainer, the versions, its
    staleness and how far ahead of the slowest trainer it started (``lead``); after a
    resume it holds the resumed part only. ``checkpoint_every`` counts rounds of
    ``workers`` updates.
    """
    from .api import train

    return train(model_fn, dataset, "async", trainers=trainers, initial_weights=initial_weights,
                 resume=resume, **options)
