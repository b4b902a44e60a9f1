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
of the velocity. The trainer's side is :class:`AllreduceTrainer`, below.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any, Callable, ClassVar

import numpy as np

from ddlf_actors.errors import ActorDiedError, DDLFError

from .. import backends, ring
from ..arrays import nbytes
from ..options import number_in, option
from ..records import TrainStats
from .averaging import like_layers, ring_layers
from .errors import TooFewTrainersError
from .evaluation import Evaluations
from .events import CallDone, RowDone, TrainerLost, TrainersJoined
from .machine import Machine, RunContext
from .orders import TRAIN, Lose, Order, Stop
from .outer import apply_outer
from .rounds import RoundOptions, Rounds
from .slots import Slot
from .wire import PLAIN

__all__ = ["AllreduceOptions", "AllreduceMachine", "AllreduceTrainer",
           "WeightsLostError", "CollectiveError"]


class WeightsLostError(TooFewTrainersError):
    """Every trainer that held the model's current weights was lost at once."""


class CollectiveError(DDLFError):
    """The trainers could not complete an allreduce, or disagree on its result."""


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


@dataclasses.dataclass
class _Round:
    epoch: int
    r: int
    t_start: float
    pieces: dict
    rate: dict
    calls: dict[int, Slot] = dataclasses.field(default_factory=dict)
    results: dict[int, TrainStats] = dataclasses.field(default_factory=dict)   # slot -> stats
    handles: dict[int, Any] = dataclasses.field(default_factory=dict)    # slot -> its trainer


@dataclasses.dataclass
class _Collective:
    """One round's allreduce, over as many attempts as it takes."""

    ring: list[Slot]
    t_start: float
    attempt: int = 0
    quiet_failures: int = 0       # attempts that failed with no trainer lost
    calls: dict[int, Slot] = dataclasses.field(default_factory=dict)
    replies: dict[int, dict] = dataclasses.field(default_factory=dict)
    replies_all: list = dataclasses.field(default_factory=list)   # every attempt's bytes
    record: dict = dataclasses.field(default_factory=dict)
    tag: tuple = ()
    outer: dict | None = None
    lost_any: bool = False
    aborted: bool = False


@dataclasses.dataclass
class _Fetch:
    """Fetching the weights (and velocity) from one trainer that holds them."""

    slots: list[Slot] | None
    velocity: bool
    then: Callable[[list, list], list]
    call: int = 0


