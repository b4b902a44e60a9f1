"""One configuration for a training run, shared by the keyword API, ``App`` and the CLI."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["TrainConfig"]


@dataclasses.dataclass
class TrainConfig:
    """What a run needs besides the model and the dataset.

    ``workers`` trainers take ``num_cpus`` CPUs each. A master epoch is one pass of the
    training set split over the trainers; ``worker_epochs`` is how many local epochs a
    trainer runs on its share before reporting a delta (the paper's N).
    ``rounds_per_epoch`` splits each share into that many rounds, averaging after each
    (local SGD: more rounds, more communication, usually better accuracy per epoch).
    """

    workers: int = 2
    master_epochs: int = 1
    worker_epochs: int = 1
    batch_size: int = 32
    rounds_per_epoch: int = 1
    num_cpus: float = 1
    # Early stop: at this test accuracy, or after this many evaluations without a new
    # best test loss.
    target_accuracy: float | None = None
    patience: int | None = None
    # Asynchronous scheme only.
    staleness_bound: int | None = None
    staleness_scaling: bool = False
    seed: int | None = 0
    progress: bool = True
    trainer_cls: Any = None
    trainer_options: dict = dataclasses.field(default_factory=dict)
    # The K trainers are placed as one placement group (one bundle each) so that a run
    # never starts half-placed; it fails if the group is not reserved within the timeout.
    placement_strategy: str = "SPREAD"
    placement_timeout_s: float = 60.0
    callbacks: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        for name in ("workers", "master_epochs", "worker_epochs", "batch_size", "rounds_per_epoch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not isinstance(self.num_cpus, (int, float)) or self.num_cpus < 0:
            raise ValueError(f"num_cpus must be a number >= 0, got {self.num_cpus!r}")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"placement_strategy must be 'PACK', 'SPREAD', 'STRICT_PACK' or "
                             f"'STRICT_SPREAD', got {self.placement_strategy!r}")
        if isinstance(self.placement_timeout_s, bool) or not isinstance(
                self.placement_timeout_s, (int, float)) or self.placement_timeout_s < 0:
            raise ValueError(f"placement_timeout_s must be a number >= 0, got "
                             f"{self.placement_timeout_s!r}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy must be in (0, 1], got {self.target_accuracy!r}")
        if self.patience is not None and (not isinstance(self.patience, int) or self.patience < 1):
            raise ValueError(f"patience must be an int >= 1, got {self.patience!r}")
        if self.staleness_bound is not None and (
                not isinstance(self.staleness_bound, int) or self.staleness_bound < 0):
            raise ValueError(f"staleness_bound must be an int >= 0 or None, got "
                             f"{self.staleness_bound!r}")
