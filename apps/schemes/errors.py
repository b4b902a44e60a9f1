"""Why a training run fails when it is no bug of the user's code: too few trainers."""

from __future__ import annotations

from ddlf_actors.errors import DDLFError

__all__ = ["TooFewTrainersError", "TrainerStartError"]


class TooFewTrainersError(DDLFError):
    """Fewer than ``min_workers`` trainers were left and none came back in time."""

    #: The driver adds where the last checkpoint is and how to resume from it.
    resume_hint = True


class TrainerStartError(DDLFError):
    """A trainer could not build its model or load its dataset."""
