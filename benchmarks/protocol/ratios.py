"""Ratios only between columns that differ in one thing.

- A *framework* ratio (seconds per epoch) compares two columns that run the same
  algorithm on different frameworks.
- An *algorithm* ratio (epochs to the target, and time to it) compares two algorithms
  on the same framework, or against the single process (no framework: the same two
  cores with no communication, the physical limit).
- An *end-to-end* ratio (time to the target) is what a user weighing two tools sees:
  framework and algorithm both differ, and its label says so. It is never printed as
  one framework against another.

:func:`pair` refuses any other pairing with :class:`RatioRefused`.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from .columns import COLUMNS, NO_FRAMEWORK, Column

__all__ = ["KINDS", "RatioPair", "RatioRefused", "pair", "HEADLINE_PAIRS", "per_seed_ratios"]

KINDS = {
    "framework": "same algorithm, different framework: seconds per epoch",
    "algorithm": "same framework (or none), different algorithm: epochs and time to target",
    "end-to-end": "framework AND algorithm differ (what a user runs instead): time to target",
}


class RatioRefused(ValueError):
    """Two columns differ in more (or other) than the ratio's kind allows."""


@dataclasses.dataclass(frozen=True)
class RatioPair:
    kind: str
    a: str
    b: str

    @property
    def label(self) -> str:
        return f"{self.kind} ratio, {self.a} / {self.b}"


def pair(kind: str, a: str, b: str, columns: Mapping[str, Column] = COLUMNS) -> RatioPair:
    """A ratio of kind ``kind`` between columns ``a`` and ``b``.

    Raises ``ValueError`` for an unknown kind or column, :class:`RatioRefused` when the
    columns do not differ in exactly what ``kind`` measures."""
    if kind not in KINDS:
        raise ValueError(f"ratio kind must be one of {sorted(KINDS)}, got {kind!r}")
    for name in (a, b):
        if name not in columns:
            raise ValueError(f"unknown column {name!r}")
    ca, cb = columns[a], columns[b]
    same_fw, same_alg = ca.framework == cb.framework, ca.algorithm == cb.algorithm
    if kind == "framework" and not (same_alg and not same_fw):
        raise RatioRefused(f"{a} and {b} do not run the same algorithm on two frameworks "
                           f"({ca.algorithm!r} on {ca.framework} against {cb.algorithm!r} on "
                           f"{cb.framework}): a framework ratio would mix in the algorithm")
    if kind == "algorithm":
        no_fw = NO_FRAMEWORK in (ca.framework, cb.framework)
        if same_alg or not (same_fw or no_fw):
            raise RatioRefused(f"{a} and {b} differ in {'nothing algorithmic' if same_alg else 'framework too'} "
                               f"({ca.framework} against {cb.framework}): an algorithm ratio "
                               "needs the same framework, or the single process")
    if kind == "end-to-end" and (same_alg or same_fw):
        raise RatioRefused(f"{a} and {b} differ in one thing only: use a "
                           f"{'framework' if same_alg else 'algorithm'} ratio")
    return RatioPair(kind, a, b)


# The ratios the headline prints (issue 21, section 1 and 2).
HEADLINE_PAIRS: tuple[RatioPair, ...] = (
    pair("framework", "ddlf-default", "ray-rounds"),
    pair("framework", "ddlf-default", "ddlf-default@ray"),
    pair("framework", "ddlf-alg6", "ray"),
    pair("framework", "ddlf-alg6", "spark"),
    pair("algorithm", "ddlf-default", "ddlf-alg6"),
    pair("algorithm", "ddlf-default", "keras"),
    pair("end-to-end", "ddlf-default", "raytrain"),
)


def per_seed_ratios(a: Mapping[int, float | None], b: Mapping[int, float | None]) -> list[float]:
    """``a[s] / b[s]`` for every seed both have a value for (runs of one seed are
    adjacent in time, so their ratio sees the same load)."""
    return [a[s] / b[s] for s in sorted(set(a) & set(b))
            if a[s] is not None and b[s] not in (None, 0)]


