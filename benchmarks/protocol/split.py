"""Which images a run trains on and which it is evaluated on: the validation split.

Selection (``stage="select"``) trains on the first 50,000 of Fashion-MNIST's 60,000
training images and evaluates on the last 10,000 (validation); the test set is not
read. The final run (``stage="final"``) trains on all 60,000 and evaluates on the test
set. ``limit`` (smoke runs) keeps the first ``limit`` images of the stage's training
part, ``eval_limit`` the first ``eval_limit`` of its evaluation part.

:class:`SplitDataset` is the dataset every column loads: a picklable callable returning
``((x, y), (x_eval, y_eval))``, which DDLF's trainers take as a dataset (``train_sync``
ships it once and caches its arrays per node) and which the other columns call.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

__all__ = ["STAGES", "HOLDOUT", "Split", "split_indices", "SplitDataset"]

STAGES = ("select", "final")
# The last HOLDOUT training images are the validation set during selection.
HOLDOUT = 10_000


@dataclasses.dataclass(frozen=True)
class Split:
    """Row indices of one stage: ``train`` into the training arrays, ``evaluate`` into
    the training arrays (``eval_from == "train"``: validation) or the test arrays."""

    train: np.ndarray
    evaluate: np.ndarray
    eval_from: str   # "train" (validation, selection) or "test" (the final run)

    @property
    def eval_name(self) -> str:
        return "validation" if self.eval_from == "train" else "test"


def split_indices(stage: str, n_train: int, n_test: int, *, holdout: int = HOLDOUT,
                  limit: int | None = None, eval_limit: int | None = None) -> Split:
    """The indices ``stage`` trains and evaluates on (see the module docstring).

    Raises ``ValueError`` for an unknown stage, a holdout that leaves nothing to train
    on, or a limit below 1.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    for name, v in (("limit", limit), ("eval_limit", eval_limit)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be at least 1, got {v!r}")
    if stage == "select":
        if not 0 < holdout < n_train:
            raise ValueError(f"holdout {holdout} must be in (0, {n_train}): the training set "
                             f"has {n_train} images")
        train = np.arange(n_train - holdout)
        evaluate = np.arange(n_train - holdout, n_train)
        eval_from = "train"
    else:
        train = np.arange(n_train)
        evaluate = np.arange(n_test)
        eval_from = "test"
    if limit is not None:
        train = train[:limit]
    if eval_limit is not None:
        evaluate = evaluate[:eval_limit]
    return Split(train, evaluate, eval_from)


@dataclasses.dataclass(frozen=True)
class SplitDataset:
    """``((x, y), (x_eval, y_eval))`` of ``dataset`` for one stage (a dataset callable).

    ``loader`` returns ``((x, y), (x_test, y_test))``; None means
    ``ddlf_actors.apps.datasets.load(dataset)``. Arrays come back as contiguous copies,
    so a caller may cache or memory-map them.
    """

    stage: str
    dataset: str = "fashion-mnist"
    limit: int | None = None
    eval_limit: int | None = None
    holdout: int = HOLDOUT
    loader: Callable | None = None

    def __call__(self):
        if self.loader is not None:
            (x, y), (x_test, y_test) = self.loader()
        else:
            from ddlf_actors.apps import datasets

            (x, y), (x_test, y_test) = datasets.load(self.dataset)
        s = split_indices(self.stage, len(x), len(x_test), holdout=self.holdout,
                          limit=self.limit, eval_limit=self.eval_limit)
        ex, ey = (x, y) if s.eval_from == "train" else (x_test, y_test)
        return ((np.ascontiguousarray(x[s.train]), np.ascontiguousarray(y[s.train])),
                (np.ascontiguousarray(ex[s.evaluate]), np.ascontiguousarray(ey[s.evaluate])))
