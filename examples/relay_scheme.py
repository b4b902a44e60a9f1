"""A toy scheme in one file: trainers take turns training the newest weights.

docs/training.md shows it as the example of adding a scheme; its test is
tests/apps/test_unit_toy_scheme.py (on the in-process fake backend).
"""

import dataclasses
from typing import ClassVar

from ddlf_actors.apps.options import SchemeOptions, int_at_least, option
from ddlf_actors.apps.schemes.averaging import apply_delta
from ddlf_actors.apps.schemes.machine import Machine
from ddlf_actors.apps.schemes.orders import TRAIN, EmitRow, Stop


@dataclasses.dataclass
class RelayOptions(SchemeOptions):
    scheme: ClassVar[str] = "relay"
    pieces: int | None = option(None, check=int_at_least(1), help="turns per epoch (default 4)")

    def defaults(self, config):
        return {"pieces": 4}

    def plan_rounds(self):
        return self.pieces


class RelayMachine(Machine):
    """Each turn, the next live trainer trains the newest weights on the next piece."""

    name = "relay"
    Options = RelayOptions

    def total_rows(self):
        return self.config.master_epochs

    def begin(self, weights):
        self.w, self.turns = weights, []
        return self._turn()

    def _turn(self):
        epoch, r = divmod(self.round_no, self.options.pieces)
        if epoch == self.config.master_epochs:
            return [Stop(self.w)]
        if not self.live:
            return self.too_few()      # wait for a replacement (TrainersJoined)
        slot = self.members()[self.round_no % len(self.live)]
        piece = self.plan.round_pieces(epoch + 1, r, [slot.index])[slot.index]
        cfg = self.config
        spec = ("train", (self.wire.put(self.w), piece, cfg.worker_epochs, cfg.batch_size), {})
        return [self.call(slot, spec, TRAIN)]

    def on_done(self, event):
        delta, stats = event.value
        self.w = apply_delta(self.w, delta)
        self.round_no += 1
        self.turns.append(stats)
        if self.round_no % self.options.pieces:
            return self._turn()
        row = self.new_row(self.round_no, self.round_no / self.options.pieces, self.turns,
                           sum(s["compute_s"] for s in self.turns))
        self.turns = []
        return [EmitRow(row), *self._turn()]

    def on_lost(self, event):
        return self._turn()            # the lost turn is taken again by another trainer

    def on_joined(self, event):
        return [] if len(self.live) > len(event.slots) else self._turn()

    def on_row_done(self, event):
        return [Stop(self.w)] if event.stop else []
