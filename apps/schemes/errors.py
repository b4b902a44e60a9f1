"""Why a training run fails when it is no bug of the user's code: too few trainers."""

from __future__ import annotations

from ddlf_actors.errors import DDLFError

__all__ = ["TooFewTrainersError", "TrainerStartError"]


class TooFewTrainersError(DDLFError):
    """Fewer than ``min_workers`` trainers were left and none came back in time."""

    #: The driver adds where the last checkpoint is and how to resume from it.
    resume_hint = True


class TrainerStartError(DDLFError):
    """A trainer of the run could not start, in one of two ways (``died`` says which):

    - its ``__init__`` raised (``model_fn`` or loading the dataset): an error in that
      code, never retried; ``cause`` is the remote error, whose text holds the remote
      traceback (``died`` False, ``tries`` 1);
    - its process died while starting (SIGKILL, the OOM killer, a lost node), or did
      not report ready within ``start_timeout_s`` and was killed, ``tries`` times in a
      row, and the run could not reach ``min_workers`` without it (``died`` True).

    ``slot`` is the trainer's slot (its index in the run)."""

    def __init__(self, message: str = "", slot: int | None = None, tries: int = 1,
                 died: bool = False, cause: BaseException | None = None):
        super().__init__(message)
        self.slot = slot
        self.tries = tries
        self.died = died
        self.cause = cause

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.slot, self.tries,
                             self.died, self.cause))
