"""A run's evaluations, and what is read from them: the first crossing of the target and
whether the run diverged.

An evaluation point is ``{"epoch": e, "train_s": t, "accuracy": a, "loss": l}``: the
model after ``e`` epochs (a fraction between epoch ends), ``t`` seconds of training
(evaluation and start-up excluded) to get there. Points are in training order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

__all__ = ["Crossing", "first_crossing", "divergence", "ddlf_points", "evals_per_epoch"]


@dataclasses.dataclass(frozen=True)
class Crossing:
    """The first evaluation at or above the target: the epoch (fraction), the training
    seconds to it and its accuracy. No interpolation between evaluations: a run is
    charged up to the evaluation that showed it, which is why evaluations are frequent."""

    epoch: float
    train_s: float
    accuracy: float


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def first_crossing(points: Sequence[dict], target: float) -> Crossing | None:
    """The first point whose accuracy is at least ``target``, or None if none is (a
    missing or NaN accuracy never crosses)."""
    for p in points:
        acc = p.get("accuracy")
        if _finite(acc) and acc >= target:
            return Crossing(float(p["epoch"]), float(p["train_s"]), float(acc))
    return None


def divergence(points: Sequence[dict], train_losses: Iterable = (), *, num_classes: int = 10,
               chance_factor: float = 1.5) -> str | None:
    """Why a run counts as diverged, or None: a NaN or infinite loss (training or
    evaluation), or a last evaluation no better than ``chance_factor`` times chance
    (accuracy stuck at 1/num_classes)."""
    for p in points:
        for key in ("loss", "accuracy"):
            v = p.get(key)
            if v is not None and not _finite(v):
                return f"{key} {v} at epoch {p['epoch']:g}"
    for i, v in enumerate(train_losses):
        if v is not None and not _finite(v):
            return f"training loss {v} (record {i})"
    if points:
        last = points[-1].get("accuracy")
        if _finite(last) and last <= chance_factor / num_classes:
            return f"accuracy {last:.3f} at chance after epoch {points[-1]['epoch']:g}"
    return None


def ddlf_points(history: Sequence[dict], startup_s: float) -> tuple[list, float, float]:
    """``(points, train_s, eval_s)`` from a DDLF ``TrainResult.history``.

    A row's ``time_s`` runs from the call's start, the trainers' start-up
    (``TrainResult.startup_s``) included: it is taken out. A row's ``eval_s`` is the time
    its round's trainers spent evaluating an earlier row's weights (queued before their
    train call, the slower trainer's): it is taken out of every later point's training
    time, as the other columns take their evaluation pauses out.
    """
    points, done_eval = [], 0.0
    for row in history:
        done_eval += float(row.get("eval_s") or 0.0)
        if row.get("test_accuracy") is None:   # a round between evaluations
            continue
        points.append({"epoch": float(row["epoch"]),
                       "train_s": float(row["time_s"]) - startup_s - done_eval,
                       "accuracy": float(row["test_accuracy"]),
                       "loss": None if row.get("test_loss") is None else float(row["test_loss"])})
    train_s = (float(history[-1]["time_s"]) - startup_s - done_eval) if history else 0.0
    return points, train_s, done_eval


def evals_per_epoch(points: Sequence[dict]) -> float:
    """Evaluations per epoch of training, from the points (0 without any)."""
    if not points:
        return 0.0
    last = float(points[-1]["epoch"])
    return len(points) / last if last > 0 else float(len(points))
