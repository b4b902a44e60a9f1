"""Learning rates per round: schedules, the linear scaling rule for K, and its warm-up.

A *schedule* is a Keras ``LearningRateSchedule`` or any function of a step returning a
rate; it is evaluated on the driver, once per round, and the rate is sent to the trainers
(``TrainerActor.set_learning_rate``) or used by the outer step. Keras schedules return
tensors; :func:`evaluate` turns them into floats.

The linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): K trainers
that average after each round make about 1/K of one process's progress per sample, so
the rate of the step that combines them is multiplied by K. Jumping to K times the rate at
once can diverge while the weights are still random, so it is reached by a linear
warm-up from 1x over the first ``warmup_rounds`` rounds.
"""

from __future__ import annotations

import math

import numpy as np

from ..options import ConfigError

__all__ = ["evaluate", "k_multiplier", "InnerRate", "steps_in", "check_trainers_rate",
           "INNER_POWERS"]

# The lr_scaling values that scale the trainers' own rate, and the power of K each takes:
# the linear rule (Goyal et al. 2017) and the square-root rule (Malladi et al. 2022).
INNER_POWERS = {"inner": 1.0, "sqrt": 0.5}


def evaluate(rate, step: int) -> float:
    """``rate`` at ``step``: a number as it is, a schedule (Keras or a function) called.

    Raises ``ValueError`` when a schedule gives something other than a finite number > 0.
    """
    value = rate(step) if callable(rate) else rate
    value = float(np.asarray(value))
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"the learning-rate schedule {rate!r} gave {value!r} at step {step}; "
                         "a rate must be a finite number > 0")
    return value


def k_multiplier(round_index: int, k: int, warmup_rounds: int, power: float = 1.0) -> float:
    """The K rule's factor in round ``round_index`` (0-based) for ``k`` trainers:
    ``k ** power`` (the linear rule at 1, the square-root rule at 0.5) after the warm-up,
    rising linearly from 1 during it."""
    if k <= 1:
        return 1.0
    full = float(k) ** power
    if warmup_rounds <= 0 or round_index >= warmup_rounds:
        return full
    return 1.0 + (full - 1.0) * round_index / warmup_rounds


def steps_in(samples: int, batch_size: int, epochs: int = 1) -> int:
    """Optimizer steps a trainer takes on ``samples`` samples (the last batch may be short)."""
    return -(-int(samples) // int(batch_size)) * int(epochs)


class InnerRate:
    """The trainers' learning rate for each round, or None to leave theirs alone.

    ``schedule``: a schedule of the step (a trainer's optimizer steps so far in the run,
    what a single process's ``optimizer.iterations`` would be) or None for the rate the
    trainers' optimizer was built with (``base``, reported by the trainers).
    ``scale_with_k``: the K rule on the trainers' rate, with its warm-up: the rate times
    ``K ** power`` (1: the linear rule; 0.5: the square-root rule).
    """

    def __init__(self, schedule=None, scale_with_k: bool = False, warmup_rounds: int = 0,
                 base: float | None = None, power: float = 1.0):
        self.schedule = schedule
        self.scale_with_k = scale_with_k
        self.warmup_rounds = warmup_rounds
        self.base = base
        self.power = power

    @property
    def active(self) -> bool:
        return self.schedule is not None or self.scale_with_k

    def at(self, round_index: int, step: int, k: int) -> float | None:
        """The rate for round ``round_index`` starting at ``step`` with ``k`` trainers."""
        if not self.active:
            return None
        if self.schedule is not None:
            rate = evaluate(self.schedule, step)
        elif self.base is None:
            raise ValueError("lr_scaling='inner' or 'sqrt' needs the trainers' learning rate, "
                             "and they report none: give lr_schedule=, or make the trainer "
                             "class's get_learning_rate() return its optimizer's rate")
        else:
            rate = self.base
        if self.scale_with_k:
            rate *= k_multiplier(round_index, k, self.warmup_rounds, self.power)
        return rate


def check_trainers_rate(options, info: dict) -> None:
    """Refuse, by name and before the first round, a setting that sets the trainers' rate
    when they have none the run can set: ``info`` (a trainer's ``describe()``) reports
    ``learning_rate`` None. That is a ``TrainerActor`` subclass without the
    ``get_learning_rate``/``set_learning_rate`` hooks (its model needs no adapter), or a
    model whose optimizer carries its own schedule. Raises :class:`ConfigError`."""
    if info.get("learning_rate") is not None:
        return
    why = ("the trainers report no learning rate the run can set (their get_learning_rate() "
           "returned None: a TrainerActor subclass that does not override get_learning_rate "
           "and set_learning_rate, or an optimizer built with a schedule of its own)")
    if getattr(options, "lr_schedule", None) is not None:
        raise ConfigError("lr_schedule=", f"sets the trainers' rate each round, but {why}: "
                          "leave lr_schedule= out, or give the trainer class those hooks")
    scaling = getattr(options, "lr_scaling", None)
    if scaling in INNER_POWERS:
        factor = "K" if scaling == "inner" else "sqrt(K)"
        raise ConfigError(f"lr_scaling={scaling!r}", f"scales the trainers' rate by {factor}, "
                          f"but {why}: "
                          "use lr_scaling='outer' (the outer step's rate), or give the "
                          "trainer class those hooks")
