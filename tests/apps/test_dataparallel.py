"""scheme="dataparallel" on a real local cluster: one embedded 2-CPU cluster for the module,
numpy trainers (seconds per test). The gradient of every step goes around the ring over
direct actor calls between trainer processes; faults are real SIGKILLs.

(``test_unit_dataparallel.py`` checks the arithmetic in-process against one model stepping
on the trainers' batches together; here the same run on processes gives the same weights.)
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers_modules.numpy_trainer import (
    MomentumTrainer,
    NoGradients,
    NumpyTrainer,
    SigkillInCollective,
    hard_blobs_dataset,
    momentum_model_fn,
    softmax_model_fn,
)

from ddlf_actors.apps import checkpoint, train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.callbacks import Callback
from ddlf_actors.apps.options import ConfigError
from ddlf_actors.apps.schemes import DataParallelMachine, Driver, split_options

MODEL = softmax_model_fn(64, 4)
# Batches of 25: the plan cuts pieces in whole batches, and 600 rows in 2 rounds go to 2
# or 3 trainers as 150 or 100 rows each, so the sample counts below are exact.
RUN = dict(workers=2, num_cpus=0.5, master_epochs=2, rounds_per_epoch=2, batch_size=25,
           seed=11, progress=False)


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


def test_the_cluster_run_is_the_in_process_one(train_cluster):
    on_cluster = train(MODEL, hard_blobs_dataset, "dataparallel", trainer_cls=NumpyTrainer,
                       eval_every=1, **RUN)
    in_process = train(MODEL, hard_blobs_dataset, "dataparallel", trainer_cls=NumpyTrainer,
                       eval_every=1, backend=FakeBackend(), **RUN)
    for a, b in zip(on_cluster.weights, in_process.weights):
        np.testing.assert_array_equal(a, b)   # a + b == b + a: the same bits at K = 2
    h = on_cluster.history
    assert [r["workers"] for r in h] == [2] * 4 and h[-1]["test_accuracy"] > 0.6
    # 150 rows per trainer a round, batches of 25: 6 steps, each sending one gradient.
    assert [r["ring_bytes"] for r in h] == [2 * 6 * (64 * 4 + 4) * 4] * 4
    assert [r["test_accuracy"] for r in h] == [r["test_accuracy"] for r in in_process.history]


def _kill_env(tmp_path, **more):
    env = {"DDLF_TEST_KILL_DIR": str(tmp_path), "DDLF_TEST_FIT_SLEEP": "0.05"}
    env.update({f"DDLF_TEST_KILL_{k.upper()}": str(v) for k, v in more.items()})
    return {"runtime_env": {"env_vars": env}}


def test_trainer_sigkilled_inside_a_step_the_survivors_redo_the_round(train_cluster, tmp_path):
    # Trainer 1 dies after its 3rd chunk of round 2 (its second step's reduce-scatter):
    # the others give the round up, put its starting state back and run it again.
    config, options = split_options("dataparallel", dict(
        RUN, workers=3, min_workers=3, master_epochs=3, trainer_cls=SigkillInCollective,
        trainer_options=_kill_env(tmp_path, slot=1, round=2, sends=3)))
    driver = Driver(DataParallelMachine, MODEL, hard_blobs_dataset, config, options)
    result = driver.run()
    assert (tmp_path / "killed").exists()
    h = result.history
    assert [r["round"] for r in h] == list(range(1, 7))
    lost = _kinds(result, "trainer_lost")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and lost[0]["round"] == 2
    first, again = [c for c in driver.machine.collectives if c["round"] == 2]
    assert first["ring"] == [0, 1, 2] and first["status"][1] == "lost"
    assert again["ring"] == [0, 2] and again["status"] == {0: "done", 2: "done"}
    assert h[1]["workers"] == 2 and h[1]["samples"] == 200   # without trainer 1's rows
    # The replacement copied the weights and the optimizer state, and took part again
    # (the driver checks that every member holds the same after each round).
    joined = _kinds(result, "trainer_joined")
    assert len(joined) == 1 and joined[0]["trainer"] == 1
    assert h[-1]["workers"] == 3 and h[-1]["test_accuracy"] > 0.6


class _Abort(Callback):
    def on_row(self, row, run):
        if row["round"] == 3:
            raise KeyboardInterrupt("driver stopped")


def test_resume_is_continuous_and_bit_equal(train_cluster, tmp_path):
    common = dict(RUN, master_epochs=3, eval_every=1, trainer_cls=MomentumTrainer)
    model = momentum_model_fn(64, 4)
    whole = train(model, hard_blobs_dataset, "dataparallel", **common)
    with pytest.raises(KeyboardInterrupt):
        train(model, hard_blobs_dataset, "dataparallel", checkpoint_dir=str(tmp_path),
              callbacks=[_Abort()], **common)
    saved = checkpoint.load(str(tmp_path))
    assert saved.round == 3 and saved.meta["scheme"] == "dataparallel"
    assert sorted(saved.optimizer_states) == [0, 1]
    resumed = train(model, hard_blobs_dataset, "dataparallel", resume=str(tmp_path), **common)
    assert [r["round"] for r in resumed.history] == list(range(1, 7))
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)   # momentum state included
    for a, b in zip(whole.history, resumed.history):
        assert a["test_accuracy"] == b["test_accuracy"]


def test_a_trainer_without_the_gradient_hooks_is_refused_before_training(train_cluster):
    with pytest.raises(ConfigError, match=r"NoGradients trains without a framework adapter "
                                          r"and does not override compute_gradients"):
        train(MODEL, hard_blobs_dataset, "dataparallel", trainer_cls=NoGradients, **RUN)
