"""The driver's arithmetic on weights and deltas, written once for every scheme."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["apply_delta", "weighted_mean"]


def apply_delta(w: list, delta: list, scale: float = 1.0) -> list:
    """``w − scale · delta``, layer by layer, in each weight's own dtype (a new list)."""
    return [wi - (scale * np.asarray(di)).astype(wi.dtype, copy=False)
            for wi, di in zip(w, delta)]


def weighted_mean(deltas: Sequence[list], weights: Sequence[float]) -> list:
    """``Σ_j (weights_j / Σ weights) · deltas_j``, layer by layer, in the deltas' dtype.

    The synchronous average weighs each trainer's delta by the samples it trained on:
    with equal shares this is the plain mean, and when a trainer is lost mid-round the
    round's average is taken over the deltas that arrived, each for its own samples.
    Raises ``ValueError`` for no deltas or weights that do not sum to a positive number.
    """
    if not deltas:
        raise ValueError("weighted_mean needs at least one delta")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"weights must sum to a positive number, got {list(weights)}")
    fractions = [float(wt) / total for wt in weights]
    out = []
    for i in range(len(deltas[0])):
        first = np.asarray(deltas[0][i])
        acc = first * first.dtype.type(fractions[0])
        for d, f in zip(deltas[1:], fractions[1:]):
            acc += np.asarray(d[i]) * first.dtype.type(f)
        out.append(acc)
    return out
