"""What the asynchronous schemes share (``async``, ``easgd``, ``downpour``): a queue of work
that trainers take pieces from at their own pace, SSP's bound, and epochs cut by samples.

Trainers never wait for each other. Each epoch's permutation is cut into pieces
(:meth:`QueueMachine.cut_epoch`); an idle live trainer takes the next piece
(:meth:`QueueMachine.train_call` makes its call) unless ``staleness_bound = s`` says it is
more than ``s`` updates ahead of the slowest *live* trainer (SSP). Each result is
applied as it arrives (:meth:`QueueMachine.absorb`, the scheme's own rule). An epoch ends
when the trainers together have processed as many samples as the training set holds;
there is one history row per epoch, evaluated in shards on the trainers (several rows can
be out at once; they are handed over in order).

A lost trainer's piece goes back to the front of the queue for another trainer (so each
sample is still seen once per epoch), the bound stops counting it, and its replacement
joins as soon as it is built, with the update count of the slowest live trainer.

A call can start in one epoch and end in the next: its work is given to each epoch's row
by time interval (``ledger.py``), so a row's ``compute_s`` never exceeds its wall time.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, ClassVar

import numpy as np

from ..options import SchemeOptions, boolean, int_at_least, option, schedule
from ..records import HistoryRow, UpdateRecord
from .evaluation import Evaluations
from .events import CallDone, RowDone, TrainerLost, TrainersJoined
from .ledger import WorkLedger
from .machine import Machine, RunContext
from .orders import Call, EmitRow, NeedTrainers, Order, Stop
from .rates import InnerRate
from .slots import Slot

__all__ = ["QueueMachine", "QueueOptions", "ScaledQueueOptions", "Update"]

_SHARED = "shared"   # the queue key when every trainer holds the whole dataset


@dataclasses.dataclass
class QueueOptions(SchemeOptions):
    """What every queue scheme reads (:class:`QueueMachine`): SSP's bound and the
    trainers' rate. A scheme's options derive from this, adding its own."""

    staleness_bound: int | None = option(
        None, check=int_at_least(0),
        help="SSP: no trainer more than this many updates ahead of the slowest")
    lr_schedule: Any = option(
        None, check=schedule, cli=None,
        help="the trainers' rate: a Keras schedule or f(step) -> rate")


@dataclasses.dataclass
class ScaledQueueOptions(QueueOptions):
    """A queue scheme that applies each update as it arrives (``async``, ``downpour``)
    and may scale it down by how stale it is."""

    staleness_scaling: bool | None = option(
        None, check=boolean, cli="flag", help="divide each update by its staleness + 1")

    def defaults(self, config) -> dict:
        return {"staleness_scaling": False}


@dataclasses.dataclass
class Update:
    """A call in flight: the work it carries and the weights version it started from."""

    slot: Slot
    start_version: int
    lead: int         # how far ahead of the slowest live trainer it started
    piece: tuple | None   # (epoch, piece_no): what to redo if the trainer is lost


class QueueMachine(Machine):
    """The asynchronous loop. A scheme implements :meth:`cut_epoch`, :meth:`train_call`
    and :meth:`absorb`, and may implement :meth:`idle_call` and :meth:`start_version`;
    its options derive from :class:`QueueOptions`, whose settings this loop reads."""

    Options: ClassVar[type[SchemeOptions]] = QueueOptions

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.inner = InnerRate(self.options.lr_schedule)
        self.ledger = WorkLedger(ctx.t0)
        self.counts: dict[int, int] = {}            # updates completed per slot
        self.queues: dict[str, collections.deque] = {}
        self.planned: dict[str, int] = {}           # epochs planned into each queue
        self.inflight: dict[int, Update] = {}       # call id -> the update it carries
        self.samples_done = 0
        self.epoch_done = 0
        self.epoch_stats: list = []
        self.t_epoch = ctx.t0
        self.epoch_samples = 0
        self.evals = Evaluations(self.num_test, self.call)
        self.weights_at: dict[int, list] = {}       # row round -> the weights it reports
        self.last_row: int | None = None            # the round of the last row handed over
        self.w: list = []
        self.stopping = False
        self._pieces: dict = {}
        self._resumed: dict | None = None           # a checkpoint's position, for begin()

    # -- what a scheme implements --------------------------------------------------------------
    def cut_epoch(self, epoch: int, part: int | None) -> list:
        """Epoch ``epoch``'s pieces of indices (of partition ``part``), in order."""
        raise NotImplementedError

    def train_call(self, slot: Slot, indices: np.ndarray, want_state: bool) -> Call:
        """The call that trains ``slot``'s trainer on ``indices`` (with its optimizer state
        in the stats when ``want_state``)."""
        raise NotImplementedError

    def absorb(self, update: Update, value) -> bool:
        """Apply a call's result to the weights; False if it changed nothing (a Downpour
        call that did not push). The call's ``stats["samples"]`` count toward the epoch."""
        raise NotImplementedError

    def idle_call(self, slot: Slot, want_state: bool) -> Call | None:
        """A call for an idle trainer when no work is left (Downpour's last push); None."""
        return None

    def start_version(self, slot: Slot) -> int:
        """The weights version a call's result is relative to (for its staleness)."""
        return self.round_no

    # -- the loop ------------------------------------------------------------------------------
    def total_rows(self) -> int:
        return self.config.master_epochs

    def begin(self, weights: list) -> list[Order]:
        self.w = weights
        sizes = self.plan.part_sizes   # a partitioned dataset's
        self.epoch_samples = self.plan.num_train if sizes is None else sum(sizes.values())
        orders: list[Order] = []
        resumed, self._resumed = self._resumed, None
        if resumed is not None:
            self.t_epoch = self.now - resumed["epoch_elapsed"]
            self.ledger = WorkLedger.restore(resumed["ledger"], self.now)
            for row, snapshot in resumed["rows"]:
                orders += self._evaluate(row, snapshot)
        else:
            self.t_epoch = self.now
            self.ledger = WorkLedger(self.now)
        return orders + self._next()

    def _next(self) -> list[Order]:
        """After every event: hand out work, or end the run."""
        if self.stopping:
            # Running calls end first (their results are dropped); evaluations still out
            # are not waited for.
            last = self.weights_at.get(self.last_row) if self.last_row is not None else None
            return [] if self.inflight else [Stop(last if last is not None else self.w)]
        orders = self._feed()
        if self.evals.busy and self.live:   # rows that found no trainer when they were made
            orders += self.evals.joined(self.members())
            self.bytes_sent += self.evals.take_bytes()
        if self.inflight or self.evals.pending():
            return orders
        if self.evals.busy or self._work_left():
            need = self.too_few()
            if need:
                return orders + need
            if not self.evals.busy:
                # Work is left only in partitions whose trainer is gone: wait for it.
                return orders + [NeedTrainers(len(self.live) + 1, self._partitions_lost())]
            return orders
        return orders + [Stop(self.wire.model(self.w))]

    def _work_left(self) -> bool:
        sizes = self.plan.part_sizes
        keys = [_SHARED] if sizes is None else [str(j) for j in sizes]
        return any(self.queues.get(k) or self.planned.get(k, 0) < self.config.master_epochs
                   for k in keys) and self.epoch_done < self.config.master_epochs

    def _partitions_lost(self) -> str:
        missing = sorted(k for k in self.queues if self.queues[k] and k != _SHARED
                         and int(k) not in self.live)
        return (f"partition(s) {', '.join(missing)} still hold work but their trainers were lost "
                f"and not replaced within rejoin_timeout_s={self.config.rejoin_timeout_s:g} s; "
                "with a partitioned dataset only a partition's own trainer can train it. Add a "
                "node (ddlf-node start --address ...) or resume later from the last checkpoint.")

    # -- work ----------------------------------------------------------------------------------
    def _key(self, slot_index: int) -> str:
        return str(slot_index) if self.plan.partitioned else _SHARED

    def queue(self, slot_index: int) -> collections.deque:
        """The queue slot ``slot_index`` takes pieces from, planned one epoch at a time."""
        key = self._key(slot_index)
        q = self.queues.setdefault(key, collections.deque())
        if not q and self.planned.get(key, 0) < self.config.master_epochs:
            epoch = self.planned[key] = self.planned.get(key, 0) + 1
            q.extend((epoch, n) for n in range(len(self._epoch_pieces(epoch, slot_index))))
        return q

    def _epoch_pieces(self, epoch: int, slot_index: int) -> list:
        """Epoch ``epoch``'s pieces (for ``slot_index``'s partition), cached."""
        part = slot_index if self.plan.partitioned else None
        key = (epoch, part)
        pieces = self._pieces.get(key)
        if pieces is None:
            pieces = self.cut_epoch(epoch, part)
            for old in [k for k in self._pieces if k[0] < epoch - 1]:
                del self._pieces[old]
            self._pieces[key] = pieces
        return pieces

    def _piece(self, slot_index: int, piece: tuple) -> np.ndarray:
        epoch, n = piece
        return self._epoch_pieces(epoch, slot_index)[n]

    def _feed(self) -> list[Order]:
        """Give every idle live trainer its next piece, as far as the SSP bound allows."""
        busy = {u.slot.index for u in self.inflight.values()}
        live = self.members()
        out: list[Order] = []
        for slot in live:
            if slot.index not in busy:
                out += self._dispatch(slot, live)
        return out

    def _dispatch(self, slot: Slot, live: list[Slot]) -> list[Order]:
        cfg = self.config
        counts = self.counts
        lead = counts.setdefault(slot.index, 0) - min(counts.setdefault(s.index, 0) for s in live)
        q = self.queue(slot.index)
        want_state = (self.ctx.checkpointing and cfg.checkpoint_every is not None
                      and counts[slot.index] % cfg.checkpoint_every == 0)
        piece = None
        if not q:
            # No work left for it (the bound does not apply: nothing new is trained).
            call = self.idle_call(slot, want_state)
            if call is None:
                return []
        elif self.options.staleness_bound is not None and lead > self.options.staleness_bound:
            return []   # SSP: wait for the slowest live trainer to catch up
        else:
            piece = q.popleft()
            call = self.train_call(slot, self._piece(slot.index, piece), want_state)
        self.ledger.dispatched(call.id, slot.index, self.now)
        self.inflight[call.id] = Update(slot, self.start_version(slot), lead, piece)
        return [call]

    def rate_kwargs(self) -> dict:
        """``learning_rate=`` for the next call when ``lr_schedule`` is set; the step is
        the samples applied so far over ``workers * batch_size`` (one trainer's steps)."""
        cfg = self.config
        step = self.samples_done * cfg.worker_epochs // (cfg.workers * cfg.batch_size)
        rate = self.inner.at(self.round_no, step, cfg.workers)
        return {} if rate is None else {"learning_rate": rate}

    # -- events --------------------------------------------------------------------------------
    def on_done(self, event: CallDone) -> list[Order]:
        orders: list[Order] = []
        update = self.inflight.pop(event.call, None)
        if update is not None:
            if not self.stopping:
                orders = self._apply(event.call, update, event.value)
        elif self.evals.owns(event.call) and not self.stopping:
            # (Once stopped, rows still being evaluated are not handed over.)
            self.evals.record(event.call, event.value)
            orders = self._emit_ready()
        return orders + self._next()

    def _apply(self, call_id: int, update: Update, value) -> list[Order]:
        j = update.slot.index
        stats = value[1]
        self.ledger.finished(call_id, stats["compute_s"], stats.get("eval_s", 0.0), self.now)
        self.keep_state(j, stats)
        staleness = self.round_no - update.start_version
        self.counts[j] = self.counts.get(j, 0) + 1
        self.epoch_stats.append(dict(stats))
        if not self.absorb(update, value):
            return []
        self.round_no += 1
        record: UpdateRecord = {"trainer": j, "start_version": update.start_version,
                                "applied_version": self.round_no, "staleness": staleness,
                                "lead": update.lead, "loss": stats["loss"]}
        self.updates.append(record)
        self.samples_done += stats["samples"]
        orders = self._close_epochs()
        if self.checkpoint_due(self.round_no):
            orders.append(self.checkpoint(self.w, self.pending_arrays()))
        return orders

    def _close_epochs(self) -> list[Order]:
        cfg = self.config
        orders: list[Order] = []
        while (self.epoch_done < cfg.master_epochs
               and self.samples_done >= (self.epoch_done + 1) * self.epoch_samples):
            self.epoch_done += 1
            # By interval: calls that straddle the epoch's end count on both sides of it.
            row = self.new_row(self.round_no, self.epoch_done, self.epoch_stats,
                               self.now - self.t_epoch, work=self.ledger.close(self.now))
            row["workers"] = len({s["index"] for s in self.epoch_stats})
            self.epoch_stats, self.t_epoch = [], self.now
            orders += self._evaluate(row, self.w)
        return orders

    def _evaluate(self, row: HistoryRow, weights: list) -> list[Order]:
        """Evaluate ``row``'s weights in shards, each queued on a trainer behind its call."""
        orders: list[Order] = []
        if self.num_test:
            bc = self.wire.broadcast(weights)
            orders = self.evals.add(row, bc, self.members())
            self.bytes_sent += bc.take_bytes()
        else:
            self.evals.add(row, None, [])
        # What the row reports: the weights the trainers evaluate (``weights`` unless a
        # lossy codec sends them).
        self.weights_at[row["round"]] = self.wire.model(weights)
        return orders + self._emit_ready()

    def _emit_ready(self) -> list[Order]:
        rows = self.evals.ready()
        for row in rows:
            self.last_row = row["round"]
            for old in [r for r in self.weights_at if r < self.last_row]:
                del self.weights_at[old]
        return [EmitRow(row) for row in rows]

    def on_lost(self, event: TrainerLost) -> list[Order]:
        for call_id in event.calls:
            update = self.inflight.pop(call_id, None)
            if update is not None:
                self.ledger.dropped(call_id)
                if update.piece is not None:   # its piece goes back to the front
                    self.queue(update.slot.index).appendleft(update.piece)
        self.forget(event.slot)
        orders = self.evals.lost(event.calls, self.members())
        self.bytes_sent += self.evals.take_bytes()
        return orders + self._next()

    def forget(self, slot: Slot) -> None:
        """``slot``'s trainer was lost: what the scheme kept for it (Downpour's unpushed
        pieces) is undone."""

    def admit(self, slots) -> list[Order]:
        orders = super().admit(slots)
        joining = {s.index for s in slots}
        floor = min((self.counts.get(j, 0) for j in self.live if j not in joining), default=None)
        for slot in slots:
            # A newcomer counts as the slowest live trainer: SSP neither waits for it nor
            # lets it run ahead.
            self.counts[slot.index] = floor if floor is not None else self.counts.get(slot.index, 0)
        return orders

    def on_joined(self, event: TrainersJoined) -> list[Order]:
        orders = self.evals.joined(self.members())
        self.bytes_sent += self.evals.take_bytes()
        return orders + self._next()

    def on_row_done(self, event: RowDone) -> list[Order]:
        if event.stop:
            self.stopping = True
        return self._next()

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoint_due(self, round_no: int) -> bool:
        """Every ``checkpoint_every`` rounds, a round being ``workers`` updates."""
        every = self.config.checkpoint_every
        return (self.ctx.checkpointing and every is not None and round_no > 0
                and round_no % (every * self.config.workers) == 0)

    def unapplied(self) -> list:
        """``(piece, slot index)`` of the work whose result the weights do not hold yet."""
        return [(u.piece, u.slot.index) for u in self.inflight.values() if u.piece is not None]

    def position(self) -> dict:
        queues = {k: [list(p) for p in q] for k, q in self.queues.items()}
        for piece, slot_index in self.unapplied():   # redone after a resume
            queues.setdefault(self._key(slot_index), []).insert(0, list(piece))
        return {"counts": {str(k): v for k, v in self.counts.items()}, "queues": queues,
                "planned": dict(self.planned), "samples_done": self.samples_done,
                "epoch_done": self.epoch_done, "epoch_stats": list(self.epoch_stats),
                "epoch_elapsed": self.now - self.t_epoch,
                "ledger": self.ledger.position(self.now),
                "pending_rows": [dict(row) for row in self.evals.rows()]}

    def pending_arrays(self) -> dict:
        """The weights of the rows still out, by position (a checkpoint's arrays)."""
        return {f"pending{i}": self.weights_at[row["round"]]
                for i, row in enumerate(self.evals.rows())}

    def restore(self, ckpt) -> None:
        pos = ckpt.meta["position"]
        self.counts = {int(k): v for k, v in pos["counts"].items()}
        self.queues = {k: collections.deque(tuple(p) for p in q) for k, q in pos["queues"].items()}
        self.planned = dict(pos["planned"])
        self.samples_done = pos["samples_done"]
        self.epoch_done = pos["epoch_done"]
        self.epoch_stats = list(pos["epoch_stats"])
        rows: list[tuple[HistoryRow, Any]] = [
            (row, [np.array(a, copy=True) for a in ckpt.arrays[f"pending{i}"]])
            for i, row in enumerate(pos["pending_rows"])]
        self._resumed = {"epoch_elapsed": float(pos["epoch_elapsed"]),
                         "ledger": pos.get("ledger", {}), "rows": rows}
