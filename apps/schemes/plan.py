"""Which sample indices each trainer gets: the paper's Algorithm 6, for a changing K.

The driver shuffles and partitions *indices*, never data. Every epoch has its own
permutation, drawn from a generator seeded by ``(seed, epoch)``: a resumed run (or a
replacement trainer) therefore sees exactly the permutation the uninterrupted run would
have, with no generator state to carry across.

- **Shared dataset** (every trainer holds all of it): epoch ``e``'s permutation is cut
  into ``rounds_per_epoch`` consecutive chunks, and round ``r``'s chunk is split among
  the trainers present *in that round*. When K changes mid-epoch (a trainer lost, one
  joined) the next chunk is split among the new K, so each sample is still seen once
  per epoch.
- **Partitioned dataset** (trainer ``j`` holds only partition ``j``): each partition has
  its own permutation per epoch, and round ``r`` takes its ``r``-th chunk. A partition
  whose trainer is absent for a round is not trained that round.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

import numpy as np

__all__ = ["epoch_rng", "Plan", "chunk_bounds", "split_shares"]


def epoch_rng(seed: int, epoch: int, part: int | None = None) -> np.random.Generator:
    """The generator for one epoch (and one partition): independent of everything else."""
    key = [int(seed), int(epoch)] if part is None else [int(seed), int(epoch), int(part)]
    return np.random.default_rng(key)


def chunk_bounds(n: int, r: int, rounds: int, unit: int = 1) -> tuple[int, int]:
    """The [start, stop) of round ``r``'s chunk when ``n`` indices are cut ``rounds`` ways,
    in whole ``unit``s (a batch) but for the last chunk, which takes what is left (in rows
    when there are fewer units than rounds)."""
    if n // unit < rounds:
        unit = 1
    units = n // unit
    lo = units * r // rounds * unit
    hi = n if r + 1 >= rounds else units * (r + 1) // rounds * unit
    return lo, hi


def split_shares(chunk: np.ndarray, shares: Sequence[float],
                 unit: int = 1) -> list[np.ndarray]:
    """Split ``chunk`` into consecutive pieces sized in proportion to ``shares``, in whole
    ``unit``s (a batch); what does not fill a unit goes to the last piece.

    Equal shares give ``np.array_split``'s sizes in units (they differ by at most one).
    Whole batches matter: a piece of 513 rows at batch 32 ends in a step on one sample,
    which an adaptive optimizer moves as far as a full batch's (issue 30: a ring of one
    took 0.72 epochs to 0.875 where one process took 0.50).
    """
    k = len(shares)
    if k == 0:
        return []
    if len(chunk) // unit < k:   # fewer batches than pieces: rows, as evenly as they go
        unit = 1
    units = len(chunk) // unit
    total = float(sum(shares))
    if total <= 0 or len(set(shares)) == 1:
        sizes = [len(p) for p in np.array_split(np.empty(units), k)]
        cuts = np.cumsum(sizes)[:-1] * unit
    else:
        cuts = np.round(np.cumsum(shares)[:-1] / total * units).astype(int) * unit
    return np.split(chunk, cuts)


class Plan:
    """Index assignments for a run.

    ``num_train`` is the training set's size; for a partitioned dataset,
    ``part_sizes[j]`` is partition ``j``'s size (filled in as partitions' trainers join).
    """

    def __init__(self, seed: int, rounds_per_epoch: int, num_train: int,
                 part_sizes: Union[Mapping[int, int], Sequence[int]] | None = None,
                 batch_size: int = 1):
        self.seed = int(seed)
        # Pieces are cut in whole batches (split_shares says why).
        self.unit = max(1, int(batch_size))
        self.rounds = int(rounds_per_epoch)
        self.num_train = int(num_train)
        self.part_sizes: dict[int, int] | None = None
        if part_sizes is not None:
            items = part_sizes.items() if isinstance(part_sizes, Mapping) else enumerate(part_sizes)
            self.part_sizes = {int(k): int(n) for k, n in items}
        self._cache: dict = {}

    @property
    def partitioned(self) -> bool:
        return self.part_sizes is not None

    def permutation(self, epoch: int, part: int | None = None) -> np.ndarray:
        """Epoch ``epoch``'s shuffled indices (of partition ``part``), as int32."""
        key = (epoch, part)
        perm = self._cache.get(key)
        if perm is None:
            n = self.num_train if part is None or self.part_sizes is None else \
                self.part_sizes[part]
            perm = epoch_rng(self.seed, epoch, part).permutation(n).astype(np.int32)
            # Two epochs' worth at most: the current one and the next (async runs ahead).
            for old in [k for k in self._cache if k[0] < epoch - 1]:
                del self._cache[old]
            self._cache[key] = perm
        return perm

    def round_pieces(self, epoch: int, r: int, slots: Sequence[int],
                     shares: Sequence[float] | None = None) -> dict[int, np.ndarray]:
        """Round ``r`` of epoch ``epoch``: ``{slot: indices}`` for the trainers present.

        ``shares`` (one per slot) sizes a shared dataset's pieces; equal by default.
        """
        slots = list(slots)
        if self.partitioned:
            out = {}
            for j in slots:
                perm = self.permutation(epoch, j)
                lo, hi = chunk_bounds(len(perm), r, self.rounds, self.unit)
                out[j] = perm[lo:hi]
            return out
        perm = self.permutation(epoch)
        lo, hi = chunk_bounds(len(perm), r, self.rounds, self.unit)
        pieces = split_shares(perm[lo:hi], shares or [1.0] * len(slots), self.unit)
        return dict(zip(slots, pieces))

    def async_pieces(self, epoch: int, per_round: int, part: int | None = None) -> list:
        """An asynchronous epoch's pieces, in order: ``[(piece_no, indices)]``.

        A shared dataset's permutation is cut into ``rounds_per_epoch * per_round`` pieces
        (``per_round``: the trainers the run is sized for); a partition into
        ``rounds_per_epoch`` pieces.
        """
        perm = self.permutation(epoch, part)
        n = self.rounds if part is not None else self.rounds * max(1, per_round)
        return list(enumerate(np.array_split(perm, n)))

    def sized_pieces(self, epoch: int, size: int, part: int | None = None) -> list:
        """An epoch's permutation (of partition ``part``) cut into consecutive pieces of
        ``size`` indices, the last one shorter if ``size`` does not divide it."""
        perm = self.permutation(epoch, part)
        return [perm[i:i + size] for i in range(0, len(perm), max(1, int(size)))]
