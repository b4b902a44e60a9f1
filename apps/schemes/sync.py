"""Synchronous data parallelism: the paper's Algorithm 6, surviving lost trainers.

Each round the driver ``put``s the weights once, sends every live trainer its index
partition, waits for their deltas and applies their mean weighted by samples,
``w ← w − Σ_j (n_j / Σn) delta_j``. ``rounds_per_epoch = r`` averages r times per
epoch, each on 1/r of the epoch's permutation (local SGD).

The driver's step on the averaged delta is an outer optimizer (``outer.py``). By default
it is Nesterov momentum at a fixed rate with no K rule (so no warm-up), a round every
``STEPS_PER_ROUND`` local steps, and none with one trainer: the values are
``RoundOptions.DEFAULTS`` in ``rounds.py`` (chosen on a validation split; not repeated
here, so that they cannot go stale); ``rounds_per_epoch=1, outer_momentum=0,
lr_scaling="none"`` is the paper's plain average once per epoch. The trainers' own rate can follow ``lr_schedule`` (or
``lr_scaling='inner'``), set by the driver each round.

A round, as a state machine (``machine.py``): it opens with the train calls, the previous
row's evaluation shards queued before them on the same weights; it closes once every
delta is in, or with ``backup_workers=b`` once all but b are (after a grace period with
``balance=True``; the late ones are folded into a later round, ``stragglers.py``); then
the outer step is taken, the row made and the next round opened.

A trainer lost mid-round costs only its own share of that round: the round completes
with the deltas that arrived, each weighted by its samples, and the lost trainer's
replacement (started at once, in its reserved slot) joins at the next round with the
current weights. A round in which every trainer was lost is run again once trainers are
back. Everything the round depends on (the epoch's permutation, the trainers present,
the order of the sum) is a function of the seed, the round number and the slots, so a
run resumed from a checkpoint ends with the same weights as one that was never stopped.

**Streamed rounds** (``overlap=True``, ``fragments=F``; ``fragments.py`` and
``streaming.py``). With ``overlap`` the machine keeps two rounds out: when round t closes,
round t + 2 is handed out (queued on each trainer behind round t + 1), carrying the outer
step of round t, which each trainer applies as a correction before it trains round t + 2;
so a trainer goes from round to round without waiting for the average. With
``fragments=F`` round t syncs fragment ``(t − 1) mod F`` only. The same orders otherwise:
losses, joins, late deltas (of the same fragment), evaluations and checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..options import ConfigError, boolean, int_at_least, option
from .averaging import buffer_mask, weighted_mean
from .balance import RateBalancer
from .evaluation import Evaluations
from .events import CallDone, RowDone, Tick, TrainerLost, TrainersJoined
from .machine import Machine, RunContext
from .orders import TRAIN, NeedTrainers, Order, SetTimer, Stop
from .rounds import RoundOptions, Rounds
from .slots import Slot
from .stragglers import LateDeltas, within_window
from .streaming import Streaming
from .wire import CHANGES, PLAIN, WHOLE

__all__ = ["SyncOptions", "SyncMachine"]


@dataclasses.dataclass
class SyncOptions(RoundOptions):
    """``train_sync``'s settings: the rounds and the outer step (:class:`RoundOptions`),
    and what to do about slow nodes."""

    scheme: ClassVar[str] = "sync"

    backup_workers: int | None = option(
        None, check=int_at_least(0),
        help="close a round once all but B deltas are in; late ones are folded into a later "
             "round, scaled by staleness (default 0)")
    balance: bool | None = option(
        None, check=boolean, cli="flag",
        help="size each trainer's partition by its measured samples/s (default off)")

    DEFAULTS: ClassVar[dict] = {**RoundOptions.DEFAULTS, "backup_workers": 0, "balance": False}

    def validate(self, config) -> None:
        super().validate(config)
        if self.backup_workers and self.backup_workers >= config.workers:
            raise ConfigError("backup_workers", f"must be less than workers ({config.workers}): "
                              f"a round needs at least one delta, got {self.backup_workers}")


@dataclasses.dataclass
class _Round:
    """A round handed out: its pieces, its weights and its calls."""

    number: int                 # 1-based
    epoch: int
    r: int
    t_start: float
    pieces: dict
    bc: Any                     # a wire.Broadcast, or a streaming.StreamEval
    rate: dict
    calls: dict[int, Slot] = dataclasses.field(default_factory=dict)   # train calls out
    results: dict[int, Any] = dataclasses.field(default_factory=dict)  # slot -> (delta, stats)
    allowed: int = 0            # train calls that may still run when it closes (late)
    drain: bool = False         # the last round waits for every call, late ones too
    grace: float | None = None  # when it stops waiting for calls it could leave late


class SyncMachine(Machine):
    name = "sync"
    Options = SyncOptions
    # Every trainer of a round gets the same version: a replica of changes can be shared.
    wire_modes = (PLAIN, WHOLE, CHANGES)

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        o = self.options
        self.rounds = Rounds(o, self.config.master_epochs, ctx.trainer_info.get("learning_rate"))
        # Slow nodes (stragglers.py, balance.py): late calls, and each slot's samples/s.
        self.late = LateDeltas(o.backup_workers or 0, balanced=bool(o.balance))
        self.balancer = RateBalancer() if o.balance else None
        self.evals = Evaluations(self.num_test, self.call)
        self.buffers = buffer_mask(ctx.trainer_info)   # values: no outer step (averaging.py)
        self.w: list = []
        self.open: _Round | None = None    # the round whose deltas are being collected
        self.ahead: _Round | None = None   # overlap: the next round, already handed out
        self.overlap = bool(o.overlap)
        self.stream: Streaming | None = None   # streamed rounds (made with the weights)
        self.resets: set[int] = set()      # slots whose trainers start the run's stream anew
        self.resumed = False
        self.flush_calls: dict[int, Slot] | None = None   # the end of a run of fragments
        self.flush_replies: list = []
        self.flushed = False
        self.waiting = False    # for trainers, or for a late call (every live trainer is late)
        self.finishing = False  # the last weights' evaluation is out
        self.stopping = False   # a callback stopped the run

    def total_rows(self) -> int:
        return self.rounds.total

    def _streamed(self, weights: list) -> None:
        if self.options.streaming and self.stream is None:
            self.stream = Streaming(self.config.compression, self.name, self.wire_modes,
                                    self.wire.put, weights, self.options.fragments)

    def _model(self) -> list:
        """The weights the trainers hold for ``w`` (what rows and the result report)."""
        return self.stream.model(self.w) if self.stream else self.wire.model(self.w)

    # -- rounds --------------------------------------------------------------------------------
    def begin(self, weights: list) -> list[Order]:
        if self.balancer is not None and self.plan.partitioned:
            raise ConfigError("balance", "needs every trainer to hold the whole dataset: with "
                              "datasets.partitioned(...) trainer j can train only partition j")
        self._streamed(weights)
        self.w = weights
        return self._next_round()

    def _next_round(self) -> list[Order]:
        """Hand out what is due: the next round (and with ``overlap`` the one after it)."""
        total = self.rounds.total
        if self.open is None and self.round_no >= total:
            return self._finish()
        orders: list[Order] = []
        if self.open is None:
            # After a resume the round in flight is handed out again as it was (its
            # trainers had the globals then, not the newest): see streaming.py.
            again = self.resumed and self.overlap
            got, self.open = self._issue(self.round_no + 1, publish=not again, evaluate=not again)
            orders += got
            if self.open is None:
                return orders
        self.resumed = False
        if self.overlap and self.ahead is None:
            if self.round_no + 2 <= total:
                got, self.ahead = self._issue(self.round_no + 2)
                orders += got
            elif self.open is not None and self.stream is not None:
                # No round carries this outer step: publish it anyway, so a checkpoint of a
                # later round holds it and a run resumed with more epochs hands that round
                # out with the global a longer run sent (bit-equal), not an older one.
                self.stream.publish(self.w)
        return orders

    def _issue(self, number: int, publish: bool = True,
               evaluate: bool = True) -> tuple[list[Order], _Round | None]:
        """Hand out round ``number`` to the idle live trainers: its orders and the round, or
        (orders, None) when it must wait for trainers (``waiting``)."""
        need = self.too_few()
        live = self.late.idle(self.members())   # a trainer still on a late call gets no work
        if need or not live:   # every live trainer late: the round starts with the first back
            self.waiting = True
            return need, None
        self.waiting = False
        cfg = self.config
        epoch, r = self.rounds.where(number - 1)
        shares = self.balancer.shares([s.index for s in live]) if self.balancer else None
        pieces = self.plan.round_pieces(epoch, r, [s.index for s in live], shares)
        stream = self.stream
        bc: Any
        if stream is not None:
            if publish:
                stream.publish(self.w)
            bc = stream.evaluation()
        else:
            bc = self.wire.broadcast(self.w)
        orders: list[Order] = []
        row = self.rounds.take_pending() if evaluate else None
        if row is not None:
            # Evaluate the previous round's weights on the trainers, queued before their
            # train call so it costs no extra shipping; see evaluation.py.
            orders += self.evals.add(row, bc, live)
        want_state = self.checkpoint_due(number)
        rate = self.rounds.inner_rate(number - 1, len(live))
        rd = _Round(number, epoch, r, self.now, pieces, bc, rate)
        for slot in live:
            if stream is not None:
                spec = stream.train(slot, number, pieces[slot.index], cfg.worker_epochs,
                                    cfg.batch_size, reset=slot.index in self.resets,
                                    return_state=want_state, **rate)
                self.resets.discard(slot.index)
            else:
                spec = bc.train(slot, pieces[slot.index], cfg.worker_epochs, cfg.batch_size,
                                return_state=want_state, residual=want_state, **rate)
            call = self.call(slot, spec, TRAIN)
            rd.calls[call.id] = slot
            orders.append(call)
        self.bytes_sent += bc.take_bytes() + sum(p.nbytes for p in pieces.values())
        # The last round waits for every call, late ones too; with fragments, the last
        # round of each fragment (a late delta folds only into its own fragment's round).
        final = number > self.rounds.total - (self.options.fragments or 1)
        rd.allowed = self.late.allowed(len(rd.calls), final)
        rd.drain = final
        return orders, rd

    def _maybe_close(self) -> list[Order]:
        """Close the open round once what it must wait for is in: more calls than it may
        leave late, at least one delta, the late calls of the last round, and the previous
        row's evaluation (a reassigned shard must run before the weights change)."""
        rd = self.open
        if rd is None:
            return []
        if self.rounds.pending_row is not None and not self.stopping:
            # A row whose evaluation no round handed out took (with overlap, the round
            # before the last): it is evaluated now, before the weights change.
            return self._evaluate_pending()
        must = (len(rd.calls) > rd.allowed or (rd.calls and not rd.results)
                or (rd.drain and self.late.inflight) or self.evals.busy)
        if must:
            return []
        if rd.calls:
            if rd.grace is None:
                rd.grace = self.late.grace_until(rd.t_start, self.now)
            if self.now < rd.grace:
                return [SetTimer(rd.grace)]
        return self._close()

    def _close(self) -> list[Order]:
        cfg = self.config
        rd, self.open = self.open, None
        if rd is None:
            raise RuntimeError("sync: no round is open to close (a bug in DDLF, please "
                               "report it)")
        for call_id, slot in rd.calls.items():   # still running: folded into a later round
            self.late.defer(call_id, slot, rd.number, len(rd.pieces[slot.index]))
        self.bytes_sent += rd.bc.take_bytes()   # shards a lost trainer's successor took over
        if self.stopping:
            # The round's deltas are not applied: result.weights are the weights of the
            # last reported row.
            return [Stop(self._model())]
        if not rd.results:
            # Every trainer of the round was lost: it runs again with those that come back
            # (a round handed out after it too: its trainers start the stream anew).
            if self.ahead is not None:
                self.resets.update(self.live)
                self.ahead = None
            return self._next_round()
        slots = sorted(rd.results)    # a fixed order of summation: resumes are bit-equal
        received = self.stream.received if self.stream else self.wire.received
        deltas = []
        for j in slots:
            delta, size = received(rd.results[j][0])
            deltas.append(delta)
            self.bytes_received += size
        stats = [rd.results[j][1] for j in slots]
        weights = [s["samples"] for s in stats]
        # Work is attributed by interval: only what falls inside this round counts (a
        # trainer's first call can report evaluations of an earlier run, see stragglers.py).
        row_stats: list = [within_window(s, rd.t_start, self.now) for s in stats]
        late = self.late.fold(rd.number, rd.t_start, self.options.fragments or 1)
        for j, d, s, s_row, staleness in late:
            slots.append(j)
            d, size = received(d)   # encoded as the round it was sent in said
            deltas.append(d)
            self.bytes_received += size
            stats.append(s)
            row_stats.append(s_row)
            # Staleness in outer steps of the delta's fragment: a round each without them.
            weights.append(self.late.weight(s["samples"],
                                            staleness // (self.options.fragments or 1)))
        for j, s in zip(slots, stats):
            self.keep_state(j, s)
            if self.stream is not None:
                self.stream.keep(j, s)
            if self.balancer is not None:
                self.balancer.observe(j, s["samples"], s["compute_s"])
        mean = weighted_mean(deltas, weights)
        if self.stream is not None:
            self.w = self.stream.step(self.w, rd.number, self.rounds.outer, mean, len(deltas),
                                      self.buffers)
        else:
            self.w = self.rounds.outer.step(self.w, mean, len(deltas), self.buffers)
        self.rounds.count_steps(max(len(p) for p in rd.pieces.values()), cfg.batch_size,
                                cfg.worker_epochs)
        self.round_no += 1
        row = self.new_row(self.round_no, self.rounds.epoch_at(rd.epoch, rd.r), row_stats,
                           self.now - rd.t_start)
        row["late"] = len(late)
        # Every trainer's compute in the round, whole: what utilization adds up.
        row["compute_total_s"] = sum(s["compute_s"] for s in stats)
        row["trainer_samples"] = [len(rd.pieces[j]) if j in rd.pieces else 0
                                  for j in range(cfg.workers)]
        if self.options.backup_workers:
            stale = [0] * len(rd.results) + [x[4] for x in late]
            self.updates += [{"trainer": j, "start_version": self.round_no - 1 - st,
                              "applied_version": self.round_no, "staleness": st, "lead": 0,
                              "loss": s["loss"], "samples": s["samples"], "weight": wt}
                             for j, s, st, wt in zip(slots, stats, stale, weights)]
        orders = self.rounds.end(row, self.round_no, rd.rate)
        if self.checkpoint_due(self.round_no):
            arrays = self.rounds.arrays()
            if self.stream is not None:
                arrays.update(self.stream.arrays())
            orders.append(self.checkpoint(self.w, arrays))
        if self.ahead is not None:   # overlap: the round handed out next is collected now
            self.open, self.ahead = self.ahead, None
            self.open.t_start = self.now   # its row's window starts here
        orders += self._next_round()
        return orders + self._maybe_close()

    def _evaluate_pending(self) -> list[Order]:
        return self._evaluate_row(self.late.idle(self.members()) or self.members())

    def _evaluate_row(self, trainers: list) -> list[Order]:
        """The pending row's evaluation of ``w`` on ``trainers``, sent once (through the
        stream when fragments publish it)."""
        bc: Any
        if self.stream is not None:
            self.stream.publish(self.w)
            bc = self.stream.evaluation()
        else:
            bc = self.wire.broadcast(self.w)
        row = self.rounds.take_pending()
        orders = self.evals.add(row, bc, trainers) if row is not None else []
        self.bytes_sent += bc.take_bytes()
        return orders

    def _finish(self) -> list[Order]:
        """After the last round: the last weights' evaluation, then stop. The result is
        the weights the trainers hold: ``w`` itself unless a lossy codec sends them. With
        fragments, a flush first: every fragment's progress not sent yet (up to F − 1
        rounds of it) is averaged and stepped once more, so the result holds it all."""
        if self.stream is not None and self.stream.count > 1 and not self.flushed:
            return self._flush()
        if self.rounds.pending_row is None:
            return [Stop(self._model())]
        need = self.too_few()
        if need:
            self.waiting = True
            return need
        self.waiting = False
        self.finishing = True
        return self._evaluate_row(self.members()) + self._finished()

    def _flush(self) -> list[Order]:
        if self.flush_calls is not None:
            return []                      # out already
        need = self.too_few()
        if need:
            self.waiting = True
            return need
        self.waiting = False
        self.flush_calls = {}
        orders: list[Order] = []
        stream = self._the_stream()
        for slot in self.members():
            call = self.call(slot, stream.flush(slot, self.rounds.total + 1), TRAIN)
            self.flush_calls[call.id] = slot
            orders.append(call)
        self.bytes_sent += stream.take_bytes()
        return orders

    def _the_stream(self) -> Streaming:
        if self.stream is None:
            raise RuntimeError("sync: a streamed step in a run without overlap or fragments "
                               "(a bug in DDLF, please report it)")
        return self.stream

    def _flush_over(self) -> list[Order]:
        if self.flush_calls:
            return []
        if self.flush_replies:
            self.w, size = self._the_stream().flushed(self.w, self.rounds.outer,
                                                      self.flush_replies, self.buffers)
            self.bytes_received += size
        self.flushed = True
        return self._finish()

    def _finished(self) -> list[Order]:
        if self.evals.busy:
            return []
        return [*self.evals.emit_ready(), Stop(self._model())]

    # -- events --------------------------------------------------------------------------------
    def _owner(self, call_id: int) -> _Round | None:
        for rd in (self.open, self.ahead):
            if rd is not None and call_id in rd.calls:
                return rd
        return None

    def on_done(self, event: CallDone) -> list[Order]:
        if self.late.owns(event.call):
            self.late.arrive(self.late.take(event.call), event.value, self.now)
            if self.waiting:
                return self._next_round()
            return self._maybe_close()
        if self.flush_calls and event.call in self.flush_calls:
            del self.flush_calls[event.call]
            self.flush_replies.append(event.value[0])
            return self._flush_over()
        if self.evals.owns(event.call):
            self.evals.record(event.call, event.value)
            if self.finishing:
                return self._finished()
            # The round closes once the callbacks have taken the row (RowDone): if it
            # stopped the run, the round's deltas are not applied.
            return self.evals.emit_ready()
        rd = self._owner(event.call)
        if rd is None:   # a call of a round given up (every trainer of the one before lost)
            return []
        slot = rd.calls.pop(event.call)
        if not self.stopping:
            rd.results[slot.index] = event.value
        return self._maybe_close()

    def on_lost(self, event: TrainerLost) -> list[Order]:
        if self.balancer is not None:
            self.balancer.forget(event.slot.index)   # its replacement may be elsewhere
        if self.stream is not None:
            self.stream.lose(event.slot.index)
        for call_id in event.calls:
            rd = self._owner(call_id)
            if rd is not None:
                del rd.calls[call_id]        # its share of the round is lost
            elif self.late.owns(call_id):
                self.late.take(call_id)      # so is a late delta
            elif self.flush_calls and call_id in self.flush_calls:
                del self.flush_calls[call_id]   # and its unsent progress
                if not self.flush_calls:
                    return self._flush_over()
        orders: list[Order] = self.evals.lost(event.calls, self.members())
        if self.evals.busy and not self.live:
            orders.append(NeedTrainers(self.config.min_trainers))  # a shard has nowhere to go
        if self.waiting:
            return orders + self._next_round()
        if self.finishing:
            return orders + self._finished()
        return orders + self._maybe_close()

    def on_joined(self, event: TrainersJoined) -> list[Order]:
        orders: list[Order] = self.evals.joined(self.members())
        if self.waiting:
            orders += self._next_round()
        return orders

    def on_tick(self, event: Tick) -> list[Order]:
        return self._maybe_close()

    def on_row_done(self, event: RowDone) -> list[Order]:
        if event.stop:
            self.stopping = True
            if self.open is None and not self.finishing:
                return [Stop(self._model())]
        return self._maybe_close()

    def admit(self, slots) -> list[Order]:
        orders = super().admit(slots)
        for slot in slots:   # after a resume: each trainer continues its slot's stream
            spec = self.stream.admit(slot) if self.stream is not None else None
            if spec is not None:
                orders.append(self.call(slot, spec, wait=False))
        return orders

    # -- checkpoints ---------------------------------------------------------------------------
    def position(self) -> dict:
        return {**self.rounds.position(), "late": self.late.to_json(),
                "rates": self.balancer.to_json() if self.balancer else None,
                "stream": self.stream.position() if self.stream else None}

    def restore(self, ckpt) -> None:
        pos = ckpt.meta["position"]
        self.rounds.restore(pos, ckpt.arrays, self.round_no)
        if self.balancer is not None:
            self.balancer = RateBalancer.from_json(pos.get("rates"))
        if self.options.streaming:
            self._streamed(ckpt.weights)
            self._the_stream().restore(pos["stream"], ckpt.arrays)
            self.resumed = True
