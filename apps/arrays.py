"""Arithmetic on lists of numpy arrays that the driver and the trainers share: how many
bytes a transfer of them carries, and how the test set is cut into shards."""

from __future__ import annotations

import numpy as np

__all__ = ["nbytes", "shard_range", "combine_shards"]


def nbytes(arrays) -> int:
    """Bytes in a list of arrays (weights, deltas): what a transfer of them carries."""
    return int(sum(np.asarray(a).nbytes for a in arrays))


def shard_range(n: int, shard: int, num_shards: int) -> tuple[int, int]:
    """The [start, stop) rows of shard ``shard`` when ``n`` rows are split ``num_shards`` ways."""
    return n * shard // num_shards, n * (shard + 1) // num_shards


def combine_shards(num_test: int, results: list) -> tuple[float, float]:
    """``(loss, accuracy)`` on the whole test set from the K shards' ``(loss, accuracy)``,
    each weighted by its shard's size."""
    K = len(results)
    sizes = [hi - lo for lo, hi in (shard_range(num_test, j, K) for j in range(K))]
    total = float(sum(sizes)) or 1.0
    return (float(sum(s * r[0] for s, r in zip(sizes, results)) / total),
            float(sum(s * r[1] for s, r in zip(sizes, results)) / total))
