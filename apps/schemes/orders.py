"""What a scheme's state machine asks the driver loop to do.

A machine's ``handle(event)`` returns a list of orders, executed in that order: two calls
to one trainer run on it in the order they were issued (an evaluation shard queued before
a train call runs first, on the weights it names). Orders never block the machine: their
results come back as events.
"""

from __future__ import annotations

import dataclasses
from typing import Union

from ..records import HistoryRow
from .slots import Slot

__all__ = ["Call", "EmitRow", "Checkpoint", "SetTimer", "NeedTrainers", "Lose", "Stop",
           "Order", "TRAIN", "EVALUATE", "CONTROL"]

# What a call is for: its result feeds the weights, a row's test accuracy, or neither.
TRAIN = "train"
EVALUATE = "evaluate"
CONTROL = "control"


@dataclasses.dataclass(frozen=True)
class Call:
    """Call ``method(*args, **kwargs)`` on ``slot``'s trainer.

    ``id`` names the call in the :class:`~.events.CallDone` that brings its result (the
    machine makes ids with :meth:`~.machine.Machine.call`). ``wait=False`` is a call
    whose result nobody needs (setting state on a trainer): no event comes back, and a
    trainer lost meanwhile is noticed by its next waited call. ``kind`` is ``TRAIN``,
    ``EVALUATE`` or ``CONTROL``: what the call is for, so tests and logs can tell.
    """

    id: int
    slot: Slot
    method: str
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    kind: str = CONTROL
    wait: bool = True


@dataclasses.dataclass(frozen=True)
class EmitRow:
    """A history row is complete: hand it to the callbacks (history, progress, early
    stopping, TensorBoard, the dashboard)."""

    row: HistoryRow


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Write a checkpoint of the run as it was when the order was made, at ``round``: the
    ``weights``, named array lists (``arrays``), the machine's ``position`` and the wire's
    (JSON), and each slot's optimizer state. The driver adds history, events and settings
    and writes it in the background. (Made with :meth:`~.machine.Machine.checkpoint`,
    which takes every part at once: orders after it may change the state.)"""

    round: int
    weights: list
    arrays: dict
    position: dict
    wire: dict
    optimizer_states: dict


@dataclasses.dataclass(frozen=True)
class SetTimer:
    """Send a :class:`~.events.Tick` at ``at`` (the driver's clock) unless another event
    comes first; a later ``SetTimer`` replaces it."""

    at: float


@dataclasses.dataclass(frozen=True)
class NeedTrainers:
    """Fewer than ``count`` trainers are live: wait up to the run's ``rejoin_timeout_s``
    for replacements (they come as ``TrainersJoined``), then fail the run with
    ``TooFewTrainersError`` (its message ``why``, when the machine knows better)."""

    count: int
    why: str | None = None


@dataclasses.dataclass(frozen=True)
class Lose:
    """``slot``'s trainer is gone though no call of the driver's failed yet (a trainer
    told the machine its peer died): treat it as lost, as a failed call would be. A
    :class:`~.events.TrainerLost` comes back."""

    slot: Slot
    error: BaseException


@dataclasses.dataclass(frozen=True)
class Stop:
    """Training is over: ``weights`` are the result's."""

    weights: list


Order = Union[Call, EmitRow, Checkpoint, SetTimer, NeedTrainers, Lose, Stop]