class AllreduceMachine(Machine):
    name = "allreduce"
    Options = AllreduceOptions
    # No codec yet: the trainers exchange plain chunks (wire.py).
    wire_modes = (PLAIN,)
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
        self.open: _Round | None = None
        self.coll: _Collective | None = None
        self.fetch: _Fetch | None = None
        self.waiting: Callable[[], list] | None = None   # what to go on with once trainers join
        self.finishing = False
        self.stopping = False

    def total_rows(self) -> int:
        return self.rounds.total

    # -- membership: every member holds the current weights ---------------------------------------
    def admit(self, slots) -> list[Order]:
        orders = super().admit(slots)
        self.fresh.update(s.index for s in slots)
        return orders

    def _members_ready(self, then: Callable[[], list]) -> list[Order] | None:
        """None when enough live trainers all hold the weights; else the orders that get
        there (newcomers copy them, or wait for trainers), then ``then()`` runs.
        :class:`WeightsLostError` at once when no live trainer holds them."""
        if not any(j not in self.fresh for j in self.live):
            raise WeightsLostError(self._weights_lost_message())
        need = self.too_few()
        if need:
            self.waiting = then
            return need
        fresh = [s for s in self.members() if s.index in self.fresh]
        if not fresh:
            return None
        holders = [s for s in self.members() if s.index not in self.fresh]
        orders: list[Order] = []
        for i, slot in enumerate(fresh):
            source = holders[i % len(holders)]
            call = self.call(slot, ("adopt_weights", (source.handle,), {}))
            self.adopting[call.id] = (slot, source)
            orders.append(call)
        self.after_adopt = then
        return orders

    def _adopted(self, event: CallDone) -> list[Order]:
        slot, source = self.adopting.pop(event.call)
        value = event.value
        orders: list[Order] = []
        if value["status"] == "source_lost":
            # The runtime told the newcomer its source died: that is a loss.
            orders.append(Lose(source, ActorDiedError(value.get("detail") or "the actor died")))
        else:
            if self.digest is not None and value["digest"] != self.digest:
                raise CollectiveError(
                    f"trainer {slot.index} copied weights from trainer {source.index} "
                    f"whose CRC {value['digest']:#x} is not the run's {self.digest:#x}: "
                    "a bug in DDLF's allreduce, please report it")
            self.fresh.discard(slot.index)
        return orders + self._adoption_over()

    def _adoption_over(self) -> list[Order]:
        if self.adopting or self.after_adopt is None:
            return []
        then, self.after_adopt = self.after_adopt, None
        return then()

    def _weights_lost_message(self) -> str:
        return (f"training stopped at round {self.round_no}: every trainer holding the current "
                "weights was lost at once, and allreduce keeps the model only on its trainers "
                "(the driver fetches it for checkpoints and at the end).")

    # -- the run -------------------------------------------------------------------------------
    def begin(self, weights: list) -> list[Order]:
        """The one time the driver sends the weights (one ``put``), with the velocity a
        resumed run continues from (None otherwise: adopted trainers may hold an old one)."""
        live = self.members()
        ref = self.wire.put(weights)
        velocity = self.rounds.outer.velocity
        v_ref = self.wire.put(velocity) if velocity else None
        orders: list[Order] = []
        for slot in live:
            orders.append(self.call(slot, ("set_weights", (ref,), {}), wait=False))
            orders.append(self.call(slot, ("set_outer_velocity", (v_ref,), {}), wait=False))
        self.bytes_sent += len(live) * (nbytes(weights) + (nbytes(velocity) if velocity else 0))
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
        cfg = self.config
        live = self.members()
        epoch, r = self.rounds.where(self.round_no)
        pieces = self.plan.round_pieces(epoch, r, [s.index for s in live])
        orders: list[Order] = []
        row = self.rounds.take_pending()
        if row is not None:
            # The previous round's weights are what the trainers hold: evaluate them there,
            # queued before the train calls (no weights travel).
            orders += self.evals.add(row, None, live)
        want_state = self.checkpoint_due(self.round_no + 1)
        rate = self.rounds.inner_rate(self.round_no, len(live))
        rd = self.open = _Round(epoch, r, self.now, pieces, rate)
        for slot in live:
            call = self.call(slot, ("hold_delta", ((self.run_id, self.round_no + 1),
                                                   pieces[slot.index], cfg.worker_epochs,
                                                   cfg.batch_size),
                                    {"return_state": want_state, **rate}), TRAIN)
            rd.calls[call.id] = slot
            rd.handles[slot.index] = slot.handle
            orders.append(call)
        self.bytes_sent += sum(p.nbytes for p in pieces.values())
        return orders

    def _alive(self, slot: Slot) -> bool:
        """``slot`` still holds the trainer that trained this round (a replacement is
        another trainer, without the held delta)."""
        return (slot.index in self.live and self.open is not None
                and slot.handle is self.open.handles.get(slot.index))

    def _maybe_reduce(self) -> list[Order]:
        """Once the round's train calls and the previous row's evaluation are in (a shard
        reassigned after a loss must run before the collective changes the weights)."""
        rd = self.open
        if rd is None or self.coll is not None or rd.calls or self.evals.busy:
            return []
        if self.stopping:
            return self._fetch_weights(None, False, lambda w, v: [Stop(w)])
        for j, stats in rd.results.items():
            self.keep_state(j, stats)
        ring_slots = [self.live[j] for j in sorted(rd.results) if j in self.live
                      and self._alive(self.live[j])]
        self.coll = _Collective(ring_slots, self.now)
        return self._attempt()

    def _attempt(self) -> list[Order]:
        """One attempt at the round's collective over ``coll.ring``."""
        c, rd = self.coll, self.open
        if not c.ring:
            raise WeightsLostError(self._weights_lost_message())
        c.attempt += 1
        c.tag = (self.run_id, self.round_no + 1, c.attempt)
        n = len(c.ring)
        # The outer step for this ring's size (the K rule counts the deltas averaged).
        c.outer = self.rounds.outer.remote_settings(n)
        extra = {} if c.outer is None else {"outer": c.outer}
        total = float(sum(rd.results[s.index]["samples"] for s in c.ring))
        c.calls, c.replies = {}, {}
        c.lost_any = c.aborted = False
        orders: list[Order] = []
        for rank, slot in enumerate(c.ring):
            right = rd.handles[c.ring[(rank + 1) % n].index]
            share = rd.results[slot.index]["samples"] / total
            call = self.call(slot, ("allreduce_held", (c.tag, rank, n, right, share,
                                                       self.options.chunk_timeout_s), extra))
            c.calls[call.id] = slot
            orders.append(call)
        c.record = {"round": self.round_no + 1, "attempt": c.attempt,
                    "ring": [s.index for s in c.ring], "status": {}}
        self.collectives.append(c.record)
        return orders

    def _member_out(self, slot: Slot, why: str) -> list[Order]:
        """A member failed its part: nobody waits for a chunk that will never come."""
        c = self.coll
        if c.aborted:
            return []
        c.aborted = True
        return [self.call(other, ("abort_collective", (c.tag, why), {}), wait=False)
                for other in c.calls.values()]

    def _attempt_over(self) -> list[Order]:
        c = self.coll
        survivors = [s for s in c.ring if self._alive(s)]
        if survivors and all(c.replies[s.index]["status"] == "done" for s in survivors):
            digests = {c.replies[s.index]["digest"] for s in survivors}
            if len(digests) != 1:
                raise CollectiveError(
                    f"after round {self.round_no + 1}'s allreduce the trainers hold different "
                    f"weights (CRCs {sorted(digests)}): a bug in DDLF's allreduce, please "
                    "report it")
            self.digest = digests.pop()
            self.rounds.outer.took_step(c.outer)
            return self._reduced(survivors)
        if not c.lost_any:
            c.quiet_failures += 1
            if c.quiet_failures > self.max_quiet_failures:
                detail = "; ".join(f"trainer {j}: {rep['status']} {rep.get('detail', '')}"
                                   for j, rep in sorted(c.replies.items()))
                raise CollectiveError(
                    f"round {self.round_no + 1}'s allreduce failed {c.quiet_failures} times "
                    f"with no trainer lost ({detail}). A trainer that stops sending without "
                    "dying (a hung process, a link that drops data) holds up the ring; check "
                    "the trainers' logs and the network between the nodes")
        c.ring = survivors
        return self._attempt()

    def _reduced(self, members: list[Slot]) -> list[Order]:
        """The round's collective completed over ``members``: count it, then (after
        fetching the weights for a checkpoint) make its row."""
        cfg, rd, c = self.config, self.open, self.coll
        collective_s = self.now - c.t_start
        self.rounds.count_steps(max(len(p) for p in rd.pieces.values()), cfg.batch_size,
                                cfg.worker_epochs)
        self.round_no += 1

        def row_then(w: list | None, velocity: list | None) -> list[Order]:
            row = self.new_row(self.round_no, self.rounds.epoch_at(rd.epoch, rd.r),
                               [rd.results[s.index] for s in members], self.now - rd.t_start)
            row["collective_s"] = collective_s
            row["ring_bytes"] = sum(rep["sent_bytes"] for rep in c.replies_all)
            self.open = self.coll = None
            orders = self.rounds.end(row, self.round_no, rd.rate)
            if w is not None:
                orders.append(self.checkpoint(w, {"outer": velocity} if velocity else None))
            return orders + self._next_round()

        if self.checkpoint_due(self.round_no):
            # A checkpoint needs the weights (and the velocity) here: fetched from one
            # trainer, counted in this round's row.
            return self._fetch_weights(members, True, row_then)
        return row_then(None, None)

    def _finish(self) -> list[Order]:
        """After the last round: the last weights' evaluation, then fetch them and stop."""
        if self.rounds.pending_row is None:
            return self._fetch_weights(None, False, lambda w, v: [Stop(w)])
        waiting = self._members_ready(self._finish)
        if waiting is not None:
            return waiting
        self.finishing = True
        orders = self.evals.add(self.rounds.take_pending(), None, self.members())
        return orders + self._finished()

    def _finished(self) -> list[Order]:
        if self.evals.busy or self.fetch is not None:
            return []
        rows = self.evals.emit_ready()
        return [*rows, *self._fetch_weights(None, False, lambda w, v: [Stop(w)])]

    # -- fetching the weights ------------------------------------------------------------------
    def _fetch_weights(self, slots: list[Slot] | None, velocity: bool,
                       then: Callable[[list, list], list]) -> list[Order]:
        """The current weights (and with ``velocity`` the outer velocity, or []) from one
        trainer that holds them; ``then(weights, velocity)`` gives the orders after."""
        self.fetch = _Fetch(slots, velocity, then)
        return self._fetch_from()

    def _fetch_from(self) -> list[Order]:
        f = self.fetch
        candidates = f.slots if f.slots is not None else self.members()
        holders = [s for s in candidates if s.index not in self.fresh and s.index in self.live]
        if not holders:
            raise WeightsLostError(self._weights_lost_message())
        call = self.call(holders[0], ("held_weights", (f.velocity,), {}))
        f.call = call.id
        return [call]

    def _fetched(self, event: CallDone) -> list[Order]:
        f, self.fetch = self.fetch, None
        w, v = event.value
        self.bytes_received += nbytes(w) + nbytes(v)
        return f.then([np.array(a, copy=True) for a in w], [np.array(a, copy=True) for a in v])

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
        if c is not None and call in c.calls:
            slot = c.calls.pop(call)
            value = event.value
            c.replies[slot.index] = value
            c.record["status"][slot.index] = value["status"]
            c.replies_all.append(value)
            orders: list[Order] = []
            if value["status"] != "done":
                orders = self._member_out(slot, f"trainer {slot.index}: {value['status']} "
                                                f"({value.get('detail', '')})")
            return orders + (self._attempt_over() if not c.calls else [])
        rd = self.open
        slot = rd.calls.pop(call)
        if not self.stopping:
            rd.results[slot.index] = event.value
        return self._maybe_reduce()

    def on_lost(self, event: TrainerLost) -> list[Order]:
        orders: list[Order] = []
        lost = set(event.calls)
        for call in lost & set(self.adopting):
            self.adopting.pop(call)
        if self.fetch is not None and self.fetch.call in lost:
            orders += self._fetch_from()   # from another trainer that holds them
        rd, c = self.open, self.coll
        for call in lost & set(c.calls if c is not None else ()):
            slot = c.calls.pop(call)
            c.lost_any = True
            c.record["status"][slot.index] = "lost"
            orders += self._member_out(slot, f"trainer {slot.index} was lost")
            if not c.calls:
                orders += self._attempt_over()
        for call in lost & set(rd.calls if rd is not None and c is None else ()):
            del rd.calls[call]    # its share of the round is lost
        orders += self.evals.lost(event.calls, self.members())
        orders += self._adoption_over()   # a newcomer lost while copying: go on without it
        if self.finishing:
            return orders + self._finished()
        if c is None:
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

    # -- checkpoints ---------------------------------------------------------------------------
    def position(self) -> dict:
        return self.rounds.position()

    def restore(self, ckpt) -> None:
        self.rounds.restore(ckpt.meta["position"], ckpt.arrays, self.round_no)


