"""Asynchronous data parallelism: the paper's Algorithm 3, improved, surviving lost trainers.

Trainers never wait for each other (``workqueue.py``: the queue, SSP, epochs and faults).
As each delta arrives the driver applies ``delta_j / K`` (divided by ``staleness + 1``
with ``staleness_scaling``), where K is the number of trainers live now, then gives that
trainer the newest weights and a fresh piece of work. ``staleness_bound = s`` is SSP: a
trainer may start its next update only while it is at most ``s`` updates ahead of the
slowest *live* trainer. ``rounds_per_epoch`` cuts an epoch into that many pieces per
trainer.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ..options import int_at_least, option
from .averaging import ValueBuffers
from .orders import TRAIN, Call
from .slots import Slot
from .wire import PLAIN, WHOLE, Broadcast
from .workqueue import QueueMachine, ScaledQueueOptions, Update

__all__ = ["AsyncOptions", "AsyncMachine"]


@dataclasses.dataclass
class AsyncOptions(ScaledQueueOptions):
    scheme: ClassVar[str] = "async"

    rounds_per_epoch: int | None = option(
        None, check=int_at_least(1), help="pieces per trainer per epoch (default 1)")

    def defaults(self, config) -> dict:
        return {**super().defaults(config), "rounds_per_epoch": 1}

    def plan_rounds(self) -> int:
        return self.rounds_per_epoch or 1


class AsyncMachine(QueueMachine):
    name = "async"
    Options = AsyncOptions
    # Trainers hold different versions, so weights go down whole (encoded or not); a down
    # codec that sends changes of one shared replica is refused (wire.py).
    wire_modes = (PLAIN, WHOLE)

    _bc: Broadcast | None = None
    _bc_version = -1

    def __init__(self, ctx):
        super().__init__(ctx)
        # Buffers move toward the value a trainer reached (averaging.py), not by steps.
        self.values = ValueBuffers(ctx.trainer_info)

    def cut_epoch(self, epoch: int, part: int | None) -> list:
        """``rounds_per_epoch`` pieces per trainer the run is sized for."""
        return [p for _, p in self.plan.async_pieces(epoch, self.config.workers, part)]

    def _weights(self) -> Broadcast:
        """One broadcast of the current weights per version (a ``put``, encoded as
        ``compression=`` says), shared by every call."""
        if self._bc is None or self._bc_version != self.round_no:
            self._bc, self._bc_version = self.wire.broadcast(self.w), self.round_no
        return self._bc

    def train_call(self, slot: Slot, indices: np.ndarray, want_state: bool) -> Call:
        cfg = self.config
        bc = self._weights()
        self.values.started(slot.index, self.w)
        # A checkpoint call also brings back the trainer's error-feedback residual, as it
        # brings its optimizer state: both are saved as of that trainer's last such call.
        spec = bc.train(slot, indices, cfg.worker_epochs, cfg.batch_size,
                        return_state=want_state, residual=want_state, **self.rate_kwargs())
        self.bytes_sent += bc.take_bytes() + indices.nbytes
        return self.call(slot, spec, TRAIN)

    def absorb(self, update: Update, value) -> bool:
        payload, _stats = value
        delta, size = self.wire.received(payload)
        self.bytes_received += size
        scale = 1.0 / max(1, len(self.live))
        if self.options.staleness_scaling:
            scale /= self.round_no - update.start_version + 1
        self.w = self.values.apply(self.w, delta, scale, update.slot.index)
        return True
