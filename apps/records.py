"""The typed records a training run produces: trainer stats, history rows and events.

They stay plain dicts on the wire and in ``result.history`` / ``result.events`` (so they
go to JSON, CSV and checkpoints as they are); the TypedDicts say which keys each holds.
"""

from __future__ import annotations

import enum
from typing import Any, List, TypedDict

__all__ = ["TrainStats", "HistoryRow", "RunEvent", "EventKind", "UpdateRecord"]


class TrainStats(TypedDict, total=False):
    """What ``TrainerActor.train`` returns next to its delta."""

    compute_s: float        # the call's own time on the trainer
    idle_s: float           # since this trainer's previous call ended
    eval_s: float           # evaluation shards run since the previous train call
    samples: int
    loss: float             # mean training loss of the last local epoch
    index: int              # the trainer's slot
    optimizer_state: List[Any] | None   # only when the driver asked for it
    codec_s: float          # decoding the weights and encoding the delta (compression=)
    wire_residual: List[Any] | None     # the error-feedback residual, when asked for


class HistoryRow(TypedDict, total=False):
    """One row of ``result.history``: a round for sync, an epoch for async."""

    round: int
    epoch: float
    time_s: float           # since training began (continued across a resume)
    test_accuracy: float | None
    test_loss: float | None
    train_loss: float | None
    bytes_sent: int
    bytes_received: int
    compute_s: float
    idle_s: float
    eval_s: float
    overhead_s: float
    wall_s: float
    samples: int
    samples_per_s: float | None
    updates: int
    workers: int            # trainers whose deltas went into this row
    # allreduce only: the collective's time, and the bytes the trainers sent each other
    collective_s: float
    ring_bytes: int
    # Sync only: late deltas folded into this row (backup_workers), and the samples each
    # slot was handed this round, indexed by slot (0: none; balance=True sizes them).
    late: int
    trainer_samples: List[int]
    # Sync and allreduce: the trainers' learning rate this round (lr_schedule, or the
    # K-scaling rule on them) and the outer optimizer's rate (outer_lr), when set.
    learning_rate: float
    outer_lr: float
    # Sync and allreduce: every trainer's compute in the row's calls, summed (not cut to
    # the row's window): over a run, divided by K times the wall time, the utilization.
    compute_total_s: float


class EventKind(str, enum.Enum):
    """What ``result.events`` records."""

    TRAINER_LOST = "trainer_lost"                  # its process or node died mid-run
    TRAINER_JOINED = "trainer_joined"              # a replacement or an elastic addition
    TRAINER_START_FAILED = "trainer_start_failed"  # its __init__ raised, or it died starting
                                                   # every try: its slot is given up
    TRAINER_DIED_STARTING = "trainer_died_starting"  # its process died in __init__: retried
    WAITING = "waiting_for_trainers"               # fewer than min_workers are left
    RESUMED = "resumed"                            # the run continued from a checkpoint
    CHECKPOINT = "checkpoint"                      # a checkpoint was written
    SETTINGS = "settings"                          # what scheme="auto" chose, and why


class RunEvent(TypedDict):
    """One entry of ``result.events``."""

    time_s: float
    round: int
    kind: str               # an EventKind value
    trainer: int | None  # the slot, or None for run-wide events
    node: str | None
    detail: str


class _UpdateKeys(TypedDict):
    trainer: int
    start_version: int
    applied_version: int
    staleness: int
    lead: int
    loss: float


class UpdateRecord(_UpdateKeys, total=False):
    """An asynchronous run's record of one applied update (``result.updates``).

    (``typing.NotRequired`` would say this in one class, from Python 3.11 only.)"""

    # Sync with backup_workers: the delta's samples and its weight in the round's mean
    # (samples / (1 + staleness)).
    samples: int
    weight: float
