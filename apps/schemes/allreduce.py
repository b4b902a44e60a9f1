"""Allreduce: the trainers average their deltas among themselves, over a ring.

The driver never ships weights or deltas in a round, only indices and control:

1. **Train.** Every live trainer gets ``hold_delta(round, indices)``: it trains from the
   weights it holds and keeps its delta (and its starting weights); only the stats come
   back. The previous row's evaluation is queued before it, in shards, as in ``sync``.
2. **Average.** The trainers that trained form a ring in slot order; each gets
   ``allreduce_held((run, round, attempt), rank, size, right neighbour, n_j / Σn)`` and
   runs a ring reduce-scatter plus all-gather with its neighbours by direct actor calls
   (``ring.py``), then applies the mean to its starting weights and reports a CRC of its
   new weights (and outer velocity); the driver checks that they agree. Each trainer
   sends ``2 (K−1)/K`` of the model; the result is ``sync``'s (bit-equal at K = 2).

Faults. A trainer lost while training: the ring is the survivors, each weighted by its own
samples. A trainer lost in the collective: the driver aborts the others' wait
(``abort_collective``; none waits longer than ``chunk_timeout_s``) and runs it again over
the survivors, from the deltas they still hold. A replacement copies the weights from a
live trainer (``adopt_weights``) before its first round. Every holder of the weights lost
at once is a :class:`WeightsLostError` naming the last checkpoint, not a hang. The
weights reach the driver only for checkpoints and at the end, from one trainer.

The settings are sync's (``rounds.py``); each trainer takes the outer step on its own copy
of the velocity. The trainer's side is :class:`AllreduceTrainer`, in ``ring_trainer.py``.

**Streamed rounds** (``overlap=True``, ``fragments=F``; the trainer's side is
``ring_stream.py``): rounds are ``stream_hold`` then ``stream_reduce`` over the round's
fragment, and the trainers keep each fragment's global themselves. With ``overlap`` a
round's collective runs on the trainers' threads while the next round trains (its calls
go out together; the next round's holds report it), so a trainer waits for neither the
ring nor the driver. A checkpoint round, a join and the last round run their collective
before the next round starts (one consistent state to save, to copy, to end with).
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Callable, ClassVar

from ..arrays import nbytes
from ..options import number_in, option
from . import initial_weights
from .evaluation import Evaluations
from .events import CallDone, RowDone, TrainerLost, TrainersJoined
from .machine import RunContext
from .orders import TRAIN, Order, Stop
from .ring_members import CollectiveError, RingMembers, WeightsLostError
from .ring_parts import (
    Collective,
    Fetch,
    LocalEval,
    Round,
    ring_spec,
)
from .ring_trainer import AllreduceTrainer
from .rounds import RoundOptions, Rounds
from .slots import Slot
from .wire import CHANGES, PLAIN, WHOLE

__all__ = ["AllreduceOptions", "AllreduceMachine", "AllreduceTrainer",
           "WeightsLostError", "CollectiveError"]


@dataclasses.dataclass
class AllreduceOptions(RoundOptions):
    """Sync's averaging settings (not its slow-node ones: a ring needs every member)."""

    scheme: ClassVar[str] = "allreduce"

    chunk_timeout_s: float | None = option(
        None, check=number_in(0.0, float("inf"), low_open=True, high_open=True),
        help="a ring member gives up waiting for one chunk after this long (default 300): "
             "the backstop behind the driver's abort, for a neighbour that stopped sending "
             "without its process dying")

    DEFAULTS: ClassVar[dict] = {**RoundOptions.DEFAULTS, "chunk_timeout_s": 300.0}

    def validate(self, config) -> None:
        super().validate(config)
        ring_spec(config.compression)


