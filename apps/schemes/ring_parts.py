"""What allreduce's machine (``allreduce.py``) keeps of a run, outside its class: the round
and the collective in progress, a fetch of the weights, the codec a ring runs with, and
the hop feedback and evaluations of streamed rounds."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .. import ring
from ..options import ConfigError
from ..records import TrainStats
from .slots import Slot
from .wire import CallSpec

__all__ = ["ring_spec", "Round", "Collective", "Fetch", "LocalEval", "hop_meta",
           "hop_arrays", "hop_state"]


def ring_spec(compression) -> tuple[str | None, bool]:
    """``(codec spec or None, error feedback)`` of an allreduce run's ``compression=``: one
    codec for the ring's hops (a ring has one direction), refusing what it cannot carry.
    Error feedback per hop is on with ``:ef``, and by default for ``int4``, whose 16
    levels leave a bias that would otherwise add up round after round (``:noef``: off)."""
    if compression is None:
        return None, False
    if isinstance(compression, (tuple, list)):
        raise ConfigError("compression", f"{tuple(compression)!r}: allreduce sends one stream, "
                          "around the ring, so it takes one codec, not a (down, up) pair: "
                          "e.g. compression='int4'")
    try:
        codec = ring.ring_codec(compression)
    except ValueError as e:
        raise ConfigError("compression", f"{compression!r}: {e}") from None
    if codec is None or codec.name == "none":
        return None, False
    spec = compression if isinstance(compression, str) else codec.spec
    feedback = not codec.lossless and (codec.error_feedback or (
        codec.name == "int4" and not spec.endswith(":noef")))
    return codec.spec, feedback


@dataclasses.dataclass
class Round:
    number: int                   # 1-based
    epoch: int
    r: int
    t_start: float
    pieces: dict
    rate: dict
    calls: dict[int, Slot] = dataclasses.field(default_factory=dict)
    results: dict[int, TrainStats] = dataclasses.field(default_factory=dict)   # slot -> stats
    handles: dict[int, Any] = dataclasses.field(default_factory=dict)    # slot -> its trainer


@dataclasses.dataclass
class Collective:
    """One round's allreduce, over as many attempts as it takes."""

    ring: list[Slot]
    t_start: float
    rd: Round | None = None       # the round whose deltas it averages (None: the flush)
    attempt: int = 0
    quiet_failures: int = 0       # attempts that failed with no trainer lost
    calls: dict[int, Slot] = dataclasses.field(default_factory=dict)
    replies: dict[int, dict] = dataclasses.field(default_factory=dict)
    replies_all: list = dataclasses.field(default_factory=list)   # every attempt's bytes
    record: dict = dataclasses.field(default_factory=dict)
    tag: tuple = ()
    outer: Any = None
    lost_any: bool = False
    aborted: bool = False
    background: bool = False      # overlap: on the trainers' threads, reported by holds
    awaiting: set = dataclasses.field(default_factory=set)   # started, not reported yet

    @property
    def over(self) -> bool:
        return not self.calls and not self.awaiting


@dataclasses.dataclass
class Fetch:
    """Fetching the weights (and velocity) from one trainer that holds them."""

    slots: list[Slot] | None
    velocity: bool
    then: Callable[[list, Any], list]
    call: int = 0


class LocalEval:
    """A row's evaluation on the globals the trainers of a streamed run hold."""

    def __init__(self, run: int, fragments: int):
        self.run, self.fragments = run, fragments

    def evaluate(self, slot, shard) -> CallSpec:
        return "evaluate_stream", ((self.run, 0), [], shard, self.fragments), {}

    def take_bytes(self) -> int:
        return 0


# -- hop feedback in checkpoints: JSON for its key and layout, arrays for its residuals --------
def hop_meta(state: dict) -> dict:
    key = state["key"]
    return {"key": None if key is None else [key[0], key[1], [list(v) for v in key[2]]],
            "hops": {h: [r is not None for r in rs]
                     for h, rs in sorted(state["residuals"].items())}}


def hop_arrays(state: dict) -> list:
    return [r for _h, rs in sorted(state["residuals"].items()) for r in rs if r is not None]


def hop_state(meta: dict, arrays: list) -> dict:
    it = iter(arrays)
    key = meta["key"]
    return {"key": None if key is None else (int(key[0]), int(key[1]),
                                             tuple((int(n), str(d)) for n, d in key[2])),
            "residuals": {h: [np.array(next(it)) if kept else None for kept in flags]
                          for h, flags in sorted(meta["hops"].items())}}
