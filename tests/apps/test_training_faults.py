"""Training that survives lost trainers, grows when CPUs appear, checkpoints and resumes.

One embedded 2-CPU cluster for the module; trainers are the numpy ones (seconds per test),
and for a lost trainer and a bit-equal resume, a small PyTorch module too (the
``framework`` fixture; the in-process versions of every fault test run on both).
Faults are real: a trainer SIGKILLs its own process mid-``fit`` (``SigkillOnce``), as
``kill -9`` from outside would. Multi-node faults are in test_training_nodes.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers_modules.numpy_trainer import (
    ConstantDeltaSigkillOnce,
    ConstantDeltaTrainer,
    FailsWhenReplaced,
    MomentumTrainer,
    NumpyTrainer,
    SigkillOnce,
    blobs,
    hard_blobs_dataset,
    momentum_model_fn,
    softmax_model_fn,
)
from helpers_modules.torch_trainer import Sgd, TinyTorch, TorchTrainer
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors.apps import (
    CheckpointMismatchError,
    TooFewTrainersError,
    checkpoint,
    train,
    train_async,
    train_sync,
)
from ddlf_actors.apps.callbacks import Callback
from ddlf_actors.runtime.client import current

MODEL = softmax_model_fn(64, 4)


def _kill_env(tmp_path, sleep=0.15, slot=1, call=2):
    env = {"DDLF_TEST_KILL_DIR": str(tmp_path), "DDLF_TEST_FIT_SLEEP": str(sleep),
           "DDLF_TEST_KILL_SLOT": str(slot), "DDLF_TEST_KILL_CALL": str(call)}
    return {"runtime_env": {"env_vars": env}}


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


def test_sync_trainer_sigkilled_mid_round_is_replaced(train_cluster, tmp_path, framework):
    # min_workers=2: the round after the loss waits for the replacement. Without it the
    # replacement races the remaining rounds (0.15 s each), and under load it lost.
    result = train_sync(framework.model_fn(), hard_blobs_dataset, workers=2, master_epochs=3,
                        rounds_per_epoch=2, trainer_cls=framework.trainer(SigkillOnce),
                        batch_size=25,   # whole batches cut 600 rows into 150s
                        progress=False, min_workers=2, trainer_options=_kill_env(tmp_path),
                        **framework.options)
    assert (tmp_path / "killed").exists()          # the fault really happened
    h = result.history
    assert [r["round"] for r in h] == [1, 2, 3, 4, 5, 6]   # every round completed
    lost = _kinds(result, "trainer_lost")
    joined = _kinds(result, "trainer_joined")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and lost[0]["round"] == 2
    assert lost[0]["node"] and "ActorDiedError" in lost[0]["detail"]
    assert len(joined) == 1 and joined[0]["trainer"] == 1
    assert joined[0]["time_s"] >= lost[0]["time_s"] and "replacement" in joined[0]["detail"]
    # The round of the loss averaged the one delta that arrived, for its own samples ...
    assert h[1]["workers"] == 1 and h[1]["samples"] == 150
    assert h[0]["workers"] == 2 and h[0]["samples"] == 300
    # ... and the replacement took part again from the round after it joined.
    back = [r for r in h if r["workers"] == 2 and r["round"] > 2]
    assert back and back[-1]["round"] == 6
    assert h[-1]["test_accuracy"] > 0.5


def test_async_survivors_go_on_and_the_lost_piece_is_redone(train_cluster, tmp_path):
    result = train_async(MODEL, hard_blobs_dataset, workers=2, master_epochs=3,
                         rounds_per_epoch=2, trainer_cls=SigkillOnce, progress=False,
                         trainer_options=_kill_env(tmp_path))
    assert (tmp_path / "killed").exists()
    h = result.history
    assert [r["epoch"] for r in h] == [1, 2, 3]
    assert len(_kinds(result, "trainer_lost")) == 1
    # The lost trainer's piece went back to the queue: every sample trained once per epoch.
    assert sum(r["samples"] for r in h) == 3 * 600
    assert len(result.updates) == 3 * 2 * 2
    assert h[-1]["test_accuracy"] > 0.5


def test_ssp_bound_does_not_wait_for_a_lost_trainer(train_cluster, tmp_path):
    result = train_async(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                         rounds_per_epoch=4, staleness_bound=0, trainer_cls=SigkillOnce,
                         progress=False, trainer_options=_kill_env(tmp_path))
    assert len(_kinds(result, "trainer_lost")) == 1
    assert [r["epoch"] for r in result.history] == [1, 2]


def test_too_few_trainers_is_a_clear_error_not_a_hang(train_cluster, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    with pytest.raises(TooFewTrainersError) as info:
        train_sync(MODEL, hard_blobs_dataset, workers=2, min_workers=2, master_epochs=4,
                   rejoin_timeout_s=2, trainer_cls=FailsWhenReplaced, progress=False,
                   checkpoint_dir=str(ckpt_dir), trainer_options=_kill_env(tmp_path, sleep=0))
    text = str(info.value)
    assert "min_workers=2" in text and "1 trainer(s) left" in text
    assert "resume=" in text and str(ckpt_dir) in text
    # The checkpoint it points at is whole and loads.
    ckpt = checkpoint.load(str(ckpt_dir))
    assert ckpt.round == 2 and len(ckpt.weights) == 2   # the round of the loss completed


class _WaitForDeadActors(Callback):
    """Holds the driver after a row until ``n`` actors of ``cls_name`` are dead, so the
    failed replacement's fate is known before the next round starts."""

    def __init__(self, cls_name, n):
        self.cls_name = cls_name
        self.n = self._dead() + n   # earlier tests' actors of that class are dead too

    def _dead(self):
        actors = current.get_core().head_call("list_actors")
        return sum(1 for a in actors if a.get("class_name") == self.cls_name
                   and a.get("state") == "DEAD")

    def on_row(self, row, run):
        if row["round"] == 2:
            assert wait_for(lambda: self._dead() >= self.n, timeout=30)


