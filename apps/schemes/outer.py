"""The driver's outer optimizer: the averaged delta treated as a gradient.

Plain averaging is ``w ← w − mean_delta``. SlowMo (Wang et al. 2020) and DiLoCo
(Douillard et al. 2023) instead treat ``g = mean_delta`` as the gradient of one outer step
and apply momentum to it, which lets rounds that each move a little add up:

    v ← μ v + g
    w ← w − η (g + μ v)     with Nesterov momentum
    w ← w − η v             with heavy-ball momentum

``η`` is ``lr`` (a number or a schedule of the round), times K with the linear scaling
rule (ramped up over ``warmup_rounds``, see ``rates.py``). With η = 1 and μ = 0 the step
is exactly plain averaging, bit for bit. ``state()`` is the velocity, which checkpoints
keep so that a resumed run ends with the same weights as one never stopped.

Used by ``sync`` and usable by any scheme that averages deltas (``allreduce``).

**Buffers** (``buffers=``, a mask from the adapter: BatchNorm's running statistics and
counters) are values, not gradients: the outer step skips them. A buffer takes the
round's mean delta at rate 1 with no momentum (so it becomes the weighted mean of the
trainers' values), and its entry of the velocity stays zero. See ``averaging.py``.
"""

from __future__ import annotations

import numpy as np

from .averaging import apply_delta
from .rates import evaluate, k_multiplier

__all__ = ["OuterOptimizer", "momentum_update", "apply_outer"]


def momentum_update(velocity: list | None, mean_delta: list, momentum: float,
                    nesterov: bool, buffers=None) -> tuple[list, list]:
    """One momentum step on ``mean_delta``: ``(new velocity, update)``; ``velocity`` None
    is zeros. The update is applied as ``w − η·update``. Written once, so the driver
    (sync) and the trainers (allreduce, where each holds a copy of the velocity) compute
    it bit for bit alike. A layer that ``buffers`` marks keeps its velocity (zeros) and
    its update is the mean delta itself."""
    if velocity is None:
        velocity = [np.zeros_like(np.asarray(g)) for g in mean_delta]
    new_velocity, update = [], []
    for i, (v, g) in enumerate(zip(velocity, mean_delta)):
        g = np.asarray(g)
        if buffers and buffers[i]:
            new_velocity.append(v)
            update.append(g)
            continue
        mu = g.dtype.type(momentum)
        v = np.asarray(v)
        # Into two new arrays instead of four where the dtypes and shapes allow: on half a
        # CPU, a round's work on the whole model is a tenth of a 5 M-parameter model's
        # round (benchmarks/training/round_cost.py). The same operations in the same
        # order either way (addition commutes bit for bit).
        own = g.dtype.kind == "f" and g.ndim and v.dtype == g.dtype and v.shape == g.shape
        v = np.multiply(v, mu)
        v = np.add(v, g, out=v if own else None)
        new_velocity.append(v)
        if nesterov:
            u = np.multiply(v, mu)
            update.append(np.add(u, g, out=u if own else None))
        else:
            update.append(v)
    return new_velocity, update


def apply_outer(w: list, mean_delta: list, velocity: list | None, settings: dict | None,
                buffers=None) -> tuple[list, list | None]:
    """``(new weights, new velocity)`` after one outer step on ``mean_delta`` with
    :meth:`OuterOptimizer.remote_settings`' ``settings`` (None: plain averaging, the
    velocity unchanged); buffers take the mean at rate 1 with no momentum. What an
    allreduce trainer applies to its own copy of the weights and velocity."""
    if settings is None:
        return apply_delta(w, mean_delta), velocity
    update = mean_delta
    if settings["momentum"]:
        velocity, update = momentum_update(velocity, mean_delta, settings["momentum"],
                                           settings["nesterov"], buffers)
    return apply_delta(w, update, settings["rate"], buffers), velocity


class OuterOptimizer:
    """``step(w, mean_delta)`` → new weights; ``state()``/``load_state()`` for checkpoints."""

    def __init__(self, lr=1.0, momentum: float = 0.0, nesterov: bool = False,
                 scale_with_k: bool = False, warmup_rounds: int = 0):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum!r}")
        if nesterov and momentum == 0.0:
            raise ValueError("nesterov=True needs an outer momentum > 0 (outer_momentum=)")
        self.lr = lr
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.scale_with_k = bool(scale_with_k)
        self.warmup_rounds = int(warmup_rounds)
        self.velocity: list | None = None
        self.steps = 0            # outer steps taken: the round index a schedule sees
        self.last_rate = 1.0      # η of the last step (history rows report it)

    @property
    def plain(self) -> bool:
        """True when the step is plain averaging (so it is computed exactly as before)."""
        return (not callable(self.lr) and self.lr == 1.0 and self.momentum == 0.0
                and not self.scale_with_k)

    def rate(self, k: int) -> float:
        """η for the next step, with ``k`` deltas averaged in it."""
        rate = evaluate(self.lr, self.steps)
        if self.scale_with_k:
            rate *= k_multiplier(self.steps, k, self.warmup_rounds)
        return rate

    def step(self, w: list, mean_delta: list, k: int = 1, buffers=None) -> list:
        """New weights from ``w`` and the round's averaged delta over ``k`` trainers;
        the layers ``buffers`` marks take the mean at rate 1, without momentum."""
        if self.plain:
            self.steps += 1
            return apply_delta(w, mean_delta)
        rate = self.last_rate = self.rate(k)
        self.steps += 1
        if self.momentum == 0.0:
            return apply_delta(w, mean_delta, rate, buffers)
        self.velocity, update = momentum_update(self.velocity, mean_delta, self.momentum,
                                                self.nesterov, buffers)
        return apply_delta(w, update, rate, buffers)

    def remote_settings(self, k: int) -> dict | None:
        """The settings of an outer step over ``k`` deltas that the trainers take
        themselves (allreduce, where the weights and a copy of the velocity live on them):
        ``{"rate", "momentum", "nesterov"}``, or None for a plain average. Call
        :meth:`took_step` once the step is taken (a collective can be redone with fewer)."""
        if self.plain:
            return None
        return {"rate": self.rate(k), "momentum": self.momentum, "nesterov": self.nesterov}

    def took_step(self, settings: dict | None) -> None:
        """Count a step taken elsewhere with :meth:`remote_settings`' ``settings``."""
        if settings is not None:
            self.last_rate = settings["rate"]
        self.steps += 1

    # -- checkpoints -------------------------------------------------------------------------
    def state(self) -> list:
        """The velocity arrays (empty before the first step or without momentum)."""
        return [np.array(v, copy=True) for v in self.velocity] if self.velocity else []

    def load_state(self, arrays: list, steps: int) -> None:
        """Continue from :meth:`state` and the number of steps taken."""
        self.velocity = [np.array(a, copy=True) for a in arrays] if arrays else None
        self.steps = int(steps)
