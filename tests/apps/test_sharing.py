"""Trainers on one node share one read-only copy of the dataset (a memory-mapped cache).

USS counts the pages only this process maps. Two trainers mapping the same cache file
share its pages, so neither counts them; with private copies each counts all of them.
Both cases are measured on the same two processes, so the check can fail.
"""

from __future__ import annotations

import numpy as np
from helpers_modules.numpy_trainer import (
    BIG_ROWS,
    NumpyTrainer,
    big_dataset,
    softmax_model_fn,
    touch_all_pages,
)

import ddlf_actors as ddlf

DATA_BYTES = BIG_ROWS * 32 * 32 * 4


def _make_private(self):
    self.x = np.array(self.x)  # what a trainer without the shared cache would hold
    return self.x.flags.writeable


def test_two_trainers_on_one_node_hold_one_copy(train_cluster):
    cls = ddlf.remote(num_cpus=1)(NumpyTrainer)
    trainers = [cls.remote(softmax_model_fn(1024, 4), big_dataset, j) for j in range(2)]
    ddlf.get([t.describe.remote() for t in trainers])
    assert ddlf.get(trainers[0].run_method.remote(lambda self: self.x.flags.writeable, {})) \
        is False  # read-only: no trainer can change what the others see
    # A page counts as unique until the other trainer has faulted it in too: read
    # everything in both first, and measure in a second pass.
    first = ddlf.get([t.run_method.remote(touch_all_pages, {}) for t in trainers])
    assert all(s["sum"] == 0.25 * DATA_BYTES / 4 for s in first)  # every page was read
    shared = ddlf.get([t.run_method.remote(touch_all_pages, {}) for t in trainers])
    assert ddlf.get([t.run_method.remote(_make_private, {}) for t in trainers]) == [True, True]
    private = ddlf.get([t.run_method.remote(touch_all_pages, {}) for t in trainers])
    for s, p in zip(shared, private):
        assert p["uss"] - s["uss"] > 0.8 * DATA_BYTES, (s, p, DATA_BYTES)
    assert sum(s["uss"] for s in shared) < sum(p["uss"] for p in private) - 1.6 * DATA_BYTES
    for t in trainers:
        ddlf.kill(t)
