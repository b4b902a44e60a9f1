"""The driver's arithmetic on weights and deltas, written once for every scheme."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["apply_delta", "weighted_mean"]


def apply_delta(w: list, delta: list, scale: float = 1.0) -> list:
    """``w − scale · delta``, layer by layer, in each weight's own dtype (a new list).

    A float weight takes the step as before, bit for bit. An integer weight (a counter:
    PyTorch's ``num_batches_tracked``) takes the same step computed in float64 and rounded
    to the nearest integer (half to even): casting ``scale · delta`` straight back would
    truncate toward zero, so ``scale`` 0.5 on a delta of 3 batches would add 1, and any
    scale below 1 on a delta of one batch would add nothing.
    """
    out = []
    for wi, di in zip(w, delta):
        wi = np.asarray(wi)
        if wi.dtype.kind in "iu":
            step = np.rint(float(scale) * np.asarray(di, dtype=np.float64))
            out.append(wi - step.astype(wi.dtype))
        else:
            out.append(wi - (scale * np.asarray(di)).astype(wi.dtype, copy=False))
    return out


def weighted_mean(deltas: Sequence[list], weights: Sequence[float]) -> list:
    """``Σ_j (weights_j / Σ weights) · deltas_j``, layer by layer, in the deltas' dtype.

    The synchronous average weighs each trainer's delta by the samples it trained on:
    with equal shares this is the plain mean, and when a trainer is lost mid-round the
    round's average is taken over the deltas that arrived, each for its own samples.

    Float layers are computed in their own dtype, exactly as before integer layers were
    handled. An integer layer (a counter such as BatchNorm's ``num_batches_tracked``,
    whose delta is minus the batches a trainer ran) is averaged in float64 and rounded to
    the nearest integer (half to even), so it stays an integer array of its own dtype and
    is not truncated to 0 by an integer fraction. The averaged count is then the batches
    one trainer ran this round (weighted as the samples are), which is what the averaged
    running statistics beside it stand for: each is one trainer's moving average over
    that many batches, and their mean covers as many, not K times as many.

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
        if first.dtype.kind in "iu":
            exact = sum(np.asarray(d[i], dtype=np.float64) * f for d, f in zip(deltas, fractions))
            out.append(np.rint(exact).astype(first.dtype))
            continue
        acc = first * first.dtype.type(fractions[0])
        for d, f in zip(deltas[1:], fractions[1:]):
            acc += np.asarray(d[i]) * first.dtype.type(f)
        out.append(acc)
    return out
