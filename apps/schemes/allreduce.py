"""Allreduce: the trainers average their deltas among themselves, over a ring.

The driver never ships weights or deltas in a round. It sends indices and control, and
the trainers keep the model:

1. **Train.** Every live trainer gets ``hold_delta(round, indices)``: it trains from the
   weights it holds and keeps its delta (and the weights it started from). Only the stats
   come back. The previous row's evaluation is queued before it, on the weights the
   trainers hold, in shards, as in ``sync``.
2. **Average.** The trainers that trained form a ring in slot order. Each gets
   ``allreduce_held((run, round, attempt), rank, size, right neighbour, n_j / Σn)``: it scales
   its delta by its share of the samples and runs a ring reduce-scatter plus all-gather
   with its neighbours, by direct actor calls (``ring.py``), then applies the mean to its
   starting weights. Each reports a CRC of its new weights (and outer velocity); the
   driver checks that they agree.

So the driver's bytes per round are the round's indices (the same for any K) plus a few
hundred bytes of control per trainer, and each trainer sends and receives ``2 (K−1)/K`` of
the model per round, whatever K. With the same seed and the same plan of indices the
result equals ``train_sync``'s up to the order of a floating-point sum (bit-equal for
K = 2): the products ``(n_j/Σn)·delta_j`` are the same, and each chunk is summed in ring
order starting from a different member.

Faults. A trainer lost while training: the ring is the survivors, each weighted by its own
samples (the average over the deltas that arrived, as in ``sync``). A trainer lost in
the collective: the driver sees its call fail, aborts the others' wait
(``abort_collective``; a member whose send failed stops by itself, and none waits longer
than ``chunk_timeout_s``), and runs the collective again over the survivors, from the
deltas and starting weights they still hold. A replacement (started by the pool) joins at
the next round: it copies the weights from a live trainer (``adopt_weights``), directly.
Every trainer holding the weights lost at once is a :class:`WeightsLostError` naming the
last checkpoint, not a hang.

Weights reach the driver only when needed: a checkpoint fetches them from one trainer,
and so does the end of the run. The start sends them once to every trainer.

The settings are sync's (``AVERAGING_OPTIONS``, the same defaults): the rounds, the
evaluations, the trainers' rate per round, and the outer optimizer, whose step the
trainers take themselves. The driver keeps its schedule and sends each collective the
rate, momentum and Nesterov flag; each trainer holds a copy of the velocity and applies
``momentum_update`` (``outer.py``) to the same mean, so the copies stay equal, a
replacement copies it with the weights, and a checkpoint fetches it with them.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import numpy as np

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError, DDLFError

from ..config import TrainConfig
from ..trainer import nbytes
from .base import TooFewTrainersError
from .pool import LOSS_ERRORS, Slot, SlotState
from .rates import steps_in
from .sync import AVERAGING_OPTIONS, SyncScheme, inner_rate
from .wire import PLAIN

__all__ = ["AllreduceScheme", "train_allreduce", "WeightsLostError", "CollectiveError"]


class WeightsLostError(TooFewTrainersError):
    """Every trainer that held the model's current weights was lost at once."""


class CollectiveError(DDLFError):
    """The trainers could not complete an allreduce, or disagree on its result."""