class AllreduceMachine(RingMembers):
    name = "allreduce"
    Options = AllreduceOptions
    # The driver sends no weights in a round: compression= is the ring's codec per hop
    # (ring_spec), which the options check; the driver's wire stays idle.
    wire_modes = (PLAIN, WHOLE, CHANGES)
    # Collectives that fail with no trainer lost (timeouts) before the run gives up.
    max_quiet_failures = 2

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.rounds = Rounds(self.options, self.config.master_epochs,
                             ctx.trainer_info.get("learning_rate"))
        self.evals = Evaluations(self.num_test, self.call)
        self.fresh: set[int] = set()   # slots whose trainer does not hold the weights yet
        self.digest: int | None = None  # CRC of the weights the trainers hold
        # {"round", "attempt", "ring", "status": {slot: "done", "lost"...}}: for tests.
        self.collectives: list[dict] = []
        self.run_id = secrets.randbits(63)   # trainers can outlive a run: name its rounds
        self.adopting: dict[int, tuple[Slot, Slot]] = {}   # call -> (newcomer, source)
        self.after_adopt: Callable[[], list] | None = None
        self.open: Round | None = None
        self.coll: Collective | None = None
        self.fetch: Fetch | None = None
        self.waiting: Callable[[], list] | None = None   # what to go on with once trainers join
        self.codec, self.feedback = ring_spec(self.config.compression)
        self.hops: dict[int, dict] = {}         # slot -> its hop feedback (checkpoints)
        self.pending_hops: dict[int, dict] = {}  # from a checkpoint, for the resumed trainers
        # Streamed rounds (ring_stream.py): fragments, and each slot's state for checkpoints.
        self.streamed = self.options.streaming
        self.F = self.options.fragments or 1
        self.states: dict[int, tuple] = {}
        self.pending_states: dict[int, tuple] = {}
        self.flushed = self.F == 1
        self.finishing = False
        self.stopping = False

    def total_rows(self) -> int:
        return self.rounds.total

    # -- the run -------------------------------------------------------------------------------
    def begin(self, weights: list) -> list[Order]:
        """The one time the driver sends the weights (one ``put``), to the trainers that do
        not hold them already (``initial_weights.holders``: on a new run, usually none),
        with the velocity a resumed run continues from (None otherwise: adopted trainers
        may hold an old one)."""
        live = self.members()
        # Streamed rounds start from the weights inside stream_start's call: always sent.
        held = set() if self.streamed else initial_weights.holders(live, weights)
        ref = self.wire.put(weights) if len(held) < len(live) else None
        outer = self.rounds.outer
        velocity = ([p.velocity or [] for p in outer.parts] if self.streamed
                    else outer.velocity)
        v_ref = self.wire.put(velocity) if velocity else None
        # Fragment f's global holds the sends up to the last round that synced it.
        bases = [max([r for r in range(1, self.round_no + 1) if (r - 1) % self.F == f],
                     default=0) for f in range(self.F)]
        orders: list[Order] = []
        for slot in live:
            if self.streamed:
                state = self.pending_states.pop(slot.index, None)
                orders.append(self.call(slot, ("stream_start", (self.run_id, self.F, ref, bases,
                                                                v_ref or [[]] * self.F,
                                                                state), {}), wait=False))
            else:
                if slot.index not in held:
                    orders.append(self.call(slot, ("set_weights", (ref,), {}), wait=False))
                orders.append(self.call(slot, ("set_outer_velocity", (v_ref,), {}),
                                        wait=False))
            if self.feedback:   # a resumed run's hop feedback, or none (trainers reused)
                hops = self.pending_hops.pop(slot.index, None)
                orders.append(self.call(slot, ("set_hop_feedback", (hops,), {}), wait=False))
        self.bytes_sent += (len(live) - len(held)) * nbytes(weights) + len(live) * nbytes(
            [a for v in velocity for a in v] if self.streamed else velocity or [])
        self.fresh.difference_update(s.index for s in live)
        return orders + self._next_round()

    def _next_round(self) -> list[Order]:
        if self.stopping:
            return self._fetch_weights(None, False, lambda w, v: [Stop(w)])
        if self.round_no >= self.rounds.total:
            return self._finish()
        waiting = self._members_ready(self._next_round)
        if waiting is not None:
            return waiting
        self.open, orders = self._issue(self.round_no + 1)
        return orders

    def _issue(self, number: int, join=None) -> tuple[Round, list[Order]]:
        """Round ``number``'s train calls on the live trainers (with ``join``, each also
        reports the collective running since its previous call)."""
        cfg = self.config
        live = self.members()
        epoch, r = self.rounds.where(number - 1)
        pieces = self.plan.round_pieces(epoch, r, [s.index for s in live])
        orders: list[Order] = []
        row = self.rounds.take_pending()
        if row is not None:
            # The previous round's weights are what the trainers hold: evaluate them there,
            # queued before the train calls (no weights travel).
            where = LocalEval(self.run_id, self.F) if self.streamed else None
            orders += self.evals.add(row, where, live)
        want_state = self.checkpoint_due(number)
        rate = self.rounds.inner_rate(number - 1, len(live))
        rd = Round(number, epoch, r, self.now, pieces, rate)
        for slot in live:
            key = (self.run_id, number)
            piece = pieces[slot.index]
            spec = (("stream_hold", (key, (number - 1) % self.F, piece, cfg.worker_epochs,
                                     cfg.batch_size, self.F),
                     {"join": join, "return_state": want_state, **rate}) if self.streamed else
                    (self.hold_method, (key, piece, cfg.worker_epochs, cfg.batch_size),
                     {"return_state": want_state, **rate}))
            call = self.call(slot, spec, TRAIN)
            rd.calls[call.id] = slot
            rd.handles[slot.index] = slot.handle
            orders.append(call)
        self.bytes_sent += sum(p.nbytes for p in pieces.values())
        return rd, orders

    def _alive(self, slot: Slot, rd: Round | None) -> bool:
        """``slot`` still holds the trainer that trained round ``rd`` (a replacement is
        another trainer, without the held delta)."""
        return (slot.index in self.live and rd is not None
                and slot.handle is rd.handles.get(slot.index))

    def _maybe_reduce(self) -> list[Order]:
        """Once the round's train calls and the previous row's evaluation are in (a shard
        reassigned after a loss must run before the collective changes the weights). With
        ``overlap`` the collective goes to the trainers' threads and the next round out
        with it, unless this round must end first (module doc)."""
        rd = self.open
        if rd is None or self.coll is not None or rd.calls or self.evals.busy:
            return []
        if self.stopping:
            return self._fetch_weights(None, False, lambda w, v: [Stop(w)])
        row = self.rounds.take_pending()
        if row is not None:
            # A row no round handed out took (overlap: before a round whose collective
            # runs on its own): evaluated first, on the weights it reports.
            where = LocalEval(self.run_id, self.F) if self.streamed else None
            holders = [s for s in self.members() if s.index not in self.fresh]
            return self.evals.add(row, where, holders)
        for j, stats in rd.results.items():
            self.keep_state(j, stats)
        ring_slots = [self.live[j] for j in sorted(rd.results) if j in self.live
                      and self._alive(self.live[j], rd)]
        c = self.coll = Collective(ring_slots, self.now, rd)
        c.background = (bool(self.options.overlap) and rd.number < self.rounds.total
                        and not self.checkpoint_due(rd.number) and not self.too_few()
                        and not any(j in self.fresh for j in self.live))
        orders = self._attempt()
        if c.background:
            self.open, more = self._issue(rd.number + 1, join=(self.run_id, rd.number))
            orders += more
        return orders

    def _attempt(self) -> list[Order]:
        """One attempt at the round's collective over ``coll.ring`` (or the flush)."""
        c = self._collective()
        if not c.ring:
            raise WeightsLostError(self._weights_lost_message())
        c.attempt += 1
        number = c.rd.number if c.rd is not None else self.rounds.total + 1
        c.tag = (self.run_id, number, c.attempt)
        n = len(c.ring)
        # The outer step for this ring's size (the K rule counts the deltas averaged).
        outer = self.rounds.outer
        f = (number - 1) % self.F
        if c.rd is None:
            c.outer = [outer.remote_settings(n, g) for g in range(self.F)]
        else:
            c.outer = outer.remote_settings(n, f) if self.streamed else outer.remote_settings(n)
        extra: dict = {} if c.outer is None else {"outer": c.outer}
        if self.codec is not None:
            extra.update(codec=self.codec, feedback=self.feedback,
                         want_hops=self.feedback and c.rd is not None
                         and self.checkpoint_due(number))
        if self.streamed:
            extra.update(want_state=c.rd is not None and self.checkpoint_due(number),
                         background=c.background)
        total = (float(sum(c.rd.results[s.index]["samples"] for s in c.ring))
                 if c.rd is not None else None)
        extra.update(self._reduce_extra(c))
        c.calls, c.replies = {}, {}
        c.awaiting = set()
        c.lost_any = c.aborted = False
        orders: list[Order] = []
        for rank, slot in enumerate(c.ring):
            right = (c.rd.handles if c.rd is not None else {s.index: s.handle
                                                             for s in c.ring})
            right = right[c.ring[(rank + 1) % n].index]
            share = (c.rd.results[slot.index]["samples"] / total
                     if c.rd is not None and total else 1.0 / n)
            head = (c.tag, rank, n, right, share, self.options.chunk_timeout_s)
            spec = (("stream_reduce", (*head, f if c.rd is not None else -1, self.F), extra)
                    if self.streamed else (self.reduce_method, head, extra))
            call = self.call(slot, spec)
            c.calls[call.id] = slot
            orders.append(call)
        c.record = {"round": number, "attempt": c.attempt, "ring": [s.index for s in c.ring],
                    "status": {}}
        self.collectives.append(c.record)
        return orders

    def _attempt_over(self) -> list[Order]:
        c = self._collective()
        survivors = [s for s in c.ring if s.index in self.live
                     and (c.rd is None or self._alive(s, c.rd))]
        number = c.tag[1]
        bad = sorted(j for j, rep in c.replies.items() if rep["status"] == "nonfinite")
        if bad:
            raise CollectiveError(
                f"round {number}'s delta of trainer(s) {bad} holds NaN or inf, "
                f"which the ring's codec {self.codec!r} cannot encode "
                f"({c.replies[bad[0]].get('detail', '')}): the model diverged. Lower the "
                "learning rate (the model's, or outer_lr), or clip its gradients")
        if survivors and all(c.replies[s.index]["status"] == "done" for s in survivors):
            for s in survivors:
                if "hops" in c.replies[s.index]:
                    self.hops[s.index] = c.replies[s.index].pop("hops")
                if "stream_state" in c.replies[s.index]:
                    self.states[s.index] = c.replies[s.index].pop("stream_state")
            digests = {c.replies[s.index]["digest"] for s in survivors}
            if len(digests) != 1:
                raise CollectiveError(
                    f"after round {number}'s allreduce the trainers hold different "
                    f"weights (CRCs {sorted(digests)}): a bug in DDLF's allreduce, please "
                    "report it")
            self.digest = digests.pop()
            outer = self.rounds.outer
            if c.rd is None:    # the flush: every fragment stepped once more
                for g, settings in enumerate(c.outer):
                    outer.took_step(settings, g)
                self.coll, self.flushed = None, True
                return self._finish()
            if self.streamed:
                outer.took_step(c.outer, (number - 1) % self.F)
            else:
                outer.took_step(c.outer)
            return self._reduced(survivors)
        if not c.lost_any:
            c.quiet_failures += 1
            if c.quiet_failures > self.max_quiet_failures:
                detail = "; ".join(f"trainer {j}: {rep['status']} {rep.get('detail', '')}"
                                   for j, rep in sorted(c.replies.items()))
                raise CollectiveError(
                    f"round {number}'s allreduce failed {c.quiet_failures} times "
                    f"with no trainer lost ({detail}). A trainer that stops sending without "
                    "dying (a hung process, a link that drops data) holds up the ring; check "
                    "the trainers' logs and the network between the nodes")
        c.ring = survivors
        c.background = False     # a redo runs on its own, every member idle
        return self._attempt()

    def _reduced(self, members: list[Slot]) -> list[Order]:
        """The round's collective completed over ``members``: count it, then (after
        fetching the weights for a checkpoint) make its row."""
        cfg, c = self.config, self._collective()
        rd = c.rd
        assert rd is not None, "the flush (a collective with no round) ends in _finish"
        collective_s = self.now - c.t_start
        self.rounds.count_steps(max(len(p) for p in rd.pieces.values()), cfg.batch_size,
                                cfg.worker_epochs)
        self.round_no += 1

        def row_then(w: list | None, velocity) -> list[Order]:
            row = self.new_row(self.round_no, self.rounds.epoch_at(rd.epoch, rd.r),
                               [rd.results[s.index] for s in members], self.now - rd.t_start)
            row["collective_s"] = collective_s
            row["ring_bytes"] = sum(rep["sent_bytes"] for rep in c.replies_all)
            row["compute_total_s"] = sum(rd.results[s.index]["compute_s"] for s in members)
            self.coll = None
            orders = self.rounds.end(row, self.round_no, rd.rate)
            if w is not None:
                orders.append(self.checkpoint(w, self._arrays(velocity)))
            if self.open is not rd:   # overlap: the next round is out already
                return orders + self._maybe_reduce()
            self.open = None
            return orders + self._next_round()

        if self.stopping and self.open is not rd:
            # Stopped while this round's collective ran on: the weights of the last row.
            return self._fetch_weights(None, False, lambda w, v: [Stop(w)])
        if self.checkpoint_due(self.round_no):
            # A checkpoint needs the weights (and the velocity) here: fetched from one
            # trainer, counted in this round's row.
            return self._fetch_weights(members, True, row_then)
        return row_then(None, None)

    def _finish(self) -> list[Order]:
        """After the last round: with fragments a flush first (every fragment's progress
        not sent yet averaged once more), then the last weights' evaluation, then fetch
        them and stop."""
        if not self.flushed:
            waiting = self._members_ready(self._finish)
            if waiting is not None:
                return waiting
            self.coll = Collective(self.members(), self.now)
            return self._attempt()
        if self.rounds.pending_row is None:
            return self._fetch_weights(None, False, lambda w, v: [Stop(w)])
        waiting = self._members_ready(self._finish)
        if waiting is not None:
            return waiting
        self.finishing = True
        where = LocalEval(self.run_id, self.F) if self.streamed else None
        row = self.rounds.take_pending()
        orders = self.evals.add(row, where, self.members()) if row is not None else []
        return orders + self._finished()

    def _finished(self) -> list[Order]:
        if self.evals.busy or self.fetch is not None:
            return []
        rows = self.evals.emit_ready()
        return [*rows, *self._fetch_weights(None, False, lambda w, v: [Stop(w)])]

    # -- events --------------------------------------------------------------------------------
    def on_done(self, event: CallDone) -> list[Order]:
        call = event.call
        if call in self.adopting:
            return self._adopted(event)
        if self.fetch is not None and call == self.fetch.call:
            return self._fetched(event)
        if self.evals.owns(call):
            self.evals.record(call, event.value)
            if self.finishing:
                return self._finished()
            return self.evals.emit_ready()   # the round goes on at RowDone
        c = self.coll
        orders: list[Order] = []
        if c is not None and call in c.calls:
            slot = c.calls.pop(call)
            if event.value["status"] == "started":   # reported by its next hold
                c.awaiting.add(slot.index)
            else:
                orders = self._reply(slot, event.value)
            return orders + (self._attempt_over() if c.over else [])
        rd = self.open
        if rd is None or call not in rd.calls:
            raise RuntimeError(f"allreduce got the result of call {call}, which it is not "
                               "waiting for (a bug in DDLF, please report it)")
        slot = rd.calls.pop(call)
        stats = event.value
        report = stats.pop("collective", None)
        if not self.stopping:
            rd.results[slot.index] = stats
        if c is not None and report is not None and slot.index in c.awaiting:
            c.awaiting.discard(slot.index)
            orders += self._reply(slot, report)
            if c.over:
                return orders + self._attempt_over()
        return orders + self._maybe_reduce()

    def on_lost(self, event: TrainerLost) -> list[Order]:
        j = event.slot.index
        self.hops.pop(j, None)     # its replacement starts without feedback
        self.states.pop(j, None)
        orders: list[Order] = []
        lost = set(event.calls)
        for call in lost & set(self.adopting):
            self.adopting.pop(call)
        if self.fetch is not None and self.fetch.call in lost:
            orders += self._fetch_from()   # from another trainer that holds them
        rd, c = self.open, self.coll
        if rd is not None:
            for call in lost & set(rd.calls):
                del rd.calls[call]    # its share of the round is lost
        if c is not None:
            gone = [c.calls.pop(call) for call in lost & set(c.calls)]
            if j in c.awaiting:   # its collective ran on its threads: never reported now
                c.awaiting.discard(j)
                gone.append(event.slot)
            for slot in gone:
                c.lost_any = True
                c.record["status"][slot.index] = "lost"
                orders += self._member_out(slot, f"trainer {slot.index} was lost")
            if gone and c.over:
                orders += self._attempt_over()
        orders += self.evals.lost(event.calls, self.members())
        orders += self._adoption_over()   # a newcomer lost while copying: go on without it
        if self.finishing:
            return orders + self._finished()
        if self.coll is None:
            orders += self._maybe_reduce()
        return orders

    def on_joined(self, event: TrainersJoined) -> list[Order]:
        orders: list[Order] = self.evals.joined(self.members())
        if self.waiting is not None:
            then, self.waiting = self.waiting, None
            orders += then()
        return orders

    def on_row_done(self, event: RowDone) -> list[Order]:
        if event.stop and not self.stopping:
            self.stopping = True
            if self.open is None and not self.finishing and self.fetch is None:
                return self._fetch_weights(None, False, lambda w, v: [Stop(w)])
        return self._maybe_reduce()
