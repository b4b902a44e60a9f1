"""A run's trainer positions: a :class:`Slot` is one trainer's place in a run, kept across
the trainers that fill it (a lost one's replacement takes its slot, its partition and its
optimizer state)."""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any

from ddlf_actors.errors import ActorDiedError

__all__ = ["Slot", "SlotState", "LOSS_ERRORS"]

# What a trainer's call raises when the trainer itself is gone (not when its code raised).
# Every backend raises DDLF's ActorDiedError for it (Ray's errors are turned into it).
LOSS_ERRORS = (ActorDiedError,)


class SlotState(enum.Enum):
    STARTING = "starting"
    LIVE = "live"
    LOST = "lost"
    FAILED = "failed"


@dataclasses.dataclass(eq=False)
class Slot:
    """One trainer position of a run."""

    index: int
    handle: Any = None
    state: SlotState = SlotState.STARTING
    info: dict | None = None          # the trainer's describe(): sizes, pid, node
    ready_ref: Any = None                # describe() while STARTING
    group: Any = None                    # the placement group its bundle is in
    bundle: int = 0
    owned: bool = True                   # False for trainers the caller passed in
    starts: int = 0                      # trainers this slot has had
    start_failures: int = 0              # in a row, not counting __init__ errors
    # time.monotonic() when its trainer was created (or handed to the run, for one the
    # caller passed in): start_timeout_s counts from here.
    started_at: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def node(self) -> str | None:
        return (self.info or {}).get("node")

    @property
    def about(self) -> dict:
        """The trainer's ``describe()``, which every live slot has (``RuntimeError`` for a
        slot whose trainer has not finished starting: a bug in the caller)."""
        if self.info is None:
            raise RuntimeError(f"slot {self.index} ({self.state.value}) has no trainer "
                               "description yet: only a live slot has one")
        return self.info
