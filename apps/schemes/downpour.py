"""Downpour SGD (Dean et al. 2012, "Large Scale Distributed Deep Networks"), on DDLF trainers.

Each trainer runs SGD on its own copy of the weights, and talks to the driver (the
parameter server) on two periods of its own local steps:

- every ``n_fetch`` steps it *fetches* the driver's current weights;
- every ``n_push`` steps it *pushes* the update it has accumulated since its last push
  (old − new, summed over those steps), which the driver applies as it arrives:
  ``w ← w − update`` (divided by staleness + 1 with ``staleness_scaling``, the staleness
  being the updates applied since that trainer's fetch).

Trainers never wait for each other (``workqueue.py``: the queue, SSP, epochs, faults).
Each sample's update reaches the weights once, at its full rate, as in Downpour
(``async`` divides each delta by K instead).

How that maps onto calls: the work queue holds pieces of ``u = min(n_fetch, n_push)``
steps, and each piece is one call of the trainer's :meth:`DownpourTrainer.run_steps`
(below: the trainer side of this scheme). A call carries the weights only when a fetch is
due and returns the accumulated update only when a push is due (the trainer keeps it in
between), so traffic follows the two periods; the larger period must be a multiple of the
smaller. A trainer's last call of the run pushes what it holds.

Faults: a lost trainer's piece in flight *and* the pieces whose update it had not pushed
yet go back to the queue (their update never reached the weights), so each sample
still counts once per epoch; its replacement fetches before its first steps. A
checkpoint puts unpushed pieces back in the queue the same way.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, ClassVar

import numpy as np

from ..codecs import Codec
from ..options import ConfigError, filled, int_at_least, option
from ..weight_messages import TrainerWire, Weights
from .averaging import ValueBuffers
from .orders import TRAIN, Call, Order
from .slots import Slot
from .wire import PLAIN, WHOLE, Broadcast
from .workqueue import QueueMachine, ScaledQueueOptions, Update

__all__ = ["DownpourOptions", "DownpourMachine", "DownpourTrainer"]


@dataclasses.dataclass
class DownpourOptions(ScaledQueueOptions):
    scheme: ClassVar[str] = "downpour"

    n_fetch: int | None = option(None, check=int_at_least(1),
                                 help="fetch the weights every N local steps (default 16)")
    n_push: int | None = option(None, check=int_at_least(1),
                                help="push the accumulated update every N local steps "
                                     "(default 16)")

    def defaults(self, config) -> dict:
        return {**super().defaults(config), "n_fetch": 16, "n_push": 16}

    def validate(self, config) -> None:
        small, large = sorted((filled(self.n_fetch, "n_fetch"), filled(self.n_push, "n_push")))
        if large % small:
            raise ConfigError(f"n_fetch={self.n_fetch} and n_push={self.n_push}:",
                              f"the larger must be a multiple of the smaller (one call runs "
                              f"{small} steps), e.g. {small} and {small * -(-large // small)}")


class DownpourMachine(QueueMachine):
    name = "downpour"
    Options = DownpourOptions
    # A fetch sends the weights whole, encoded as compression= says, once per version
    # (trainers fetch different versions: a replica of changes does not apply); a push
    # comes up through the trainer's encoder (its error-feedback residual).
    wire_modes = (PLAIN, WHOLE)

    def __init__(self, ctx):
        super().__init__(ctx)
        o = self.options
        small = min(o.n_fetch, o.n_push)
        self.unit = small
        self.fetch_every = o.n_fetch // small    # in calls
        self.push_every = o.n_push // small
        self.since_fetch: dict[int, int | None] = {}   # slot -> calls since its fetch; None: due
        self.fetched_at: dict[int, int] = {}          # slot -> weights version it fetched
        self.unpushed: dict[int, list] = {}            # slot -> pieces trained, not pushed
        self.fresh: set[int] = set()                   # slots whose next call starts clean
        self._bc: Broadcast | None = None              # the current version's broadcast
        self._bc_version = -1
        # Buffers move toward the value a trainer reached, by 1/K (averaging.py).
        self.values = ValueBuffers(ctx.trainer_info)

    def cut_epoch(self, epoch: int, part: int | None) -> list:
        return self.plan.sized_pieces(epoch, self.unit * self.config.batch_size, part)

    # -- calls ---------------------------------------------------------------------------------
    def train_call(self, slot: Slot, indices: np.ndarray, want_state: bool) -> Call:
        held = len(self.unpushed.get(slot.index, ()))
        push = held + 1 >= self.push_every or not self.queue(slot.index)
        return self._run_steps(slot, indices, push, want_state)

    def idle_call(self, slot: Slot, want_state: bool) -> Call | None:
        """No work left: a trainer holding an update it has not pushed pushes it now."""
        if not self.unpushed.get(slot.index):
            return None
        return self._run_steps(slot, np.zeros(0, np.int32), True, want_state)

    def _run_steps(self, slot: Slot, indices: np.ndarray, push: bool, want_state: bool) -> Call:
        cfg = self.config
        j = slot.index
        since = self.since_fetch.get(j)
        weights = None
        if since is None or since >= self.fetch_every:
            if self._bc is None or self._bc_version != self.round_no:   # one per version
                self._bc, self._bc_version = self.wire.broadcast(self.w), self.round_no
            weights = self._bc.ref_for(slot)
            since = 0
            self.fetched_at[j] = self.round_no
            self.values.started(j, self._bc.model)   # the weights the trainer gets
            self.bytes_sent += self._bc.take_bytes()
        self.since_fetch[j] = since + 1
        fresh = j in self.fresh
        self.fresh.discard(j)
        self.bytes_sent += indices.nbytes
        coded = {} if self.wire.plain else {"up": self.wire.up, "residual": want_state}
        return self.call(slot, ("run_steps", (weights, indices, cfg.worker_epochs,
                                              cfg.batch_size, push),
                                {"fresh": fresh, "return_state": want_state, **coded,
                                 **self.rate_kwargs()}), TRAIN)

    def start_version(self, slot: Slot) -> int:
        return self.fetched_at.get(slot.index, self.round_no)

    # -- results -------------------------------------------------------------------------------
    def absorb(self, update: Update, value) -> bool:
        pushed, _stats = value
        j = update.slot.index
        if pushed is None:
            self.unpushed.setdefault(j, []).append(update.piece)
            return False
        self.unpushed.pop(j, None)
        pushed, size = self.wire.received(pushed)
        self.bytes_received += size
        scale = 1.0
        if self.options.staleness_scaling:
            scale /= self.round_no - update.start_version + 1
        self.w = self.values.apply(self.w, pushed, scale, j, scale / max(1, len(self.live)))
        return True

    # -- faults and membership -----------------------------------------------------------------
    def forget(self, slot: Slot) -> None:
        # Trained but never pushed: the weights never saw it, so it is trained again.
        self._requeue_unpushed(slot.index)
        self.since_fetch[slot.index] = None

    def admit(self, slots) -> list[Order]:
        orders = super().admit(slots)
        for slot in slots:   # a new trainer fetches first and holds no accumulation
            self.since_fetch[slot.index] = None
            self.fresh.add(slot.index)
            self._requeue_unpushed(slot.index)
        return orders

    def _requeue_unpushed(self, slot_index: int) -> None:
        q = self.queue(slot_index)
        for piece in reversed(self.unpushed.pop(slot_index, [])):
            q.appendleft(piece)

    def _work_left(self) -> bool:
        return super()._work_left() or any(self.unpushed.values())

    def unapplied(self) -> list:
        held = [(p, j) for j, pieces in self.unpushed.items() for p in reversed(pieces)]
        return super().unapplied() + held


class DownpourTrainer:
    """The trainer side of Downpour: ``TrainerActor`` inherits :meth:`run_steps`."""

    # What the class it is mixed into (TrainerActor, with wire.WireMethods) provides.
    _run: Callable[..., Any]
    _stats: Callable[..., dict]
    _wire_end: Callable[[], TrainerWire]
    get_weights: Callable[[], list]
    set_weights: Callable[[list], None]
    _accumulated: dict | None = None   # the update not pushed yet

    def run_steps(self, weights, indices, epochs: int, batch_size: int, push: bool,
                  fresh: bool = False, return_state: bool = False,
                  learning_rate: float | None = None, up: Codec | None = None,
                  residual: bool = False):
        """Train from ``weights`` (a fetch: the arrays, or a ``wire.Weights`` message;
        None: carry on from this trainer's own weights) on rows ``indices``, adding the
        change to an accumulated update. With ``push``, return ``(update, stats)`` and
        start a new accumulation: ``update`` is old − new summed over every call since the
        last push (encoded with ``up`` through this trainer's encoder when given, which
        keeps its error-feedback residual; ``residual`` adds that to the stats as
        ``wire_residual``), ``stats["samples"]`` and ``stats["loss"]`` cover those calls.
        Without, return ``(None, stats)`` with ``samples`` 0. ``fresh`` drops an
        accumulation left from another run. ``stats["trained"]`` is this call's own
        samples."""
        start = time.perf_counter()
        if isinstance(weights, Weights):
            weights = self._wire_end().receive(weights)
        if fresh:
            self._accumulated = None
        acc = self._accumulated or {"update": None, "samples": 0, "loss": 0.0}
        if len(indices):
            old, new, loss, samples = self._run(weights, indices, epochs, batch_size,
                                                learning_rate)
            change = [o - n for o, n in zip(old, new)]
            acc["update"] = change if acc["update"] is None else [
                a + c for a, c in zip(acc["update"], change)]
            acc["samples"] += samples
            acc["loss"] += loss * samples
        elif weights is not None:
            self.set_weights(weights)
        trained = int(len(indices))
        if not push:
            self._accumulated = acc
            stats = self._stats(start, 0, 0.0, return_state)
            stats["trained"] = trained
            return None, stats
        self._accumulated = None
        update = acc["update"]
        if update is None:   # nothing trained since the last push
            update = [np.zeros_like(w) for w in self.get_weights()]
        if up is not None:
            update, _secs = self._wire_end().encode(update, up)
        stats = self._stats(start, acc["samples"],
                            acc["loss"] / acc["samples"] if acc["samples"] else 0.0, return_state)
        stats["trained"] = trained
        if residual and up is not None:
            stats["wire_residual"] = self._wire_end().residual(up)
        return update, stats
