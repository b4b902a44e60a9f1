"""Data-parallel: a gradient all-reduce on every step, as PyTorch DDP and Horovod do.

The baseline that local SGD (``sync``, ``allreduce``: average every H steps) trades
against: it learns as much per sample as one trainer stepping on the K trainers' batches
together, and pays one all-reduce of the gradient per step instead of one of the delta
per round. Use it on fast links, or to measure what averaging costs.

It is allreduce's machine with another round (``dp_trainer.py`` is the trainer's end):

1. **Hold.** Every live trainer gets ``dp_hold(round, indices)``: it keeps its rows and the
   state the round starts from (weights, optimizer state); the previous row's evaluation
   is queued before it, as in allreduce.
2. **Steps.** The trainers that hold rows form a ring in slot order and each gets
   ``dp_steps((run, round, attempt), rank, size, right neighbour, counts)``: for each
   batch, the gradient, one ring all-reduce of it (``ring.py``: each trainer sends
   ``2 (K−1)/K`` of the gradient, ``G`` bytes), and one step of the trainer's own
   optimizer with the mean. Weights and optimizer state stay identical on every trainer
   (the driver checks a CRC of both after each round); nothing is averaged but gradients
   (and, once a round, buffers such as BatchNorm's statistics).

Per step every trainer sends and receives ``2 (K−1)/K · G`` bytes, ``G`` the trainable
parameters' bytes (float32: 4 per parameter), in ``2 (K−1)`` messages; a round of H steps
sends H times that. The driver's link carries indices and control only.

Faults are allreduce's: a trainer lost during the steps makes the others give up the
round's collective (the driver's abort, a failed send, or ``chunk_timeout_s``), put back
the round's starting state and run the round again over the survivors, without the lost
trainer's rows. A replacement copies the weights *and the optimizer state* from a live
trainer (``dp_adopt``). Checkpoints hold the weights from one trainer and every slot's
optimizer state (the same).

Settings: allreduce's rounds (``rounds_per_epoch``/``steps_per_round`` only size the
driver's bookkeeping: evaluations, checkpoints, how far a fault sets a run back),
``eval_every``, ``lr_schedule``, ``lr_scaling="inner"`` (the linear scaling rule for
the larger batch) with ``warmup_rounds`` or ``"sqrt"`` (the square-root rule, Adam's),
``chunk_timeout_s``. There is no outer
optimizer and no streaming; ``compression=`` takes a codec without error feedback
(``fp16``, ``int8``) for each hop of the gradient.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..options import ConfigError
from .allreduce import AllreduceMachine, AllreduceOptions
from .machine import RunContext
from .ring_parts import Collective, ring_spec

__all__ = ["DataParallelOptions", "DataParallelMachine"]

# What only averaging schemes read: refused, not ignored.
_AVERAGING_ONLY = {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False,
                   "overlap": False, "fragments": 1}


@dataclasses.dataclass
class DataParallelOptions(AllreduceOptions):
    """Allreduce's rounds, without the outer optimizer and streaming (module doc)."""

    scheme: ClassVar[str] = "dataparallel"

    DEFAULTS: ClassVar[dict] = {**AllreduceOptions.DEFAULTS, **_AVERAGING_ONLY,
                                "lr_scaling": "none"}

    def defaults(self, config) -> dict:
        out = dict(self.DEFAULTS)
        if self.lr_scaling in (None, "none", "sqrt"):
            out["warmup_rounds"] = 0
        return out

    def validate(self, config) -> None:
        for name, plain in _AVERAGING_ONLY.items():
            value = getattr(self, name)
            if value is not None and value != plain:
                raise ConfigError(
                    f"{name}={value!r}", "does not apply to scheme='dataparallel': it "
                    "averages gradients every step, with the trainers' own optimizer, and "
                    "has no outer step or streamed rounds (use scheme='allreduce' for those)")
        if self.lr_scaling == "outer":
            raise ConfigError("lr_scaling='outer'", "scales an outer step, which "
                              "scheme='dataparallel' has none of: use lr_scaling='inner' "
                              "(the trainers' rate times K, the linear scaling rule)")
        super().validate(config)
        _codec, feedback = ring_spec(config.compression)
        if feedback:
            raise ConfigError(
                f"compression={config.compression!r}",
                "needs error feedback across collectives, which scheme='dataparallel' does "
                "not keep for its per-step gradients: use a codec without it ('fp16', "
                "'int8', or 'int4:noef'), or none")


class DataParallelMachine(AllreduceMachine):
    name = "dataparallel"
    Options = DataParallelOptions
    hold_method = "dp_hold"
    reduce_method = "dp_steps"
    adopt_method = "dp_adopt"

    def __init__(self, ctx: RunContext):
        missing = ctx.trainer_info.get("gradients_missing")
        if missing:
            raise ConfigError(
                "scheme='dataparallel'",
                f"needs each step's gradient from the trainers, and {missing}. Override "
                "TrainerActor.compute_gradients(x, y) -> (gradients, loss) and "
                "apply_gradients(gradients), or use scheme='allreduce', which averages "
                "weights and needs neither")
        super().__init__(ctx)

    def _reduce_extra(self, c: Collective) -> dict:
        rd = c.rd
        if rd is None:
            raise RuntimeError("dataparallel has no flush collective (a bug in DDLF)")
        extra: dict = {"counts": [rd.results[s.index]["samples"] for s in c.ring]}
        if self.checkpoint_due(rd.number):
            extra["want_state"] = True
        return extra

    def _reduced(self, members):
        """The round's steps completed: its loss, compute and optimizer state come from
        the collective's replies (the hold only kept the rows)."""
        c = self._collective()
        rd = c.rd
        assert rd is not None
        for s in members:
            reply = c.replies[s.index]
            stats = rd.results[s.index]
            stats["loss"], stats["compute_s"] = reply["loss"], reply["compute_s"]
            state = reply.pop("optimizer_state", None)
            if state is not None:
                self.optimizer_states[s.index] = state
        # A row's collective_s: the slowest member's time in the ring, not the whole
        # collective call (which holds the steps' compute too).
        c.t_start = self.now - max(c.replies[s.index].get("collective_s", 0.0)
                                   for s in members)
        return super()._reduced(members)
