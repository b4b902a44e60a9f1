"""``ddlf-train run`` end to end on generated IDX files (needs TensorFlow)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("keras")
from helpers_modules.clusters import no_leaked_processes  # noqa: E402

from ddlf_actors.apps import datasets  # noqa: E402


def _write_fake_fashion_mnist(directory, n_train=400, n_test=100, seed=0):
    """IDX files in the exact on-disk format; classes differ by mean brightness."""
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = np.clip(rng.normal(y[:, None, None] * 25.0, 30.0, (n, 28, 28)), 0, 255)
        datasets.write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"),
                           x.astype(np.uint8))
        datasets.write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), y)


def _ddlf_train(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ddlf_actors.apps.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("scheme", ["sync", "async"])
def test_ddlf_train_run_writes_every_output(tmp_path, scheme):
    data = tmp_path / "data"
    data.mkdir()
    _write_fake_fashion_mnist(str(data))
    out = tmp_path / "out"
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", "fashion-mnist", "--data-dir", str(data),
                           "--scheme", scheme, "--workers", "2", "--master-epochs", "2",
                           "--batch-size", "32", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ddlf " + scheme in proc.stderr            # the progress bar
    assert "test acc" in proc.stdout and "epoch" in proc.stdout
    with open(out / "history.json") as f:
        history = json.load(f)
    assert [round(r["epoch"]) for r in history] == [1, 2]
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and float(rows[-1]["test_accuracy"]) == pytest.approx(
        history[-1]["test_accuracy"])
    with open(out / "training.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import keras

    model = keras.saving.load_model(str(out / "model.keras"))
    assert model.count_params() == 515146  # the paper's CNN


def test_ddlf_train_bad_dataset_name_is_a_clear_error(tmp_path):
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", "fashion-mnits", "--out", str(tmp_path / "o"),
                           timeout=120)
    assert proc.returncode != 0
    assert "unknown dataset 'fashion-mnits'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ddlf_train_missing_data_dir_says_how_to_get_files(tmp_path):
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", "fashion-mnist", "--data-dir",
                           str(tmp_path / "empty"), "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 2
    assert "ddlf-train fetch fashion-mnist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ddlf_train_more_workers_than_cpus(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _write_fake_fashion_mnist(str(data), n_train=50, n_test=10)
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", "fashion-mnist", "--data-dir", str(data),
                           "--workers", "64", "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 2
    assert "workers=64" in proc.stderr and "CPUs" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(600)   # two TensorFlow runs of a few trainers each
def test_ddlf_train_checkpoints_into_out_and_resumes(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _write_fake_fashion_mnist(str(data))
    out = tmp_path / "out"
    common = ["run", "--dataset", "fashion-mnist", "--data-dir", str(data), "--workers", "1:2",
              "--batch-size", "32", "--no-progress"]
    with no_leaked_processes():
        first = _ddlf_train(*common, "--master-epochs", "1", "--checkpoint-every", "1",
                            "--out", str(out))
        assert first.returncode == 0, first.stderr[-3000:]
        assert sorted(p for p in os.listdir(out) if p.startswith("ckpt-")) == ["ckpt-00000001.npz"]
        second = _ddlf_train(*common, "--master-epochs", "2", "--resume", str(out))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed" in second.stderr and "ckpt-00000001.npz" in second.stderr
    with open(out / "history.json") as f:
        history = json.load(f)
    assert [r["round"] for r in history] == [1, 2]        # continuous, nothing twice
    assert all(r["workers"] in (1, 2) for r in history)
    assert " K " in second.stdout or "  K" in second.stdout   # the table's trainers column
    # Another model on the same checkpoints is refused with what differs, exit 2.
    cifar = _ddlf_train("run", "--dataset", "cifar10", "--resume", str(out), timeout=120)
    assert cifar.returncode == 2 and "Traceback" not in cifar.stderr
