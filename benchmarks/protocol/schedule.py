"""The order of column-runs in one invocation: interleaved by seed.

Seed 1 of every column (and, during selection, of every candidate), then seed 2, and
so on: a change of the machine's load meanwhile then shows as spread between seeds of
every column, not as a ratio between columns run at different times.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

__all__ = ["Job", "interleave"]


@dataclasses.dataclass(frozen=True)
class Job:
    """One column-run: a column with one candidate setting, one seed, one stage."""

    stage: str
    seed: int
    column: str
    candidate: dict

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Job:
        return cls(d["stage"], int(d["seed"]), d["column"], dict(d["candidate"]))


def interleave(stage: str, columns: Sequence[str], seeds: Sequence[int],
               candidates: Mapping[str, Sequence[dict]]) -> list[Job]:
    """Every (seed, column, candidate) as a :class:`Job`, seed-major, columns in the
    given order, each column's candidates in grid order. A column missing from
    ``candidates`` (or with none) is skipped."""
    return [Job(stage, seed, col, dict(cand))
            for seed in seeds for col in columns for cand in candidates.get(col, ())]