def test_down_to_min_workers_training_goes_on(train_cluster, tmp_path):
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=4,
                        trainer_cls=FailsWhenReplaced, progress=False,
                        callbacks=[_WaitForDeadActors("FailsWhenReplaced", 2)],
                        trainer_options=_kill_env(tmp_path, sleep=0))
    failed = _kinds(result, "trainer_start_failed")
    assert len(failed) == 1 and "replacement refuses to start" in failed[0]["detail"]
    assert [r["workers"] for r in result.history] == [2, 1, 1, 1]
    assert not _kinds(result, "trainer_joined")


class _FreeCpuAfterFirstRow(Callback):
    def __init__(self, hog):
        self.hog = hog

    def on_row(self, row, run):
        if self.hog is not None:
            ddlf.kill(self.hog)
            self.hog = None


@ddlf.remote(num_cpus=1)
class CpuHog:
    def ping(self):
        return True


def test_elastic_run_starts_with_the_minimum_and_grows(train_cluster):
    hog = CpuHog.remote()
    ddlf.get(hog.ping.remote(), timeout=30)
    env = {"runtime_env": {"env_vars": {"DDLF_TEST_FIT_SLEEP": "0.15"}}}
    result = train_sync(MODEL, hard_blobs_dataset, workers=(1, 2), master_epochs=4,
                        rounds_per_epoch=2, trainer_cls=SigkillOnce, progress=False,
                        batch_size=25,   # whole batches: rounds of exactly 300 rows
                        callbacks=[_FreeCpuAfterFirstRow(hog)], trainer_options=env)
    workers = [r["workers"] for r in result.history]
    assert workers[0] == 1 and workers[-1] == 2
    joined = _kinds(result, "trainer_joined")
    assert [e["trainer"] for e in joined] == [1]
    # Partitions follow each round's K: every round still covers its share of the set.
    assert all(r["samples"] == 300 for r in result.history)


def test_checkpoints_hold_weights_optimizer_state_and_history(train_cluster, tmp_path):
    model = momentum_model_fn(64, 4)
    result = train_sync(model, hard_blobs_dataset, workers=2, master_epochs=2,
                        rounds_per_epoch=2, trainer_cls=MomentumTrainer, progress=False,
                        checkpoint_dir=str(tmp_path), checkpoint_every=1)
    files = sorted(os.listdir(tmp_path))
    assert files == ["ckpt-00000003.npz", "ckpt-00000004.npz"]   # the newest two, no temps
    ckpt = checkpoint.load(str(tmp_path))
    assert ckpt.round == 4 and result.checkpoint == ckpt.path
    for a, b in zip(ckpt.weights, result.weights):
        np.testing.assert_array_equal(a, b)
    # Each trainer's momentum and step count: 2 velocities + 1 counter, per slot.
    assert sorted(ckpt.optimizer_states) == [0, 1]
    for state in ckpt.optimizer_states.values():
        assert len(state) == 3 and int(state[2]) > 0 and np.any(state[0] != 0)
    meta = ckpt.meta
    assert [r["round"] for r in meta["history"]] == [1, 2, 3]   # row 4 was being evaluated
    assert meta["position"]["pending_row"]["round"] == 4
    assert meta["rng"]["seed"] == 0 and meta["options"]["rounds_per_epoch"] == 2
    assert meta["fingerprint"]["model"]["weights"] == [[[64, 4], "<f4"], [[4], "<f4"]]
    assert [e["round"] for e in result.events if e["kind"] == "checkpoint"] == [1, 2, 3, 4]
    assert 0 <= result.checkpoint_s < result.history[-1]["time_s"]
    # The background writer's own time: four npz files written and fsynced.
    assert 0 < result.checkpoint_write_s < result.history[-1]["time_s"]
    assert 0 < result.checkpoint_cpu_s <= result.checkpoint_write_s + 1e-3   # two clocks


