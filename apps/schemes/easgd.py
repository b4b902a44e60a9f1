"""Elastic averaging SGD (Zhang, Choromanska & LeCun 2015), asynchronous, on DDLF trainers.

Each trainer j keeps weights of its own, ``x_j``, and runs ``tau`` local SGD steps at a
time. The driver holds the *center* ``x̃``, which is what the run evaluates and returns.
After each ``tau`` steps trainer j and the center pull towards each other, as if joined
by a spring of strength ``alpha``:

    e   = alpha (x_j − x̃)
    x_j ← x_j − e
    x̃  ← x̃ + e

Trainers never wait for each other (the paper's asynchronous EASGD, its Algorithm 1;
the queue, SSP and faults are ``workqueue.py``'s). The exchange is computed on the driver
with the center *as it is when the trainer's steps arrive*, so the center a trainer is
pulled toward is never stale: a call sends ``x_j`` and returns ``delta = x_j − x_j'``; the
driver computes ``x_j'``, the exchange, and sends ``x_j − e`` with the trainer's next
call. The driver keeps each ``x_j`` (one copy of the weights per trainer), so a call
carries the same bytes as an asynchronous one, and checkpoints hold every ``x_j``.

``alpha`` defaults to ``0.9 / K`` (the paper's β = Kα = 0.9); ``tau`` (local steps
between exchanges) to 16. A lost trainer's piece goes back to the queue; its replacement
continues from ``x_j`` as the driver last sent it (what the lost trainer held before the
call that was lost), and a trainer new to the run starts from the center.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ..options import int_at_least, number_in, option
from .averaging import elastic_exchange
from .orders import TRAIN, Call
from .slots import Slot
from .wire import PLAIN, WHOLE
from .workqueue import QueueMachine, QueueOptions, Update

__all__ = ["EasgdOptions", "EasgdMachine", "elastic_exchange"]


@dataclasses.dataclass
class EasgdOptions(QueueOptions):
    # No staleness_scaling: an exchange is elastic (each trainer is pulled toward the
    # centre by alpha), not an update to scale down.
    scheme: ClassVar[str] = "easgd"

    alpha: float | None = option(None, check=number_in(0.0, 1.0, low_open=True),
                                 help="elastic coefficient (default 0.9/K)")
    tau: int | None = option(None, check=int_at_least(1),
                             help="local steps between exchanges (default 16)")

    def defaults(self, config) -> dict:
        return {"tau": 16, "alpha": 0.9 / config.workers}


class EasgdMachine(QueueMachine):
    name = "easgd"
    Options = EasgdOptions
    # Each trainer holds weights of its own, x_j: they go down whole, encoded as
    # compression= says (a replica of changes shared by every trainer does not apply), and
    # deltas come up through each trainer's encoder (its error-feedback residual).
    wire_modes = (PLAIN, WHOLE)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.local: dict[int, list] = {}   # slot -> x_j as last sent to its trainer

    def cut_epoch(self, epoch: int, part: int | None) -> list:
        # One piece is one exchange period: tau local steps.
        return self.plan.sized_pieces(epoch, self.options.tau * self.config.batch_size, part)

    def train_call(self, slot: Slot, indices: np.ndarray, want_state: bool) -> Call:
        cfg = self.config
        x = self.local.get(slot.index)
        if x is None:   # a trainer new to the run starts from the center
            x = self.w
        bc = self.wire.broadcast(x)
        # x_j is what the trainer trains from: the weights as its codec delivers them.
        self.local[slot.index] = bc.model
        spec = bc.train(slot, indices, cfg.worker_epochs, cfg.batch_size,
                        return_state=want_state, residual=want_state, **self.rate_kwargs())
        self.bytes_sent += bc.take_bytes() + indices.nbytes
        return self.call(slot, spec, TRAIN)

    def absorb(self, update: Update, value) -> bool:
        delta, size = self.wire.received(value[0])
        self.bytes_received += size
        j = update.slot.index
        trained = [x - d.astype(x.dtype, copy=False) for x, d in zip(self.local[j], delta)]
        self.w, self.local[j] = elastic_exchange(self.w, trained, self.options.alpha)
        return True

    # -- checkpoints: the center is the checkpoint's weights; each x_j goes with it ---------
    def pending_arrays(self) -> dict:
        out = super().pending_arrays()
        for j, x in self.local.items():
            out[f"local{j}"] = x
        return out

    def restore(self, ckpt) -> None:
        super().restore(ckpt)
        self.local = {int(name[len("local"):]): [np.array(a, copy=True) for a in arrays]
                      for name, arrays in ckpt.arrays.items() if name.startswith("local")}
