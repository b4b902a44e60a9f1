"""A driver SIGKILLed mid-run, then resumed: continuous history, and for sync the same
weights, bit for bit, as a run that was never stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from helpers_modules.checkpointing_driver import MODEL, RUN
from helpers_modules.numpy_trainer import MomentumTrainer, hard_blobs_dataset, momentum_model_fn
from helpers_modules.util import wait_for, wait_gone

from ddlf_actors.apps import checkpoint, train_async, train_sync

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start_driver(directory, scheme):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([TESTS, os.path.dirname(TESTS),
                                         env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "helpers_modules.checkpointing_driver",
                             str(directory), scheme], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _kill_after_round(directory, scheme, round_no):
    """Start the driver, SIGKILL it once its checkpoint of ``round_no`` is on disk, and
    check that its cluster (head, node, trainers) goes with it."""
    proc = _start_driver(directory, scheme)
    try:
        def far_enough():
            ckpts = checkpoint.list_checkpoints(str(directory))
            return ckpts and int(os.path.basename(ckpts[-1])[5:13]) >= round_no
        assert wait_for(lambda: far_enough() or proc.poll() is not None, timeout=90)
        assert proc.poll() is None, f"driver ended before it was killed: {proc.stderr.read()}"
        cluster = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(cluster) >= 4   # head, node, two trainers at least
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        left = wait_gone(cluster, timeout=30)
        for pid in left:   # end only what this test started, by pid
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        assert not left, f"the killed driver's cluster left {sorted(left)} behind"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    killed_at = checkpoint.load(str(directory))
    assert 0 < killed_at.round < 9
    return killed_at


@pytest.mark.timeout(300)
def test_sync_driver_sigkilled_then_resumed_ends_bit_equal(train_cluster, tmp_path):
    killed_at = _kill_after_round(tmp_path, "sync", 3)
    t0 = time.perf_counter()
    resumed = train_sync(MODEL, hard_blobs_dataset, resume=str(tmp_path), **RUN)
    assert time.perf_counter() - t0 < 120
    whole = train_sync(MODEL, hard_blobs_dataset, **RUN)
    # No duplicated and no missing rounds, and the rows kept from before the kill are the
    # ones the uninterrupted run has.
    assert [r["round"] for r in resumed.history] == list(range(1, 10))
    for a, b in zip(whole.history, resumed.history):
        assert a["samples"] == b["samples"] and a["test_accuracy"] == b["test_accuracy"]
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)
    resumed_event = [e for e in resumed.events if e["kind"] == "resumed"]
    assert len(resumed_event) == 1 and f"round {killed_at.round}" in resumed_event[0]["detail"]
    # Lost at most the round in progress: the checkpoint was at most a round behind.
    kept = [r["round"] for r in killed_at.history]
    assert kept == list(range(1, killed_at.round))


@pytest.mark.timeout(300)
def test_async_driver_sigkilled_then_resumed_continues(train_cluster, tmp_path):
    _kill_after_round(tmp_path, "async", 4)
    resumed = train_async(MODEL, hard_blobs_dataset, resume=str(tmp_path), **RUN)
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3]
    assert sum(r["samples"] for r in resumed.history) == 3 * 600
    assert resumed.history[-1]["test_accuracy"] > 0.5


@pytest.mark.timeout(300)
def test_an_overlapped_run_continued_with_more_epochs_is_bit_equal(train_cluster, tmp_path):
    """Issue 29: a seeded overlap=True run trained 2 epochs with checkpoints, then resumed
    with master_epochs=3, ends with the weights of a 3-epoch run never stopped (trainers
    with momentum, so their optimizer state is continued too)."""
    run = dict(workers=2, rounds_per_epoch=2, trainer_cls=MomentumTrainer, progress=False,
               seed=7, overlap=True)
    model = momentum_model_fn()
    train_sync(model, hard_blobs_dataset, checkpoint_dir=str(tmp_path), master_epochs=2,
               **run)
    resumed = train_sync(model, hard_blobs_dataset, resume=str(tmp_path), master_epochs=3,
                         **run)
    whole = train_sync(model, hard_blobs_dataset, master_epochs=3, **run)
    assert [r["round"] for r in resumed.history] == list(range(1, 7))
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)
    assert resumed.history[-1]["test_loss"] == whole.history[-1]["test_loss"]
