"""What happens to a run, as the driver loop tells a scheme's state machine.

Events are facts, stamped with the driver's clock (``now``, ``time.perf_counter``
seconds): a machine never reads the clock or waits itself, so a test can feed it any
sequence of events, at any times, with no cluster (``tests/apps/test_unit_machines.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

from .slots import Slot

__all__ = ["CallDone", "TrainerLost", "TrainersJoined", "Tick", "RowDone", "Event"]


@dataclasses.dataclass(frozen=True)
class CallDone:
    """Call ``call`` (an id from an order) on ``slot``'s trainer returned ``value``."""

    call: int
    slot: Slot
    value: Any
    now: float


@dataclasses.dataclass(frozen=True)
class TrainerLost:
    """``slot``'s trainer died (its process or node): ``calls`` were in flight on it and
    will never return. The pool has already started its replacement, if it can."""

    slot: Slot
    error: BaseException
    calls: tuple[int, ...]
    now: float


@dataclasses.dataclass(frozen=True)
class TrainersJoined:
    """Trainers that finished starting (replacements, elastic additions) and take work."""

    slots: tuple[Slot, ...]
    now: float


@dataclasses.dataclass(frozen=True)
class Tick:
    """A time the machine asked for (:class:`~.orders.SetTimer`) has come."""

    now: float


@dataclasses.dataclass(frozen=True)
class RowDone:
    """The callbacks took a row the machine emitted (``EmitRow``); ``stop`` is True once
    one of them stopped the run (early stopping, a target accuracy). A machine that must
    know the verdict before it goes on (sync does not apply a round whose evaluated row
    stopped the run) waits for this event."""

    round: int
    stop: bool
    now: float


Event = Union[CallDone, TrainerLost, TrainersJoined, Tick, RowDone]
