"""The language models' learning rate: linear warm-up, then cosine decay to a floor.

The same function as Keras' ``CosineDecay(0, decay_steps, alpha, warmup_target,
warmup_steps)``, so ``gpt_tiny`` (Keras) and ``gpt_tiny_torch`` step alike: at step ``t``
(optimizer steps already taken), ``peak * t / warmup`` during the warm-up, then
``peak * (alpha + (1 - alpha) * (1 + cos(pi * f)) / 2)`` with ``f`` the fraction of the
decay done (1 from ``total_steps`` on). nanoGPT's recipe: warm up, decay to a tenth.
"""

from __future__ import annotations

import math

__all__ = ["warmup_cosine", "warmup_for", "DEFAULTS"]

# What gpt_tiny and gpt_tiny_torch use unless told: AdamW as nanoGPT trains its small
# character models (peak 1e-3, betas 0.9/0.99, weight decay 0.1 on matrices, gradients
# clipped to norm 1, 100 warm-up steps, a floor of a tenth of the peak).
DEFAULTS = {"learning_rate": 1e-3, "beta_1": 0.9, "beta_2": 0.99, "weight_decay": 0.1,
            "clip_norm": 1.0, "warmup_steps": 100, "alpha": 0.1}


def warmup_for(warmup_steps: int | None, total_steps: int | None) -> int:
    """``warmup_steps`` if given, else the default (100) but at most a tenth of
    ``total_steps``: a short run is not spent warming up."""
    if warmup_steps is not None:
        return int(warmup_steps)
    default = int(DEFAULTS["warmup_steps"])
    if total_steps is None:
        return default
    return min(default, max(1, int(total_steps) // 10))


def warmup_cosine(step: float, peak: float, warmup_steps: int, total_steps: int | None,
                  alpha: float = 0.1) -> float:
    """The rate at ``step`` (steps taken so far, in steps of the batch the schedule was
    set for: a fraction where the steps are of a smaller batch). ``total_steps`` None: no
    decay."""
    step = max(0.0, float(step))
    if warmup_steps > 0 and step < warmup_steps:
        return peak * step / warmup_steps
    if total_steps is None:
        return peak
    decay = max(1, int(total_steps) - int(warmup_steps))
    done = min(step - warmup_steps, decay) / decay
    return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * done)) + alpha)
