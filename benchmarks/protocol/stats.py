"""Median and range over seeds, where some seeds may never have reached the target."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

__all__ = ["Summary", "summarize", "fmt_summary"]


@dataclasses.dataclass(frozen=True)
class Summary:
    """``median``, ``lo`` and ``hi`` over ``n`` values; ``missing`` of them were None
    (never reached), counted as +infinity: the median is ``inf`` when half or more are
    missing, and ``hi`` is ``inf`` when any is."""

    median: float
    lo: float
    hi: float
    n: int
    missing: int

    def to_json(self) -> dict:
        def num(v):
            return None if v is None or math.isinf(v) or math.isnan(v) else v

        return {"median": num(self.median), "min": num(self.lo), "max": num(self.hi),
                "n": self.n, "missing": self.missing}


def summarize(values: Sequence[float | None]) -> Summary | None:
    """The :class:`Summary` of ``values`` (None counts as never reached), or None for none."""
    if not values:
        return None
    xs = sorted(math.inf if v is None else float(v) for v in values)
    n, mid = len(xs), len(xs) // 2
    median = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
    return Summary(median, xs[0], xs[-1], n, sum(v is None for v in values))


def fmt_summary(s: Summary | None, spec: str = ".1f", width: int = 0) -> str:
    """``median [min-max]``; ``-`` for no values; ``never`` for a median never reached,
    and ``>`` before a range whose top was never reached."""
    if s is None:
        text = "-"
    elif math.isinf(s.median):
        text = f"never ({s.n - s.missing}/{s.n})"
    elif s.n == 1:
        text = format(s.median, spec)
    else:
        hi = "never" if math.isinf(s.hi) else format(s.hi, spec)
        text = f"{format(s.median, spec)} [{format(s.lo, spec)}-{hi}]"
    return text.rjust(width) if width else text
