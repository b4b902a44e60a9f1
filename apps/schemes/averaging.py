"""The driver's arithmetic on weights and deltas, written once for every scheme.

**Buffers are values, never gradients.** A model's arrays are of two kinds, and the
adapter says which is which (``FrameworkAdapter.buffer_mask``, reported by every
trainer's ``describe()`` as ``"buffers"``): *weights* that the optimizer steps (kernels,
biases, BatchNorm's scale and shift) and *buffers* that the model sets itself while it
trains (BatchNorm's running mean and variance, and PyTorch's ``num_batches_tracked``;
Keras' non-trainable weights). A delta of a weight is a step, and a scheme may scale
it, give it momentum or apply it late. A delta of a buffer is not: a running variance
moved by a stale or momentum-amplified "step" goes negative (it did, under ``async``:
every ``running_var`` of a BatchNorm model between −0.23 and −0.11 after two epochs).
So a buffer only ever becomes a convex combination of values the trainers reached:

- ``sync`` and ``allreduce`` set it to the round's weighted mean of the trainers' values
  (the mean delta applied at rate 1, with no outer momentum: :func:`apply_delta` with
  ``buffers=``, and ``outer.apply_outer``);
- ``async`` and ``downpour`` move it toward the value the trainer reached,
  ``w_b ← w_b + (x_b − w_b)/K`` (:class:`ValueBuffers`: the driver keeps the buffer values
  each call started from, so ``x_b = start − delta``);
- ``easgd``'s exchange (:func:`elastic_exchange`) is a convex combination already.

Integer arrays (counters such as ``num_batches_tracked``) stay integers everywhere:
their arithmetic is done in float64 and rounded to the nearest integer (half to even).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["apply_delta", "weighted_mean", "buffer_mask", "ValueBuffers", "move_toward",
           "elastic_exchange", "ring_layers", "like_layers"]


def _is_int(a: np.ndarray) -> bool:
    return a.dtype.kind in "iu"


def _scaled(scale: float, d, like: np.ndarray) -> np.ndarray:
    """``scale · d`` as a step for a layer of ``like``'s dtype (rounded for integers)."""
    if _is_int(like):
        return np.rint(float(scale) * np.asarray(d, dtype=np.float64)).astype(like.dtype)
    return (scale * np.asarray(d)).astype(like.dtype, copy=False)


def apply_delta(w: list, delta: list, scale: float = 1.0,
                buffers: Sequence[bool] | None = None) -> list:
    """``w − scale · delta``, layer by layer, in each weight's own dtype (a new list).

    A float weight takes the step as before, bit for bit. An integer weight (a counter:
    PyTorch's ``num_batches_tracked``) takes the same step computed in float64 and rounded
    to the nearest integer (half to even): casting ``scale · delta`` straight back would
    truncate toward zero, so ``scale`` 0.5 on a delta of 3 batches would add 1, and any
    scale below 1 on a delta of one batch would add nothing.

    ``buffers``: a mask in ``w``'s order; a layer marked True is a buffer and takes
    ``delta`` at scale 1 whatever ``scale`` is (a mean of the trainers' values, never a
    scaled step).
    """
    out = []
    for i, (wi, di) in enumerate(zip(w, delta)):
        wi = np.asarray(wi)
        s = 1.0 if buffers and buffers[i] else scale
        step = _scaled(s, di, wi)   # always a new array (or a scalar): written into
        if isinstance(step, np.ndarray) and step.dtype == wi.dtype and step.shape == wi.shape:
            out.append(np.subtract(wi, step, out=step))
        else:
            out.append(wi - step)
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
        if _is_int(first):
            exact = sum(np.asarray(d[i], dtype=np.float64) * f for d, f in zip(deltas, fractions))
            out.append(np.rint(exact).astype(first.dtype))
            continue
        acc = first * first.dtype.type(fractions[0])
        for d, f in zip(deltas[1:], fractions[1:]):
            acc += np.asarray(d[i]) * first.dtype.type(f)
        out.append(acc)
    return out


