"""The TensorBoard callback: event files read back, tag by tag, against the history rows."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
from helpers_modules.numpy_trainer import NumpyTrainer, hard_blobs_dataset, softmax_model_fn

from ddlf_actors.apps import train_sync
from ddlf_actors.apps.callbacks import TensorBoard

pytest.importorskip("tensorflow")
pytest.importorskip("tensorboard")   # tf.summary.scalar lives there


def _read_scalars(log_dir: str) -> dict:
    """``{tag: [(step, value), ...]}`` from every event file in ``log_dir``."""
    import tensorflow as tf

    out: dict = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    return out


def test_every_row_is_written_by_round_and_by_time(train_cluster, tmp_path):
    log_dir = str(tmp_path / "tb")
    result = train_sync(softmax_model_fn(64, 4), hard_blobs_dataset, workers=2,
                        master_epochs=2, rounds_per_epoch=2, trainer_cls=NumpyTrainer,
                        progress=False, callbacks=[TensorBoard(log_dir)])
    rows = result.history
    assert len(rows) == 4
    scalars = _read_scalars(log_dir)
    assert set(scalars) == {f"{series}/{key}" for series in ("by_round", "by_time")
                            for key in TensorBoard.KEYS}
    for key in TensorBoard.KEYS:
        present = [r for r in rows if r.get(key) is not None]
        assert present, key
        by_round, by_time = scalars[f"by_round/{key}"], scalars[f"by_time/{key}"]
        assert [s for s, _ in by_round] == [r["round"] for r in present]
        assert [s for s, _ in by_time] == [round(r["time_s"] * 1000) for r in present]
        for (_, a), (_, b), r in zip(by_round, by_time, present):
            # tf.summary.scalar stores float32
            assert a == b == pytest.approx(float(r[key]), rel=1e-6), key
    assert scalars["by_round/workers"] == [(1, 2.0), (2, 2.0), (3, 2.0), (4, 2.0)]
    steps = [s for s, _ in scalars["by_time/test_accuracy"]]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_making_one_does_not_import_tensorflow():
    code = ("import sys\nfrom ddlf_actors.apps.callbacks import TensorBoard\n"
            "TensorBoard('unused')\nassert 'tensorflow' not in sys.modules, 'imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_text_run_is_also_written_by_tokens_with_bits_per_byte(train_cluster, tmp_path):
    pytest.importorskip("torch")
    from ddlf_actors.apps import datasets, lm, train

    (tmp_path / "a.txt").write_text("the cat sat on the mat and then it slept.\n" * 60)
    ds = datasets.text(str(tmp_path / "a.txt"), context=16)
    log_dir = str(tmp_path / "tb")
    result = train(lm.GptModelFn(ds, layers=1, heads=2, dim=16), ds, workers=2,
                   master_epochs=2, progress=False, callbacks=[TensorBoard(log_dir)])
    scalars = _read_scalars(log_dir)
    evaluated = [r for r in result.history if r["test_loss"] is not None]
    assert [s for s, _ in scalars["by_tokens/test_loss"]] == [r["tokens"] for r in evaluated]
    assert [v for _, v in scalars["by_round/bits_per_byte"]] == pytest.approx(
        [r["bits_per_byte"] for r in evaluated], rel=1e-6)
    assert "by_time/tokens_per_s" in scalars and "by_tokens/perplexity" in scalars