class AllreduceTrainer:
    """The trainer side of allreduce: ``TrainerActor`` inherits these methods. A round is
    :meth:`hold_delta` on every trainer, then :meth:`allreduce_held` on every trainer."""

    _ddlf_index: int        # what TrainerActor provides
    _last_call_end: float | None
    train: Callable[..., Any]
    get_weights: Callable[[], list]
    set_weights: Callable[[list], None]
    buffer_mask: Callable[[], list]

    # This round's delta, kept here, the ring's mailbox, the outer velocity (a copy on every
    # trainer: each applies the same step to the same mean, so the copies stay equal).
    _held: tuple | None = None
    _velocity: list | None = None

    def _ring_mailbox(self) -> ring.Mailbox:
        box = getattr(self, "_ddlf_mailbox", None)
        if box is None:
            box = self._ddlf_mailbox = ring.Mailbox()
        return box

    def hold_delta(self, key, indices, epochs: int, batch_size: int,
                   return_state: bool = False, learning_rate: float | None = None):
        """Train on rows ``indices`` from the current weights and keep the delta here for
        :meth:`allreduce_held` under ``key`` (``(run, round)``); return only the stats. The
        model keeps the round's starting weights: an evaluation queued behind this call
        sees them, and a collective that is redone starts again from them."""
        old = self.get_weights()
        delta, stats = self.train(None, indices, epochs, batch_size, return_state,
                                  learning_rate)
        self.set_weights(old)
        # The velocity the round starts from too: a redone collective starts again there.
        self._held = (tuple(key), old, delta, self._velocity)
        return stats

    def allreduce_held(self, tag, rank: int, size: int, right, fraction: float,
                       timeout_s: float, outer: dict | None = None) -> dict:
        """Average the held delta with the ring's (member ``rank`` of ``size``, sending to
        the handle ``right``; ``tag`` is ``(run, round, attempt)``), each scaled by its
        ``fraction`` of the samples, and apply the mean to the round's starting weights:
        plainly, or with ``outer = {"rate", "momentum", "nesterov"}`` on this trainer's
        copy of the velocity. Returns ``{"status": "done", "digest": CRC, ...}``, or with
        the weights unchanged ``"aborted"`` (called off), ``"peer_lost"`` (the right
        neighbour died) or ``"timeout"`` (nothing from the left for ``timeout_s``).
        ``RuntimeError`` if no delta of that run and round is held (a driver bug)."""
        start = time.perf_counter()
        tag = tuple(int(t) for t in tag)
        if self._held is None or self._held[0] != tag[:2]:
            held = None if self._held is None else self._held[0]
            raise RuntimeError(f"allreduce {tag} on trainer {self._ddlf_index}, which holds "
                               f"the delta of (run, round) {held}")
        _, old, delta, velocity = self._held
        box = self._ring_mailbox()
        box.begin(tag)
        vectors, spec = ring.scaled_vectors(ring_layers(delta), fraction)   # counters: f64
        reply = {"index": self._ddlf_index, "sent_bytes": ring.ring_send_bytes(vectors, rank, size)}
        try:   # the ring's calls go through this trainer's own runtime
            summed = ring.run_member(vectors, rank, size, tag, box,
                                     lambda *chunk: self.ring_send(right, tag, *chunk),
                                     backends.here(), timeout_s)
        except ring.CollectiveAborted as e:
            return {**reply, "status": "aborted", "detail": str(e)}
        except ring.PeerLost as e:
            return {**reply, "status": "peer_lost", "detail": str(e)}
        except ring.CollectiveTimeout as e:
            return {**reply, "status": "timeout", "detail": str(e)}
        mean = like_layers(ring.unflatten(summed, spec), delta)
        # Buffers (BatchNorm's statistics) take the mean at rate 1, no momentum (outer.py).
        weights, velocity = apply_outer(old, mean, velocity, outer, self.buffer_mask())
        self.set_weights(weights)
        if outer is not None:
            self._velocity = velocity
        spent = time.perf_counter() - start
        if self._last_call_end is not None:
            self._last_call_end += spent   # the collective is work, not idle time
        return {**reply, "status": "done", "digest": self.held_digest(),
                "collective_s": spent}

    def ring_send(self, right, tag, phase: str, step: int, chunk):
        """Send one chunk to the right neighbour; its call's ref (tests override it)."""
        return right.deliver_chunk.remote(tag, phase, step, chunk)

    async def deliver_chunk(self, tag, phase: str, step: int, chunk) -> None:
        """A chunk from the left. ``async``: it runs on the event loop, while the
        execution thread is inside :meth:`allreduce_held`."""
        self._ring_mailbox().deliver(tag, phase, step, chunk)

    async def abort_collective(self, tag, reason: str) -> None:
        """The driver calls collective ``tag`` off (a member was lost)."""
        self._ring_mailbox().abort(tag, reason)

    def adopt_weights(self, source) -> dict:
        """Copy the weights (and velocity) straight from the live trainer ``source``: how
        a replacement joins. ``{"status": "done", "digest", "bytes"}``, or
        ``{"status": "source_lost"}`` when ``source`` died first."""
        try:
            weights, velocity = backends.here().get(source.held_weights.remote(True))
        except ActorDiedError as e:
            return {"status": "source_lost", "detail": str(e).strip().splitlines()[0]}
        self.set_weights(weights)
        self._velocity = velocity or None   # None: no momentum step yet (zeros)
        return {"status": "done", "digest": self.held_digest(), "bytes": nbytes(weights)}

    def held_weights(self, velocity: bool = False) -> tuple[list, list]:
        """The weights held here and, with ``velocity``, the outer velocity ([] without):
        what the driver fetches for a checkpoint and at the end."""
        return self.get_weights(), list(self._velocity or []) if velocity else []

    def held_digest(self) -> int:
        """A CRC of the weights and the outer velocity this trainer holds: the driver checks
        that every member of an allreduce run holds the same."""
        return ring.weights_digest(list(self.get_weights()) + list(self._velocity or []))

    def set_outer_velocity(self, velocity) -> None:
        """Start from ``velocity`` (a resumed allreduce run's, or None)."""
        self._velocity = None if velocity is None else [np.array(v, copy=True)
                                                        for v in velocity]
