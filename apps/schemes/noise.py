"""The gradient noise scale: how large a batch still buys progress per step.

McCandlish et al. ("An Empirical Model of Large-Batch Training", 2018) call
``B_simple = tr(Σ) / |G|²`` the simple noise scale: with batches well below it, a step's
gradient is mostly noise and a bigger batch gives a proportionally better step; well
above it, a bigger batch buys almost nothing. K trainers that average their models every
round learn, per sample, about as one process with K times the batch does, so whether
they should each take the user's batch or split it between them depends on K times the
batch against this number (``auto.py``'s batch rule).

:func:`estimate` is their unbiased estimator from two batch sizes (appendix A): the
gradients of ``n`` disjoint batches of ``b`` samples, whose mean is the gradient of one
batch of ``n·b``. :func:`combine` pools the estimates of several trainers (each unbiased,
so their mean is too). ``benchmarks/training/noise_scale.py`` measures it as a model
trains.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

__all__ = ["estimate", "combine"]


def estimate(grads: Iterable, b: int) -> dict:
    """``{"G2", "trace", "b_simple", "n"}`` from ``grads`` (an iterable, each a list of
    arrays) of ``n`` disjoint batches of ``b`` samples. ``b_simple`` is None where the
    estimate of ``|G|²`` is not positive (the noise swamps the mean: more batches are
    needed, and the batch is far below the noise scale)."""
    # A running sum and sum of squared norms: one gradient's size in memory, not n of them
    # (wide_cnn's 32 gradients would be 1.3 GB in float64).
    n, total, sq = 0, np.zeros(0), 0.0
    for g in grads:
        v = np.concatenate([np.ravel(a).astype(np.float64) for a in g])
        total = v if n == 0 else total + v
        sq += float(v @ v)
        n += 1
    if n < 2:
        raise ValueError("the noise scale needs at least 2 batches' gradients")
    small_sq = sq / n
    mean = total / n
    big_sq = float(mean @ mean)
    big = n * b
    g2 = (big * big_sq - b * small_sq) / (big - b)
    trace = (small_sq - big_sq) / (1.0 / b - 1.0 / big)
    return {"G2": g2, "trace": trace, "b_simple": trace / g2 if g2 > 0 else None, "n": n}


def combine(estimates: list) -> dict:
    """One estimate from several (:func:`estimate`'s, each of its own batches): the mean
    of their ``|G|²`` and of their ``tr(Σ)``, and the ratio of those means."""
    if not estimates:
        raise ValueError("no estimates to combine")
    g2 = float(np.mean([e["G2"] for e in estimates]))
    trace = float(np.mean([e["trace"] for e in estimates]))
    return {"G2": g2, "trace": trace, "b_simple": trace / g2 if g2 > 0 else None,
            "n": int(sum(e["n"] for e in estimates))}
