"""``ddlf-train run`` end to end on generated IDX files (needs TensorFlow)."""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import socket
import subprocess
import sys

import pytest

pytest.importorskip("keras")
from helpers_modules.clusters import no_leaked_processes  # noqa: E402
from helpers_modules.fake_data import (  # noqa: E402
    write_fake_fashion_mnist as _write_fake_fashion_mnist,
)


def _ddlf_train(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "ddlf_actors.apps.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


# What TensorFlow prints while it loads (apps/tf_startup.py): absl's banner, and log lines
# in absl's format ("I0000 00:00:1795547173.250856   12738 port.cc:153] ...").
_TF_LINE = re.compile(r"(\(\w+ pid=\d+\) )?(WARNING: All log messages before absl|"
                      r"[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] )")


@pytest.mark.parametrize("scheme,verbose", [("sync", False), ("async", True),
                                            ("allreduce", False)])
def test_ddlf_train_run_writes_every_output(tmp_path, scheme, verbose):
    data = tmp_path / "data"
    data.mkdir()
    _write_fake_fashion_mnist(str(data))
    out = tmp_path / "out"
    tb = tmp_path / "tb"
    # The sync run also sends its weights and deltas encoded.
    extra = (["--verbose", "--tensorboard", str(tb)] if verbose else
             ["--compression", "fp16,topk:0.1"] if scheme == "sync" else [])
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", "fashion-mnist", "--data-dir", str(data),
                           "--scheme", scheme, "--workers", "2", "--master-epochs", "2",
                           "--batch-size", "32", "--out", str(out), *extra, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ddlf " + scheme in proc.stderr            # the progress bar
    tf_lines = [m for m in map(_TF_LINE.match, proc.stderr.splitlines()) if m]
    if not verbose:
        # Neither the trainers' TensorFlow nor the driver's (result.model) says a word.
        assert not tf_lines, proc.stderr[-3000:]
    else:
        # --verbose: what TF prints at start-up on this machine (the driver's lines, no
        # "(TrainerActor pid=...)" prefix) is printed by every trainer too.
        if any(m.group(1) is None for m in tf_lines):
            assert any((m.group(1) or "").startswith("(TrainerActor pid=") for m in tf_lines)
        assert glob.glob(str(tb / "events.out.tfevents.*"))
        assert f"TensorBoard logs in {tb}/" in proc.stdout
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


def test_ddlf_train_run_framework_torch_writes_model_pt(tmp_path):
    torch = pytest.importorskip("torch")
    data = tmp_path / "data"
    data.mkdir()
    _write_fake_fashion_mnist(str(data))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    with no_leaked_processes():
        proc = _ddlf_train("run", "--framework", "torch", "--dataset", "fashion-mnist",
                           "--data-dir", str(data), "--workers", "2", "--master-epochs", "2",
                           "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The default scheme, auto, ran the ring and said so on one line.
    assert "ddlf allreduce" in proc.stderr
    assert "auto: allreduce ring of 2" in proc.stdout + proc.stderr
    # A PyTorch run loads no TensorFlow anywhere: not a line of it on the terminal.
    assert not [m for m in map(_TF_LINE.match, proc.stderr.splitlines()) if m], proc.stderr
    assert "(PyTorch)" in proc.stdout and "Wrote model.pt, history.csv" in proc.stdout
    assert sorted(os.listdir(out)) == ["history.csv", "history.json", "model.pt",
                                       "training.png"]
    from ddlf_actors.apps import models

    model = models.paper_cnn_torch()
    model.load_state_dict(torch.load(str(out / "model.pt")))   # weights only, no code
    assert sum(p.numel() for p in model.parameters()) == 515146
    with open(out / "history.json") as f:
        assert [round(r["epoch"]) for r in json.load(f)] == [1, 2]


def test_ddlf_train_bad_dataset_name_is_a_clear_error(tmp_path):
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", "fashion-mnits", "--out", str(tmp_path / "o"),
                           timeout=120)
    assert proc.returncode == 2
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
    # The head's warning about the group summarises its bundles instead of listing 64.
    assert "64 × {CPU: 1}" in proc.stderr and proc.stderr.count("{'CPU'") <= 1
    assert len(proc.stderr) < 1000, proc.stderr


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
    # Other data on the same checkpoints is refused with what differs, exit 2.
    other = _ddlf_train(*common, "--master-epochs", "3", "--limit", "200", "--resume", str(out),
                        timeout=300)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "dataset num_train: checkpoint has 400, this run has 200" in other.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args,says", [
    (["--out", "{file}"], "--out {file} is an existing file"),
    (["--tensorboard", "{file}"], "--tensorboard {file} is an existing file"),
    (["--dataset", "nope"], "unknown dataset 'nope'"),
    (["--workers", "0"], "--workers must be an int >= 1, got 0"),
    (["--target-accuracy", "5"], "--target-accuracy must be in (0, 1]"),
    (["--scheme", "sync", "--staleness-bound", "1"], "applies to --scheme async"),
    (["--scheme", "async", "--balance"], "--balance does not apply to --scheme async; it "
                                         "applies to --scheme sync"),
    (["--workers", "2", "--backup-workers", "2"], "--backup-workers must be less than workers"),
    (["--scheme", "allreduce-nope"], "unknown scheme 'allreduce-nope': the registered"),
    (["--scheme", "downpour", "--n-fetch", "3", "--n-push", "4"], "multiple of the smaller"),
    (["--token-file", "{missing}"], "--token-file {missing}: No such file"),
    (["--address", "127.0.0.1:{port}"], "could not reach a DDLF head at 127.0.0.1:{port}"),
    (["--compression", "gzip"], "--compression gzip: unknown codec 'gzip': valid forms are"),
    (["--compression", "fp16,topk:2"], "--compression fp16,topk:2: bad codec spec 'topk:2'"),
    (["--scheme", "async", "--compression", "topk:0.01"],
     "compression=('fp16', 'topk:0.01')"),
    (["--framework", "torch", "--keras-backend", "jax"],
     "--keras-backend jax runs a Keras model on that backend; --framework torch"),
], ids=["out-is-a-file", "tensorboard-is-a-file", "unknown-dataset", "workers-0",
        "target-accuracy", "staleness-with-sync", "balance-with-async",
        "backup-workers-2-of-2", "unknown-scheme", "downpour-periods", "token-file-missing",
        "no-head-there", "compression-unknown", "compression-bad-fraction",
        "compression-async-changes", "keras-backend-with-torch"])
def test_a_user_mistake_is_one_line_exit_2_before_any_fetch(tmp_path, args, says):
    """cifar10 is in no cache here, so checking after the dataset would start a download
    (and print "fetching"); every mistake must be caught first."""
    existing = tmp_path / "a-file"
    existing.write_text("not a directory\n")
    fill = {"file": str(existing), "missing": str(tmp_path / "no-token"), "port": _closed_port()}
    args = [a.format(**fill) for a in args]
    env = {k: v for k, v in os.environ.items() if k != "DDLF_DATA_DIR"}
    env["DDLF_CACHE_DIR"] = str(tmp_path / "empty-cache")
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", "cifar10", "--out", str(tmp_path / "o"), *args,
                           timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlf-train: error: "), proc.stderr
    assert says.format(**fill) in lines[0]
    assert not os.path.exists(tmp_path / "empty-cache" / "cifar10")   # nothing fetched
