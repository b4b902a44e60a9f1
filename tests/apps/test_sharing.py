"""Trainers on one node share one read-only copy of the dataset (a memory-mapped cache),
and the copy they share is built from the data they were pointed at.

USS counts the pages only this process maps. Two trainers mapping the same cache file
share its pages, so neither counts them; with private copies each counts all of them.
Both cases are measured on the same two processes, so the check can fail.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys

import numpy as np
from helpers_modules.numpy_trainer import (
    BIG_ROWS,
    NumpyTrainer,
    big_dataset,
    softmax_model_fn,
    touch_all_pages,
)

import ddlf_actors as ddlf
from ddlf_actors.apps import datasets

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


def _write_idx_dataset(directory, n_train: int, seed: int) -> None:
    """The four gzipped IDX files of a small Fashion-MNIST-format dataset (write_idx
    gzips with mtime=0, so the same arrays give the same bytes)."""
    rng = np.random.default_rng(seed)
    directory.mkdir()
    for prefix, n in (("train", n_train), ("t10k", 3)):
        datasets.write_idx(str(directory / f"{prefix}-images-idx3-ubyte.gz"),
                           rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        datasets.write_idx(str(directory / f"{prefix}-labels-idx1-ubyte.gz"),
                           rng.integers(0, 10, n).astype(np.uint8))


def _where(self, module):
    """Where a trainer's arrays and the dataset's module come from."""
    import os
    import sys

    return self.x.filename, sys.modules[module].__file__, os.environ.get("DDLF_CACHE_DIR")


def test_trainers_read_the_directory_their_environment_names(train_cluster, tmp_path):
    """The reported defect, end to end: trainers pointed at 8 generated images, then at
    20 others, under the same dataset name and one node cache. The second set of
    trainers got the 8 cached images."""
    cls = ddlf.remote(num_cpus=1)(NumpyTrainer)
    for n_train, seed in ((8, 1), (20, 2)):
        data = tmp_path / f"data-{n_train}"
        _write_idx_dataset(data, n_train, seed)
        env = {"env_vars": {"DDLF_DATA_DIR": str(data)}}
        trainer = cls.options(runtime_env=env).remote(softmax_model_fn(784, 10),
                                                     "fashion-mnist", 0)
        try:
            assert ddlf.get(trainer.describe.remote())["num_train"] == n_train
        finally:
            ddlf.kill(trainer)


_MODULE = """
import numpy as np


def load():
    x = np.full(({rows}, 2, 2, 1), 0.5, np.float32)
    return (x, np.arange({rows}) % 4), (x[:2], np.arange(2))
"""


def test_driver_and_trainers_share_an_entry_keyed_by_module_source(train_cluster, tmp_path,
                                                                    monkeypatch):
    """A module-level dataset function is keyed by its module's source, not its path: the
    trainer imports the module from its working_dir copy (another path, other mtimes),
    yet maps the entry the driver built. Editing the module gives a new entry."""
    name = "ddlf_test_shared_dsmod"
    folder = tmp_path / "wd"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    cls = ddlf.remote(num_cpus=1)(NumpyTrainer)
    try:
        for rows in (6, 12):
            (folder / f"{name}.py").write_text(_MODULE.format(rows=rows))
            # A rewrite within the same second and of the same size would pass the old
            # bytecode's check, and reload would run the old code.
            shutil.rmtree(folder / "__pycache__", ignore_errors=True)
            importlib.invalidate_caches()
            mod = importlib.reload(sys.modules[name]) if name in sys.modules \
                else importlib.import_module(name)
            (x, _), _ = datasets.load_shared(mod.load)
            assert len(x) == rows
            trainer = cls.options(runtime_env={"working_dir": str(folder)}).remote(
                softmax_model_fn(4, 4), mod.load, 0)
            try:
                assert ddlf.get(trainer.describe.remote())["num_train"] == rows
                filename, module_file, cache_dir = ddlf.get(
                    trainer.run_method.remote(_where, {"module": name}))
                assert module_file != mod.__file__  # the trainer's copy, elsewhere
                assert filename == x.filename, (filename, cache_dir, x.filename,
                                                os.environ.get("DDLF_CACHE_DIR"))
            finally:
                ddlf.kill(trainer)
    finally:
        sys.modules.pop(name, None)
