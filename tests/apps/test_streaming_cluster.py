"""Streamed rounds on DDLF's runtime, where the transport matters: fragments' globals as
refs among a call's arguments, allreduce's collective on a trainer's own thread calling
its neighbour while the trainer trains, and a trainer SIGKILLed meanwhile. One embedded
2-CPU cluster for the module; numpy trainers. Each run is compared with the same run on
the in-process fake backend, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_modules.numpy_trainer import (
    NumpyTrainer,
    SigkillOnce,
    hard_blobs_dataset,
    softmax_model_fn,
)

from ddlf_actors.apps import train
from ddlf_actors.apps.backends.fake import FakeBackend

MODEL = softmax_model_fn(64, 4)
RUN = dict(workers=2, master_epochs=2, rounds_per_epoch=3, seed=7, progress=False,
           trainer_cls=NumpyTrainer)


def _run(scheme, backend=None, **options):
    return train(MODEL, hard_blobs_dataset, scheme, backend=backend, **{**RUN, **options})


@pytest.mark.parametrize("scheme,extra", [
    ("sync", dict(overlap=True, fragments=2, compression="int4:ef")),
    ("sync", dict(overlap=True, compression=("fp16", "topk:0.2"))),
    ("allreduce", dict(overlap=True)),
    ("allreduce", dict(overlap=True, fragments=2, compression="int4")),
])
def test_streamed_runs_on_a_cluster_equal_the_in_process_ones(train_cluster, scheme, extra):
    on_cluster = _run(scheme, **extra)
    in_process = _run(scheme, FakeBackend(), **extra)
    for a, b in zip(on_cluster.weights, in_process.weights):
        np.testing.assert_array_equal(a, b)
    assert [r["test_accuracy"] for r in on_cluster.history] == \
        [r["test_accuracy"] for r in in_process.history]
    assert on_cluster.history[-1]["test_accuracy"] > 0.6


@pytest.mark.parametrize("scheme", ["sync", "allreduce"])
def test_a_trainer_sigkilled_in_an_overlapped_run_is_replaced(train_cluster, tmp_path, scheme):
    # Trainer 1 dies in its third fit: with allreduce, while the collective of round 2
    # runs on the trainers' threads; the survivor's is called off and redone alone.
    env = {"DDLF_TEST_KILL_DIR": str(tmp_path), "DDLF_TEST_FIT_SLEEP": "0.05",
           "DDLF_TEST_KILL_SLOT": "1", "DDLF_TEST_KILL_CALL": "3"}
    extra = dict(chunk_timeout_s=30.0) if scheme == "allreduce" else {}
    result = _run(scheme, overlap=True, fragments=2, min_workers=2, trainer_cls=SigkillOnce,
                  trainer_options={"runtime_env": {"env_vars": env}}, **extra)
    assert (tmp_path / "killed").exists()
    lost = [e for e in result.events if e["kind"] == "trainer_lost"]
    assert len(lost) == 1 and lost[0]["trainer"] == 1
    assert [e for e in result.events if e["kind"] == "trainer_joined"]
    h = result.history
    assert [r["round"] for r in h] == list(range(1, 13))
    assert min(r["workers"] for r in h) == 1 and h[-1]["workers"] == 2
    assert h[-1]["test_accuracy"] > 0.55