class _Abort(Callback):
    """Ends the driver's run abruptly after ``n`` rows (as a crash would, mid-round)."""

    def __init__(self, n):
        self.n = n

    def on_row(self, row, run):
        if row["round"] == self.n:
            raise KeyboardInterrupt("driver stopped")


# Outer Nesterov momentum, the K rule's warm-up and a trainers' schedule: the velocity,
# the outer step count and the trainers' step count travel in the checkpoint.
_OUTER = dict(outer_lr=0.6, outer_momentum=0.8, nesterov=True, lr_scaling="outer",
              warmup_rounds=4, lr_schedule=lambda step: 0.4 / (1 + 0.05 * step))


@pytest.mark.parametrize("trainer,model,options", [
    (NumpyTrainer, MODEL, dict(outer_momentum=0.0, lr_scaling="none")),
    (MomentumTrainer, momentum_model_fn(64, 4), dict(outer_momentum=0.0, lr_scaling="none")),
    (NumpyTrainer, MODEL, _OUTER),
    # PyTorch: SGD with momentum (its state in the checkpoint) and DDLF's outer defaults.
    (TorchTrainer, TinyTorch(), dict(optimizer=Sgd(0.5, momentum=0.9))),
], ids=["plain", "optimizer-state", "outer-momentum-and-schedules", "torch"])
def test_sync_resume_is_continuous_and_bit_equal(train_cluster, tmp_path, trainer, model,
                                                 options):
    if trainer is TorchTrainer:
        pytest.importorskip("torch")
    # Every round evaluated, so row 3 (where the driver stops) comes after its checkpoint.
    common = dict(workers=2, master_epochs=3, rounds_per_epoch=2, eval_every=1,
                  trainer_cls=trainer, progress=False, seed=5, **options)
    whole = train_sync(model, hard_blobs_dataset, **common)
    with pytest.raises(KeyboardInterrupt):
        train_sync(model, hard_blobs_dataset, checkpoint_dir=str(tmp_path),
                   callbacks=[_Abort(3)], **common)
    assert checkpoint.load(str(tmp_path)).round == 3
    resumed = train_sync(model, hard_blobs_dataset, resume=str(tmp_path), **common)
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    assert [e["kind"] for e in resumed.events].count("resumed") == 1
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)   # bit-equal, momentum state included
    for a, b in zip(whole.history, resumed.history):
        assert a["test_accuracy"] == b["test_accuracy"] and a["samples"] == b["samples"]


def test_async_resume_continues_to_the_last_epoch(train_cluster, tmp_path):
    common = dict(workers=2, master_epochs=4, rounds_per_epoch=2, trainer_cls=NumpyTrainer,
                  progress=False)
    with pytest.raises(KeyboardInterrupt):
        train_async(MODEL, hard_blobs_dataset, checkpoint_dir=str(tmp_path),
                    callbacks=[_Abort(8)], **common)   # async rows are numbered by update
    assert checkpoint.load(str(tmp_path)).round >= 8
    resumed = train_async(MODEL, hard_blobs_dataset, resume=str(tmp_path), **common)
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3, 4]
    assert sum(r["samples"] for r in resumed.history) == 4 * 600
    assert resumed.history[-1]["test_accuracy"] > 0.5


def test_resume_refuses_another_model_or_dataset(train_cluster, tmp_path):
    train_sync(MODEL, hard_blobs_dataset, workers=2, trainer_cls=NumpyTrainer, progress=False,
               checkpoint_dir=str(tmp_path))
    with pytest.raises(CheckpointMismatchError, match=r"model weights: checkpoint has .*64, 4"):
        train_sync(softmax_model_fn(64, 3), hard_blobs_dataset, workers=2, master_epochs=2,
                   trainer_cls=NumpyTrainer, progress=False, resume=str(tmp_path))

    def other_data():
        return blobs(n_train=500, n_test=200)

    with pytest.raises(CheckpointMismatchError, match=r"dataset num_train: checkpoint has 600"):
        train_sync(MODEL, other_data, workers=2, master_epochs=2, trainer_cls=NumpyTrainer,
                   progress=False, resume=str(tmp_path))
    with pytest.raises(CheckpointMismatchError, match="written by a sync run"):
        train_async(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                    trainer_cls=NumpyTrainer, progress=False, resume=str(tmp_path))


