"""Datasets written for tests in the exact on-disk formats of the real ones."""

from __future__ import annotations

import os

import numpy as np

from ddlf_actors.apps import datasets


def write_fake_fashion_mnist(directory, n_train=400, n_test=100, seed=0):
    """IDX files in the exact on-disk format; classes differ by mean brightness."""
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = np.clip(rng.normal(y[:, None, None] * 25.0, 30.0, (n, 28, 28)), 0, 255)
        datasets.write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"),
                           x.astype(np.uint8))
        datasets.write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), y)
