"""Downpour SGD (Dean et al. 2012, "Large Scale Distributed Deep Networks"), on DDLF trainers.

Each trainer runs SGD on its own copy of the weights, and talks to the driver (the
parameter server) on two periods of its own local steps:

- every ``n_fetch`` steps it *fetches* the driver's current weights;
- every ``n_push`` steps it *pushes* the update it has accumulated since its last push
  (old − new, summed over those steps), which the driver applies as it arrives:
  ``w ← w − update`` (divided by staleness + 1 with ``staleness_scaling``, the staleness
  being the updates applied since that trainer's fetch).

Trainers never wait for each other. Each sample's update reaches the weights once, at
its full rate, as in Downpour (``train_async`` divides each delta by K instead).

How that maps onto calls: the work queue holds pieces of ``u = min(n_fetch, n_push)``
steps, and each piece is one call of ``TrainerActor.run_steps``. A call carries the
weights only when a fetch is due and returns the accumulated update only when a push is
due (the trainer keeps it in between), so traffic follows the two periods; the larger
period must be a multiple of the smaller. A trainer's last call of the run pushes what it
holds.

Faults: a lost trainer's piece in flight *and* the pieces whose update it had not pushed
yet go back to the queue (their update never reached the weights), so each sample
still counts once per epoch; its replacement fetches before its first steps. A
checkpoint puts unpushed pieces back in the queue the same way.
"""

from __future__ import annotations

import numpy as np

from ..config import TrainConfig
from ..trainer import nbytes
from .asynchronous import AsyncScheme, _Update
from .averaging import apply_delta
from .pool import Slot
from .wire import PLAIN

__all__ = ["DownpourScheme"]


class DownpourScheme(AsyncScheme):
    name = "downpour"
    # Its trainers exchange plain weights and deltas with their own calls: compression= is
    # refused by name rather than ignored (schemes/wire.py).
    wire_modes = (PLAIN,)
    options = ("staleness_bound", "staleness_scaling", "lr_schedule", "n_fetch", "n_push")
    defaults = {"n_fetch": 16, "n_push": 16, "staleness_scaling": False}

    def __init__(self, model_fn, dataset, config: TrainConfig, trainers=None):
        super().__init__(model_fn, dataset, config, trainers)
        cfg = self.config
        small = min(cfg.n_fetch, cfg.n_push)
        self.unit = small
        self.fetch_every = cfg.n_fetch // small    # in calls
        self.push_every = cfg.n_push // small
        self.since_fetch: dict[int, int | None] = {}   # slot -> calls since its fetch; None: due
        self.fetched_at: dict[int, int] = {}          # slot -> weights version it fetched
        self.unpushed: dict[int, list] = {}            # slot -> pieces trained, not pushed
        self.fresh: set[int] = set()                   # slots whose next call starts clean

    @classmethod
    def validate(cls, config: TrainConfig) -> None:
        small, large = sorted((config.n_fetch, config.n_push))
        if large % small:
            raise ValueError(f"n_fetch={config.n_fetch} and n_push={config.n_push}: the larger "
                             f"must be a multiple of the smaller (one call runs {small} steps), "
                             f"e.g. {small} and {small * -(-large // small)}")

    def _cut_epoch(self, epoch: int, part: int | None) -> list:
        return self.plan.sized_pieces(epoch, self.unit * self.config.batch_size, part)

    # -- calls ---------------------------------------------------------------------------------
    def _call(self, slot: Slot, indices: np.ndarray, want_state: bool):
        j = slot.index
        held = len(self.unpushed.get(j, ()))
        push = held + 1 >= self.push_every or not self._more_work(j)
        return self._run_steps(slot, indices, push, want_state)

    def _call_without_work(self, slot: Slot, want_state: bool):
        """No work left: a trainer holding an update it has not pushed pushes it now."""
        if not self.unpushed.get(slot.index):
            return None
        return self._run_steps(slot, np.zeros(0, np.int32), True, want_state)

    def _shared_weights_ref(self):
        """One plain ``put`` of the current weights per version (no codec: see wire_modes)."""
        if self._w_ref_version != self.round_no:
            self._w_ref, self._w_ref_version = self.put_weights(self.w), self.round_no
        return self._w_ref

    def _run_steps(self, slot: Slot, indices: np.ndarray, push: bool, want_state: bool):
        cfg = self.config
        j = slot.index
        since = self.since_fetch.get(j)
        weights = None
        if since is None or since >= self.fetch_every:
            weights = self._shared_weights_ref()
            self.since_fetch[j] = 0
            self.fetched_at[j] = self.round_no
            self.bytes_sent += nbytes(self.w)
        self.since_fetch[j] += 1
        fresh = j in self.fresh
        self.fresh.discard(j)
        self.bytes_sent += indices.nbytes
        return slot.handle.run_steps.remote(weights, indices, cfg.worker_epochs, cfg.batch_size,
                                            push, fresh=fresh, return_state=want_state,
                                            **self._rate_kwargs())

    def _more_work(self, slot_index: int) -> bool:
        """Whether the queue holds more for this trainer after the piece just taken."""
        q = self._queue(slot_index)   # plans the next epoch if this one is used up
        return bool(q)

    def _start_version(self, slot: Slot) -> int:
        return self.fetched_at.get(slot.index, self.round_no)

    # -- results -------------------------------------------------------------------------------
    def _absorb(self, update: _Update, value) -> bool:
        pushed, stats = value
        j = update.slot.index
        if pushed is None:
            self.unpushed.setdefault(j, []).append(update.piece)
            return False
        self.unpushed.pop(j, None)
        self.bytes_received += nbytes(pushed)
        scale = 1.0
        if self.config.staleness_scaling:
            scale /= self.round_no - update.start_version + 1
        self.w = apply_delta(self.w, pushed, scale)
        return True

    # -- faults and membership -----------------------------------------------------------------
    def lose(self, slot: Slot, error: BaseException) -> None:
        super().lose(slot, error)
        # Trained but never pushed: the weights never saw it, so it is trained again.
        self._requeue_unpushed(slot.index)
        self.since_fetch[slot.index] = None

    def admit(self, slots) -> None:
        super().admit(slots)
        for slot in slots:   # a new trainer fetches first and holds no accumulation
            self.since_fetch[slot.index] = None
            self.fresh.add(slot.index)
            self._requeue_unpushed(slot.index)

    def _requeue_unpushed(self, slot_index: int) -> None:
        q = self._queue(slot_index)
        for piece in reversed(self.unpushed.pop(slot_index, [])):
            q.appendleft(piece)

    def _work_left(self) -> bool:
        return super()._work_left() or any(self.unpushed.values())

    def _unapplied(self) -> list:
        held = [(p, j) for j, pieces in self.unpushed.items() for p in reversed(pieces)]
        return super()._unapplied() + held
