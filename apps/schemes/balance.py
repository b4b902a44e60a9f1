"""Rate-proportional partitions for ``train_sync(balance=True)``.

Every node has the whole dataset memory-mapped, so giving a slow trainer less work moves
no data: only the sizes of the index partitions change. Each slot's speed is an
exponential moving average of ``samples / compute_s`` over its deltas (``compute_s`` is
the trainer's own time in ``train``, so waiting for the driver does not count). A round's
chunk is then split in proportion to the speeds of the trainers it goes to, so that they
all finish at about the same time.

- The first round (no measurement yet) is split evenly; a trainer not measured yet (a
  replacement, a newcomer) counts as the mean of the measured ones.
- A lost trainer's rate is forgotten: its replacement may run on another node.
- No share falls below ``MIN_SHARE`` of the mean, so a trainer that was slow once still
  gets samples to be measured on.

The split depends only on the recorded rates (no clock is read here), and the rates go
into the checkpoint, so a resumed run splits its next round as the uninterrupted run
would have.
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["RateBalancer", "EMA_WEIGHT", "MIN_SHARE"]

# Weight of the newest measurement: half, so a trainer that slows down (a noisy
# neighbour, thermal throttling) is followed within two or three rounds.
EMA_WEIGHT = 0.5
# The least share a trainer gets, as a fraction of the mean share.
MIN_SHARE = 0.05


class RateBalancer:
    """Each slot's measured samples/s, and the shares they give a round."""

    def __init__(self, rates: Mapping[int, float] | None = None):
        self.rates: dict[int, float] = {int(k): float(v) for k, v in (rates or {}).items()}

    def observe(self, slot: int, samples: int, compute_s: float) -> None:
        """Fold one delta's speed into ``slot``'s rate (deltas of no samples or no time
        carry no measurement and are ignored)."""
        if samples <= 0 or not compute_s > 0:
            return
        rate = samples / compute_s
        old = self.rates.get(slot)
        self.rates[slot] = rate if old is None else EMA_WEIGHT * rate + (1 - EMA_WEIGHT) * old

    def forget(self, slot: int) -> None:
        """``slot``'s trainer is gone: its replacement is measured afresh."""
        self.rates.pop(slot, None)

    def shares(self, slots: Sequence[int]) -> list[float]:
        """One share per slot, in order, for ``Plan.round_pieces(shares=...)``.

        Even when no slot of the round has been measured yet.
        """
        known = [self.rates[j] for j in slots if j in self.rates]
        if not known:
            return [1.0] * len(slots)
        mean = sum(known) / len(known)
        raw = [self.rates.get(j, mean) for j in slots]
        floor = MIN_SHARE * sum(raw) / len(raw)
        return [max(r, floor) for r in raw]

    def to_json(self) -> dict:
        """The rates, for a checkpoint's position (JSON keys are strings)."""
        return {str(k): v for k, v in sorted(self.rates.items())}

    @classmethod
    def from_json(cls, data: Mapping | None) -> RateBalancer:
        return cls({int(k): float(v) for k, v in (data or {}).items()})
