"""Synchronous data parallelism: the paper's Algorithm 6, surviving lost trainers.

Each round the driver ``put``s the weights once, sends every live trainer its index
partition, waits for their deltas and applies their mean weighted by samples,
``w ← w − Σ_j (n_j / Σn) delta_j``. ``rounds_per_epoch = r`` averages r times per
epoch, each on 1/r of the epoch's permutation (local SGD).

The driver's step on the averaged delta is an outer optimizer (``outer.py``): plain
averaging by default-free arithmetic (``outer_lr=1``, no momentum), or momentum/Nesterov
with a rate that may follow a schedule and the linear scaling rule for K
(``lr_scaling='outer'``, warmed up over ``warmup_rounds``). The trainers' own rate can
follow ``lr_schedule`` (or ``lr_scaling='inner'``), set by the driver each round.

A trainer lost mid-round costs only its own share of that round: the round completes
with the deltas that arrived, each weighted by its samples, and the lost trainer's
replacement (started at once, in its reserved slot) joins at the next round with the
current weights. A round in which every trainer was lost is run again once trainers are
back. Everything the round depends on (the epoch's permutation, the trainers present,
the order of the sum) is a function of the seed, the round number and the slots, so a
run resumed from a checkpoint ends with the same weights as one that was never stopped.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..config import TrainConfig
from ..records import HistoryRow
from .averaging import weighted_mean
from .balance import RateBalancer
from .base import Scheme
from .outer import OuterOptimizer
from .rates import InnerRate, steps_in
from .stragglers import LateDeltas, within_window
from .wire import CHANGES, PLAIN, WHOLE

__all__ = ["SyncScheme", "train_sync", "AVERAGING_OPTIONS", "averaging_defaults",
           "check_averaging", "outer_optimizer", "inner_rate", "default_rounds", "fill_rounds",
           "STEPS_PER_ROUND"]

# The settings of a scheme that averages deltas in rounds (sync, allreduce).
AVERAGING_OPTIONS = ("rounds_per_epoch", "eval_every", "outer_lr", "outer_momentum",
                     "nesterov", "lr_scaling", "warmup_rounds", "lr_schedule")
# Local steps per trainer per round that rounds_per_epoch aims at when left out.
STEPS_PER_ROUND = 16


def default_rounds(per_trainer: float, batch_size: int, steps: int = STEPS_PER_ROUND) -> int:
    """Rounds per epoch that give a trainer with ``per_trainer`` samples an epoch about
    ``steps`` local steps per round (at least one round)."""
    return max(1, round(per_trainer / (batch_size * steps)))


def averaging_defaults(config: TrainConfig, defaults: dict) -> dict:
    """``defaults`` adjusted to what the run set itself: with ``outer_momentum=0`` Nesterov
    is off and the outer rate is 1 (a plain average, unless ``outer_lr`` says otherwise);
    with ``lr_scaling='inner'`` the outer rate is 1 (the K rule acts on the trainers);
    with ``lr_scaling='none'`` there is nothing to warm up."""
    out = dict(defaults)
    if config.outer_momentum == 0:
        out["nesterov"] = False
        if config.outer_lr is None:
            out["outer_lr"] = 1.0
    if config.lr_scaling == "inner" and config.outer_lr is None:
        out["outer_lr"] = 1.0
    if config.lr_scaling == "none":
        out["warmup_rounds"] = 0
    return out


def fill_rounds(config: TrainConfig, per_trainer: float) -> TrainConfig:
    """``config`` with the settings that depend on the data's size filled in, where left
    out: ``rounds_per_epoch`` (:func:`default_rounds`), ``eval_every`` (once per epoch)
    and ``warmup_rounds`` (half an epoch's rounds when a K rule is on)."""
    fill: dict[str, Any] = {}
    rounds = config.rounds_per_epoch
    if rounds is None:
        rounds = fill["rounds_per_epoch"] = default_rounds(per_trainer, config.batch_size)
    if config.eval_every is None:
        fill["eval_every"] = rounds
    if config.warmup_rounds is None:
        fill["warmup_rounds"] = max(1, rounds // 2) if config.lr_scaling != "none" else 0
    return dataclasses.replace(config, **fill) if fill else config


def check_averaging(config: TrainConfig) -> None:
    """``ValueError`` for averaging settings that contradict each other."""
    if config.warmup_rounds and config.lr_scaling == "none":
        raise ValueError(f"warmup_rounds={config.warmup_rounds} ramps up the linear scaling "
                         "rule for K: set lr_scaling='outer' or 'inner' too, or leave it out")
    if config.nesterov and not config.outer_momentum:
        raise ValueError("nesterov=True needs outer_momentum > 0")


def outer_optimizer(config: TrainConfig) -> OuterOptimizer:
    """The driver's outer step for a resolved ``config``."""
    return OuterOptimizer(config.outer_lr, config.outer_momentum, config.nesterov,
                          scale_with_k=config.lr_scaling == "outer",
                          warmup_rounds=config.warmup_rounds)


def inner_rate(config: TrainConfig, base: float | None) -> InnerRate:
    """The trainers' rate per round for a resolved ``config``; ``base``: their own rate."""
    return InnerRate(config.lr_schedule, scale_with_k=config.lr_scaling == "inner",
                     warmup_rounds=config.warmup_rounds, base=base)


class SyncScheme(Scheme):
    name = "sync"
    # Every trainer of a round gets the same version: a replica of changes can be shared.
    wire_modes: tuple[str, ...] = (PLAIN, WHOLE, CHANGES)
    # Averaging settings, and the slow-node ones (stragglers.py, balance.py) that act on
    # this scheme's round barrier.
    options: tuple[str, ...] = AVERAGING_OPTIONS + ("backup_workers", "balance")
    # Chosen on a validation split (benchmarks/explore_defaults.py, docs/training.md "the
    # defaults"): rounds of about STEPS_PER_ROUND local steps (rounds_per_epoch, from the
    # data's size) and DiLoCo's outer step, Nesterov momentum 0.9 at rate 0.7 with no K
    # rule (so no warm-up), one evaluation per epoch (eval_every). With paper_cnn's Adam
    # they reached 0.85 validation accuracy in the fewest epochs tried; the outer
    # momentum also speeds up a user's Adam at 1e-3 and plain SGD (slows SGD with
    # momentum: see the docs). Settings left None here are filled in once the data's size
    # is known (_make_plan).
    defaults = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True, "lr_scaling": "none",
                "backup_workers": 0, "balance": False}

    def __init__(self, model_fn, dataset, config: TrainConfig, trainers=None):
        super().__init__(model_fn, dataset, config, trainers)
        self.outer: OuterOptimizer | None = None   # needs the rounds: set in _make_plan
        self.inner: InnerRate | None = None     # needs the trainers' rate: set in loop
        self.inner_steps = 0        # a trainer's optimizer steps so far (lr_schedule's step)
        self.pending_row: HistoryRow | None = None   # the last row, whose weights the next round evaluates
        # Slow nodes (stragglers.py, balance.py): late calls, and each slot's samples/s.
        self.late = LateDeltas(config.backup_workers or 0, balanced=bool(config.balance))
        self.balancer = RateBalancer() if config.balance else None
        if config.backup_workers:
            self.updates: list = []  # every applied delta, with its staleness

    @classmethod
    def scheme_defaults(cls, config: TrainConfig) -> dict:
        return averaging_defaults(config, cls.defaults)

    @classmethod
    def validate(cls, config: TrainConfig) -> None:
        check_averaging(config)

    def total_rows(self) -> int:
        return self.config.master_epochs * self.config.rounds_per_epoch

    def _make_plan(self, infos: list):
        """Fill in the settings that depend on the data's size (:func:`fill_rounds`),
        make the outer optimizer, then plan as every scheme does."""
        cfg = self.config
        if infos[0].get("partitioned"):
            per_trainer = max(s.info["num_train"] for s in self.pool.live())
        else:
            per_trainer = infos[0]["num_train"] / cfg.workers
        self.config = fill_rounds(cfg, per_trainer)
        self.outer = outer_optimizer(self.config)
        return super()._make_plan(infos)

    def position(self) -> dict:
        return {"pending_row": self.pending_row, "late": self.late.to_json(),
                "rates": self.balancer.to_json() if self.balancer else None,
                "outer_steps": self.outer.steps, "inner_steps": self.inner_steps}

    def restore_position(self, ckpt) -> None:
        pos = ckpt.meta["position"]
        self.pending_row = pos.get("pending_row")
        if self.balancer is not None:
            self.balancer = RateBalancer.from_json(pos.get("rates"))
        self.outer.load_state(ckpt.arrays.get("outer", []), pos.get("outer_steps", self.round_no))
        self.inner_steps = int(pos.get("inner_steps", 0))

    def lose(self, slot, error) -> None:
        super().lose(slot, error)
        if self.balancer is not None:
            self.balancer.forget(slot.index)

    def loop(self, w: list) -> list:
        cfg = self.config
        R = cfg.rounds_per_epoch
        if self.balancer is not None and self.plan.partitioned:
            raise ValueError("balance=True needs every trainer to hold the whole dataset: with "
                             "datasets.partitioned(...) trainer j can train only partition j")
        self.inner = inner_rate(cfg, self.pool.live()[0].info.get("learning_rate"))
        while self.round_no < self.total_rows():
            epoch, r = divmod(self.round_no, R)
            stopped, w = self._round(w, epoch + 1, r)
            if stopped:
                return self.wire.model(w)
        if self.pending_row is not None:   # the last weights' evaluation
            bc = self.broadcast(w)
            evaluation = self.evaluation(self.pending_row, bc)
            self.pending_row = None
            if evaluation is not None:
                evaluation.submit(self.members())
                self._gather({}, evaluation, {})
                self.bytes_sent += bc.take_bytes()
        # The weights the trainers hold, which the last row reports: w itself unless a
        # lossy codec sends the weights (schemes/wire.py).
        return self.wire.model(w)

    def _round(self, w: list, epoch: int, r: int) -> tuple[bool, list]:
        """Run one round; return (stopped early, weights)."""
        cfg = self.config
        t_round = time.perf_counter()
        live = self.late.idle(self.members())   # a trainer still on a late call gets no work
        while not live:   # every live trainer is late: this round starts with the first back
            self._late_done(*self.next_done(self.late.refs()))
            live = self.late.idle(self.members())
        shares = self.balancer.shares([s.index for s in live]) if self.balancer else None
        pieces = self.plan.round_pieces(epoch, r, [s.index for s in live], shares)
        bc = self.broadcast(w)
        evaluation = None
        if self.pending_row is not None:
            # Evaluate the previous round's weights on the trainers, queued before their
            # train call so it costs no extra shipping; see evaluation.py.
            evaluation = self.evaluation(self.pending_row, bc)
            if evaluation is not None:
                evaluation.submit(live)
            self.pending_row = None
        want_state = self.checkpoint_due(self.round_no + 1)
        rate = self.inner.at(self.round_no, self.inner_steps, len(live))
        extra = {} if rate is None else {"learning_rate": rate}
        calls = {}
        for slot in live:
            ref = bc.train(slot, pieces[slot.index], cfg.worker_epochs, cfg.batch_size,
                           return_state=want_state, residual=want_state, **extra)
            calls[ref] = slot
        self.bytes_sent += bc.take_bytes() + sum(p.nbytes for p in pieces.values())
        results: dict = {}
        final = self.round_no + 1 == self.total_rows()
        stopped = self._gather(calls, evaluation, results, self.late.allowed(len(calls), final),
                               drain=final, t_start=t_round)
        self.bytes_sent += bc.take_bytes()   # shards a lost trainer's successor took over
        for ref, slot in calls.items():   # still running: folded into a later round
            self.late.defer(ref, slot, self.round_no + 1, len(pieces[slot.index]))
        if stopped or not results:
            # Stopped: the round's deltas are not applied, so result.weights are the
            # weights of the last reported row. No results: every trainer of the round was
            # lost; it runs again with the trainers that come back.
            return stopped, w
        slots = sorted(results)    # a fixed order of summation: resumes are bit-equal
        deltas = []
        for j in slots:
            delta, size = self.wire.received(results[j][0])
            deltas.append(delta)
            self.bytes_received += size
        stats = [results[j][1] for j in slots]
        weights = [s["samples"] for s in stats]
        # Work is attributed by interval: only what falls inside this round counts (a
        # trainer's first call can report evaluations of an earlier run, see stragglers.py).
        now = time.perf_counter()
        row_stats: list = [within_window(s, t_round, now) for s in stats]
        late = self.late.fold(self.round_no + 1, t_round)
        for j, d, s, s_row, staleness in late:
            slots.append(j)
            d, size = self.wire.received(d)   # encoded as the round it was sent in said
            deltas.append(d)
            self.bytes_received += size
            stats.append(s)
            row_stats.append(s_row)
            weights.append(self.late.weight(s["samples"], staleness))
        for j, s in zip(slots, stats):
            self.keep_state(j, s)
            if self.balancer is not None:
                self.balancer.observe(j, s["samples"], s["compute_s"])
        w = self.outer.step(w, weighted_mean(deltas, weights), len(deltas))
        self.inner_steps += steps_in(max(len(p) for p in pieces.values()), cfg.batch_size,
                                     cfg.worker_epochs)
        self.round_no += 1
        row = self.new_row(self.round_no, epoch - 1 + (r + 1) / cfg.rounds_per_epoch,
                           row_stats, time.perf_counter() - t_round)
        row["late"] = len(late)
        row["trainer_samples"] = [len(pieces[j]) if j in pieces else 0
                                  for j in range(cfg.workers)]
        if cfg.backup_workers:
            stale = [0] * len(results) + [x[4] for x in late]
            self.updates += [{"trainer": j, "start_version": self.round_no - 1 - st,
                              "applied_version": self.round_no, "staleness": st, "lead": 0,
                              "loss": s["loss"], "samples": s["samples"], "weight": wt}
                             for j, s, st, wt in zip(slots, stats, stale, weights)]
        if rate is not None:
            row["learning_rate"] = rate
        if not self.outer.plain:
            row["outer_lr"] = self.outer.last_rate
        if self.round_no % cfg.eval_every == 0 or self.round_no == self.total_rows():
            self.pending_row = row      # evaluated during the next round
        else:
            self.finish_row(row)        # the previous row's evaluation is already in
        if self.checkpoint_due(self.round_no):
            state = self.outer.state()
            self.save_checkpoint(w, {"outer": state} if state else None)
        return False, w

    def _late_done(self, ref, value, lost) -> None:
        """A late call returned: keep its delta for the round open now, or lose its trainer."""
        call = self.late.take(ref)
        if lost is None:
            self.late.arrive(call, value)
        elif call.slot.handle is call.handle:   # not its replacement, already there
            self.lose(call.slot, lost)

    def _gather(self, calls: dict, evaluation, results: dict, allowed: int = 0,
                drain: bool = False, t_start: float = 0.0) -> bool:
        """Collect a round's train calls and the previous row's evaluation, replacing
        what a lost trainer held, until at most ``allowed`` calls (and with ``drain`` no
        late call) are still running, then for the rest until the grace period ends
        (``LateDeltas.grace_until``); late calls that return meanwhile are kept for
        this round. Returns True if a callback stopped the run."""
        stopped = False
        grace = None   # the time the round waits until for calls it could leave late
        while True:
            must = (len(calls) > allowed or (calls and not results)
                    or (drain and self.late.inflight)
                    or (evaluation is not None and not evaluation.done))
            if not must:
                if calls and grace is None:
                    grace = self.late.grace_until(t_start, time.perf_counter())
                if not calls or time.perf_counter() >= grace:
                    break
            refs = (list(calls) + (evaluation.pending() if evaluation is not None else [])
                    + self.late.refs())
            if not refs:   # shards orphaned by a loss, and no trainer was live to take them
                evaluation.requeue_orphans(self.members())
                continue
            if not must:
                ready, _ = self.backend.wait(refs, num_returns=1,
                                             timeout=max(0.0, grace - time.perf_counter()))
                if not ready:
                    continue
                refs = ready[:1]
            ref, value, lost = self.next_done(refs)
            if self.late.owns(ref):
                self._late_done(ref, value, lost)
                continue
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
    ``patience``, ``seed``, ``callbacks``, ...). Slow nodes:
    ``backup_workers=b`` closes each round once all but ``b`` deltas are in and folds the
    late ones into a later round, scaled by ``1/(1 + staleness)``; ``balance=True`` sizes
    each trainer's partition by its measured samples/s (see ``docs/training.md``). Stops after ``master_epochs``, or when
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
    from .api import train

    return train(model_fn, dataset, "sync", trainers=trainers, initial_weights=initial_weights,
                 resume=resume, **options)