def test_resume_from_a_directory_without_checkpoints(train_cluster, tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        train_sync(MODEL, hard_blobs_dataset, trainer_cls=NumpyTrainer, progress=False,
                   resume=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_sync(MODEL, hard_blobs_dataset, trainer_cls=NumpyTrainer, progress=False,
                   resume=str(tmp_path / "nope"))


def test_progress_bar_shows_a_loss_and_a_rejoin(train_cluster, tmp_path, capfd):
    train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=3, rounds_per_epoch=2,
               trainer_cls=SigkillOnce, progress=True, min_workers=2,
               trainer_options=_kill_env(tmp_path))
    err = capfd.readouterr().err
    assert "trainer 1 lost on node" in err and "trainer 1 joined on node" in err
    assert "K=1" in err and "K=2" in err


# -- easgd and downpour: lost trainers and resume -------------------------------------------------
_ASYNC_KINDS = [("easgd", dict(tau=4)), ("downpour", dict(n_fetch=2, n_push=4))]


@pytest.mark.parametrize("scheme,options", _ASYNC_KINDS, ids=["easgd", "downpour"])
def test_easgd_and_downpour_survive_a_sigkilled_trainer(train_cluster, tmp_path, scheme,
                                                        options):
    result = train(MODEL, hard_blobs_dataset, scheme, workers=2, master_epochs=3,
                   batch_size=16, trainer_cls=SigkillOnce, progress=False,
                   trainer_options=_kill_env(tmp_path, sleep=0.05, call=3), **options)
    assert (tmp_path / "killed").exists()
    h = result.history
    assert [r["epoch"] for r in h] == [1, 2, 3]
    lost = _kinds(result, "trainer_lost")
    assert len(lost) == 1 and lost[0]["trainer"] == 1
    # What the lost trainer had not handed in was trained again: every sample counts once
    # per epoch.
    assert sum(r["samples"] for r in h) == 3 * 600
    assert h[-1]["test_accuracy"] > 0.5


def test_downpour_retrains_what_a_lost_trainer_never_pushed(train_cluster, tmp_path):
    # Each piece moves the weights by exactly -1 once its update is pushed: after a
    # SIGKILL with updates held and not pushed, the total is still one per piece.
    pieces = 3 * -(-600 // (2 * 16))
    zeros = [np.zeros((64, 4), np.float32), np.zeros(4, np.float32)]
    result = train(MODEL, hard_blobs_dataset, "downpour", workers=2, master_epochs=3,
                   batch_size=16, n_fetch=2, n_push=6, trainer_cls=ConstantDeltaSigkillOnce,
                   progress=False, initial_weights=zeros,
                   trainer_options=_kill_env(tmp_path, sleep=0.02, call=5))
    assert (tmp_path / "killed").exists() and len(_kinds(result, "trainer_lost")) == 1
    for w in result.weights:
        np.testing.assert_allclose(w, -pieces)


class _AbortAfterRows(Callback):
    def __init__(self, n):
        self.n, self.seen = n, 0

    def on_row(self, row, run):
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt("driver stopped")


@pytest.mark.parametrize("scheme,options", _ASYNC_KINDS, ids=["easgd", "downpour"])
def test_easgd_and_downpour_resume_to_the_last_epoch(train_cluster, tmp_path, scheme, options):
    common = dict(workers=2, master_epochs=4, batch_size=16, trainer_cls=NumpyTrainer,
                  progress=False, **options)
    with pytest.raises(KeyboardInterrupt):
        train(MODEL, hard_blobs_dataset, scheme, checkpoint_dir=str(tmp_path),
              callbacks=[_AbortAfterRows(2)], **common)
    ckpt = checkpoint.load(str(tmp_path))
    assert ckpt.meta["scheme"] == scheme and ckpt.round > 0
    if scheme == "easgd":   # each trainer's own weights are in the checkpoint
        assert sorted(ckpt.arrays) >= ["local0", "local1"]
    resumed = train(MODEL, hard_blobs_dataset, scheme, resume=str(tmp_path), **common)
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3, 4]
    assert sum(r["samples"] for r in resumed.history) == 4 * 600
    assert resumed.history[-1]["test_accuracy"] > 0.5


def test_downpour_resume_applies_every_piece_once(train_cluster, tmp_path):
    pieces = 4 * -(-600 // (2 * 16))
    zeros = [np.zeros((64, 4), np.float32), np.zeros(4, np.float32)]
    common = dict(workers=2, master_epochs=4, batch_size=16, n_fetch=2, n_push=6,
                  trainer_cls=ConstantDeltaTrainer, progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(MODEL, hard_blobs_dataset, "downpour", checkpoint_dir=str(tmp_path),
              initial_weights=zeros, callbacks=[_AbortAfterRows(2)], **common)
    resumed = train(MODEL, hard_blobs_dataset, "downpour", resume=str(tmp_path), **common)
    # Pieces trained but not pushed (or in flight) at the checkpoint were trained again.
    for w in resumed.weights:
        np.testing.assert_allclose(w, -pieces)