class AllreduceScheme(SyncScheme):
    name = "allreduce"
    # Sync's averaging settings; not its slow-node ones (a ring needs every member each
    # collective), and no codec: the trainers exchange plain chunks (schemes/wire.py).
    options = AVERAGING_OPTIONS
    wire_modes = (PLAIN,)
    # A member gives up waiting for one chunk after this long: the backstop behind the
    # driver's abort, for a neighbour that stopped sending without its process dying.
    chunk_timeout_s = 300.0
    # Collectives that fail with no trainer lost (timeouts) before the run gives up.
    max_quiet_failures = 2

    def __init__(self, model_fn, dataset, config: TrainConfig, trainers=None):
        super().__init__(model_fn, dataset, config, trainers)
        self._fresh: set[int] = set()   # slots whose trainer does not hold the weights yet
        self.digest: int | None = None  # CRC of the weights the trainers hold
        # Per collective: {"round", "attempt", "ring": slots, "status": {slot: status}}
        # ("lost" for a trainer whose call failed). Tests and benchmarks read it.
        self.collectives: list[dict] = []
        # Names this run's collectives: trainers can outlive a run and serve the next one.
        self.run_id = secrets.randbits(63)

    # -- membership --------------------------------------------------------------------------
    def admit(self, slots) -> None:
        super().admit(slots)
        self._fresh.update(s.index for s in slots)

    @staticmethod
    def _alive(slot: Slot, handle) -> bool:
        """``slot`` still holds the trainer ``handle`` (a replacement is another trainer)."""
        return slot.state is SlotState.LIVE and slot.handle is handle

    def members(self) -> list[Slot]:
        """The live trainers, every one holding the current weights: trainers that joined
        copy them from one that holds them, trainer to trainer.

        Raises :class:`WeightsLostError` at once when no live trainer holds them (waiting
        for replacements would not bring them back), and as ``Scheme.members`` otherwise.
        """
        while True:
            if not any(s.index not in self._fresh for s in self.pool.live()):
                raise WeightsLostError(self._weights_lost_message())
            live = super().members()
            fresh = [s for s in live if s.index in self._fresh]
            if not fresh:
                return live
            holders = [s for s in live if s.index not in self._fresh]
            calls = {}
            for i, slot in enumerate(fresh):
                source = holders[i % len(holders)]
                calls[slot.handle.adopt_weights.remote(source.handle)] = (slot, source)
            while calls:
                ref, value, lost = self.next_done(list(calls))
                slot, source = calls.pop(ref)
                if lost is not None:
                    self.lose(slot, lost)
                elif value["status"] == "source_lost":
                    # The runtime told the newcomer its source died: that is a loss.
                    self.lose(source, ActorDiedError(value.get("detail") or "the actor died"))
                else:
                    if self.digest is not None and value["digest"] != self.digest:
                        raise CollectiveError(
                            f"trainer {slot.index} copied weights from trainer {source.index} "
                            f"whose CRC {value['digest']:#x} is not the run's {self.digest:#x}: "
                            "a bug in DDLF's allreduce, please report it")
                    self._fresh.discard(slot.index)

    def _weights_lost_message(self) -> str:
        cfg = self.config
        if self.writer is not None:
            self.writer.close()   # the run ends here: name the checkpoint being written
        saved = (f"The last checkpoint, {self.last_checkpoint}, is valid: continue with "
                 f"resume={cfg.checkpoint_dir!r} (ddlf-train run --resume DIR)."
                 if self.last_checkpoint else
                 "No checkpoint was written (set checkpoint_dir= to be able to resume).")
        return (f"training stopped at round {self.round_no}: every trainer holding the current "
                "weights was lost at once, and allreduce keeps the model only on its trainers "
                f"(the driver fetches it for checkpoints and at the end). {saved}")

    # -- the run -----------------------------------------------------------------------------
    def loop(self, w: list) -> list:
        cfg = self.config
        self.inner = inner_rate(cfg, self.pool.live()[0].info.get("learning_rate"))
        self._broadcast(w)
        R = cfg.rounds_per_epoch
        while self.round_no < self.total_rows():
            epoch, r = divmod(self.round_no, R)
            if self._round(epoch + 1, r):
                return self._fetch_weights()
        if self.pending_row is not None:   # the last weights' evaluation
            live = self.members()
            evaluation = self.evaluation(self.pending_row, None)
            self.pending_row = None
            if evaluation is not None:
                evaluation.submit(live)
                self._gather({}, evaluation, {})
        return self._fetch_weights()

    def _broadcast(self, w: list) -> None:
        """The start: one ``put`` of the weights, set on every trainer (the only time the
        driver sends them)."""
        live = self.pool.live()
        ref = self.put_weights(w)
        # The velocity a resumed run continues from (None otherwise: adopted trainers
        # may hold one from an earlier run).
        velocity = self.outer.velocity
        v_ref = ddlf.put(velocity) if velocity else None
        for slot in live:
            slot.handle.set_weights.remote(ref)
            slot.handle.set_outer_velocity.remote(v_ref)
        self.bytes_sent += len(live) * (nbytes(w) + (nbytes(velocity) if velocity else 0))
        self._fresh.difference_update(s.index for s in live)

    def _fetch_weights(self, slots: list[Slot] | None = None, velocity: bool = False):
        """The current weights, from one trainer that holds them; with ``velocity``,
        ``(weights, the outer velocity or [])`` from the same trainer."""
        while True:
            holders = [s for s in (slots or self.pool.live()) if s.index not in self._fresh
                       and s.state is SlotState.LIVE]
            if not holders:
                raise WeightsLostError(self._weights_lost_message())
            slot = holders[0]
            try:
                w = ddlf.get(slot.handle.get_weights.remote())
                v = ddlf.get(slot.handle.get_outer_velocity.remote()) if velocity else None
            except LOSS_ERRORS as e:
                self.lose(slot, e)
                continue
            self.bytes_received += nbytes(w) + (nbytes(v) if v else 0)
            w = [np.array(a, copy=True) for a in w]
            if not velocity:
                return w
            return w, [np.array(a, copy=True) for a in v] if v else []

    # The weights stay on the trainers (the ring averages them there), so a round takes no
    # weights and returns none, unlike sync's.
    def _round(self, epoch: int, r: int) -> bool:  # type: ignore[override]
        """Run one round; return True if a callback stopped the run."""
        cfg = self.config
        t_round = time.perf_counter()
        live = self.members()
        round_no = self.round_no + 1
        pieces = self.plan.round_pieces(epoch, r, [s.index for s in live])
        evaluation = None
        if self.pending_row is not None:
            # The previous round's weights are what the trainers hold: evaluate them there,
            # queued before the train calls (no weights travel).
            evaluation = self.evaluation(self.pending_row, None)
            if evaluation is not None:
                evaluation.submit(live)
            self.pending_row = None
        want_state = self.checkpoint_due(round_no)
        rate = self.inner.at(self.round_no, self.inner_steps, len(live))
        extra = {} if rate is None else {"learning_rate": rate}
        calls = {}
        handles = {}
        for slot in live:
            ref = slot.handle.hold_delta.remote((self.run_id, round_no), pieces[slot.index],
                                                cfg.worker_epochs, cfg.batch_size,
                                                return_state=want_state, **extra)
            calls[ref] = slot
            handles[slot.index] = slot.handle
        self.bytes_sent += sum(p.nbytes for p in pieces.values())
        results: dict = {}
        # Also waits for the evaluation: a shard reassigned after a loss must run before
        # the collective changes the weights.
        if self._gather(calls, evaluation, results):
            return True
        for j, stats in results.items():
            self.keep_state(j, stats)
        ring = [s for s in live if s.index in results and self._alive(s, handles[s.index])]
        t_collective = time.perf_counter()
        members, replies = self._allreduce(round_no, ring, handles, results)
        collective_s = time.perf_counter() - t_collective
        self.inner_steps += steps_in(max(len(p) for p in pieces.values()), cfg.batch_size,
                                     cfg.worker_epochs)
        self.round_no = round_no
        # A checkpoint needs the weights (and the velocity) here: fetched from one
        # trainer, counted in this round's row.
        saved = self._fetch_weights(members, velocity=True) if self.checkpoint_due(round_no) \
            else None
        row = self.new_row(round_no, epoch - 1 + (r + 1) / cfg.rounds_per_epoch,
                           [results[s.index] for s in members], time.perf_counter() - t_round)
        row["collective_s"] = collective_s
        row["ring_bytes"] = sum(rep["sent_bytes"] for rep in replies)
        if rate is not None:
            row["learning_rate"] = rate
        if not self.outer.plain:
            row["outer_lr"] = self.outer.last_rate
        if round_no % cfg.eval_every == 0 or round_no == self.total_rows():
            self.pending_row = row      # evaluated during the next round
        else:
            self.finish_row(row)
        if saved is not None:
            w, velocity = saved
            self.save_checkpoint(w, {"outer": velocity} if velocity else None)
        return False

    def _allreduce(self, round_no: int, ring: list[Slot], handles: dict,
                   results: dict) -> tuple[list[Slot], list[dict]]:
        """Average the held deltas of ``ring``'s trainers among them, again over the
        survivors until one collective completes. Returns the members of that collective
        and every reply (all attempts: their bytes crossed the wire)."""
        attempt = 0
        quiet_failures = 0
        replies_all: list[dict] = []
        while True:
            if not ring:
                raise WeightsLostError(self._weights_lost_message())
            attempt += 1
            tag = (self.run_id, round_no, attempt)
            n = len(ring)
            # The outer step for this ring's size (the K rule counts the deltas averaged).
            outer = self.outer.remote_settings(n)
            extra = {} if outer is None else {"outer": outer}
            total = float(sum(results[s.index]["samples"] for s in ring))
            calls = {}
            for rank, slot in enumerate(ring):
                right = handles[ring[(rank + 1) % n].index]
                share = results[slot.index]["samples"] / total
                ref = handles[slot.index].allreduce_held.remote(tag, rank, n, right, share,
                                                                self.chunk_timeout_s, **extra)
                calls[ref] = slot
            replies: dict = {}
            record: dict[str, Any] = {"round": round_no, "attempt": attempt, "ring": [s.index for s in ring],
                      "status": {}}
            self.collectives.append(record)
            lost_any = aborted = False
            while calls:
                ref, value, lost = self.next_done(list(calls))
                slot = calls.pop(ref)
                if lost is not None:
                    self.lose(slot, lost)
                    lost_any = True
                    record["status"][slot.index] = "lost"
                    why = f"trainer {slot.index} was lost"
                else:
                    replies[slot.index] = value
                    record["status"][slot.index] = value["status"]
                    replies_all.append(value)
                    why = f"trainer {slot.index}: {value['status']} ({value.get('detail', '')})"
                    if value["status"] == "done":
                        continue
                if not aborted:
                    # Nobody waits for a chunk that will never come.
                    aborted = True
                    for other in calls.values():
                        handles[other.index].abort_collective.remote(tag, why)
            survivors = [s for s in ring if self._alive(s, handles[s.index])]
            if survivors and all(replies[s.index]["status"] == "done" for s in survivors):
                digests = {replies[s.index]["digest"] for s in survivors}
                if len(digests) != 1:
                    raise CollectiveError(
                        f"after round {round_no}'s allreduce the trainers hold different "
                        f"weights (CRCs {sorted(digests)}): a bug in DDLF's allreduce, please "
                        "report it")
                self.digest = digests.pop()
                self.outer.took_step(outer)
                return survivors, replies_all
            if not lost_any:
                quiet_failures += 1
                if quiet_failures > self.max_quiet_failures:
                    detail = "; ".join(f"trainer {j}: {rep['status']} {rep.get('detail', '')}"
                                       for j, rep in sorted(replies.items()))
                    raise CollectiveError(
                        f"round {round_no}'s allreduce failed {quiet_failures} times with no "
                        f"trainer lost ({detail}). A trainer that stops sending without dying "
                        "(a hung process, a link that drops data) holds up the ring; check the "
                        "trainers' logs and the network between the nodes")
            ring = survivors


def train_allreduce(model_fn, dataset, *, trainers=None, initial_weights=None, resume=None,
                    **options):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers that average their deltas
    among themselves (ring allreduce), synchronously.

    Same arguments, options and errors as :func:`train_sync`; the history rows are rounds,
    with ``collective_s`` (the allreduce's time) and ``ring_bytes`` (what the trainers
    sent each other) besides the usual keys. The driver sends indices and control only;
    the weights reach it at checkpoints and at the end. Raises :class:`WeightsLostError`
    (a ``TooFewTrainersError``) when every trainer holding the weights is lost at once,
    and :class:`CollectiveError` when a collective keeps failing with no trainer lost.
    """
    if resume is not None and options.get("checkpoint_dir") is None:
        options["checkpoint_dir"] = resume
    config = TrainConfig.from_options(options, caller="train_allreduce")
    return AllreduceScheme(model_fn, dataset, config, trainers).run(initial_weights, resume)