def buffer_mask(info: dict | None, n: int | None = None) -> list[bool]:
    """Which arrays of the weights are buffers, from a trainer's ``describe()``
    (``info["buffers"]``; none where a trainer does not say, as the tests' numpy model
    and a ``TrainerActor`` subclass without an adapter do). ``n``: the number of arrays,
    checked when given."""
    mask = [bool(b) for b in ((info or {}).get("buffers") or ())]
    if n is not None and mask and len(mask) != n:
        raise ValueError(f"the trainer's buffer mask has {len(mask)} entries for {n} arrays")
    return mask


def move_toward(w: np.ndarray, reached: np.ndarray, scale: float) -> np.ndarray:
    """``w + scale · (reached − w)``: a convex combination for ``0 ≤ scale ≤ 1`` (so a
    running variance stays ≥ 0), in ``w``'s dtype; an integer array rounds the step."""
    w = np.asarray(w)
    gap = np.asarray(reached, dtype=np.float64 if _is_int(w) else w.dtype) - w
    return w + _scaled(scale, gap, w)


class ValueBuffers:
    """What an asynchronous scheme does with buffers (``async``, ``downpour``).

    Each update arrives as a delta relative to the weights its call started from, which
    are out of date by then. A weight takes the delta as a step; a buffer moves toward
    the value the trainer reached, ``x_b = start_b − delta_b``: ``w_b ← w_b + s (x_b −
    w_b)`` with ``s = 1/K`` (times the staleness factor where the scheme scales by it).
    :meth:`started` records a call's starting buffer values (the buffers only: small),
    :meth:`apply` applies an update and remembers the value reached as the next start of
    that key (a trainer that goes on without fetching starts from its own values)."""

    def __init__(self, info: dict | None):
        self.mask = buffer_mask(info)
        self.index = [i for i, b in enumerate(self.mask) if b]
        self.starts: dict[Any, list] = {}

    def started(self, key, w: list) -> None:
        """A call of ``key`` (a trainer's slot) starts from weights ``w``."""
        if self.index:
            self.starts[key] = [w[i] for i in self.index]

    def apply(self, w: list, delta: list, scale: float, key,
              buffer_scale: float | None = None) -> list:
        """New weights: ``w − scale · delta`` for the weights, and each buffer moved
        ``buffer_scale`` (default ``scale``) of the way to the value ``key``'s trainer
        reached. Without a recorded start for ``key`` (no buffers) it is
        :func:`apply_delta`."""
        start = self.starts.get(key)
        if not self.index or start is None:
            return apply_delta(w, delta, scale)
        bs = scale if buffer_scale is None else buffer_scale
        out = apply_delta(w, delta, scale)
        reached = []
        for i, s in zip(self.index, start):
            x = np.asarray(s) - _scaled(1.0, delta[i], np.asarray(s))
            reached.append(x)
            out[i] = move_toward(w[i], x, bs)
        self.starts[key] = reached
        return out


def elastic_exchange(center: list, local: list, alpha: float) -> tuple[list, list]:
    """EASGD's exchange: ``(new center, new local)`` with ``e = alpha (x − c)``,
    ``c ← c + e``, ``x ← x − e``. For a buffer both are convex combinations of the two
    values already; an integer array takes the rounded ``e`` (``alpha`` cast to an
    integer dtype would be 0, and a counter would never move)."""
    new_center, new_local = [], []
    for c, x in zip(center, local):
        c, x = np.asarray(c), np.asarray(x)
        if _is_int(c):
            e = np.rint((x.astype(np.float64) - c) * float(alpha)).astype(c.dtype)
        else:
            e = (x - c) * np.asarray(alpha, dtype=c.dtype)
        new_center.append(c + e)
        new_local.append(x - e)
    return new_center, new_local


def ring_layers(delta: list) -> list:
    """A delta as a ring allreduce sums it: integer layers as float64 (a ring scales each
    layer by its trainer's share of the samples in the layer's own dtype, and an integer
    share is 0). :func:`like_layers` turns the sum back."""
    return [np.asarray(d, dtype=np.float64) if _is_int(np.asarray(d)) else d for d in delta]


def like_layers(mean: list, like: list) -> list:
    """``mean`` (from :func:`ring_layers`' sum) with each layer back in ``like``'s dtype,
    integer layers rounded to the nearest integer (half to even), as
    :func:`weighted_mean` rounds them."""
    out = []
    for m, ref in zip(mean, like):
        ref = np.asarray(ref)
        out.append(np.rint(m).astype(ref.dtype) if _is_int(ref) else m)
    return out
