"""Slow nodes in train_sync: backup workers (late deltas folded in later) and balance.

No timings are asserted. The straggler is ``GatedTrainer``'s slot 0, whose first delta
comes back only when the test opens a gate (after the first row), so which round it is
late for is decided by the test; balance runs on ``VirtualSpeedTrainer``, whose
reported compute time is exactly proportional to its samples.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers_modules.numpy_trainer import (
    GatedTrainer,
    NumpyTrainer,
    SlowEvalTrainer,
    SlowOneTrainer,
    VirtualSpeedTrainer,
    hard_blobs_dataset,
    softmax_model_fn,
)
from helpers_modules.util import wait_for

from ddlf_actors.apps import checkpoint, train, train_async, train_sync
from ddlf_actors.apps.callbacks import Callback
from ddlf_actors.apps.config import TrainConfig
from ddlf_actors.apps.schemes.balance import RateBalancer
from ddlf_actors.apps.schemes.plan import Plan
from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers
from ddlf_actors.runtime.client.current import get_core
from ddlf_actors.runtime.head import runs

MODEL = softmax_model_fn(64, 4)
# Plain averaging, every round evaluated (sync's defaults are Nesterov outer momentum and
# one evaluation per epoch): the tests check late deltas and partitions by their arithmetic.
# Batches of 10: the rounds' chunks (600 rows in 2 or 3 rounds) and their shares are whole
# batches, so the sample counts below are the even splits (plan.split_shares cuts in batches).
PLAIN = dict(outer_momentum=0.0, lr_scaling="none", eval_every=1, batch_size=10)
N_TRAIN = 600   # hard_blobs_dataset


class _OpenGate(Callback):
    """Lets slot 0's first delta return once row ``after`` is reported. With ``kill``
    (GatedTrainer then dies instead), holds the driver until the head knows the trainer
    is dead, so that the next round notices the loss."""

    def __init__(self, gate, after=1, kill=None):
        self.gate, self.after, self.kill = str(gate), after, kill
        self.dead = self._dead() if kill else 0

    @staticmethod
    def _dead():
        actors = get_core().head_call("list_actors")
        return sum(1 for a in actors if a.get("class_name") == "GatedTrainer"
                   and a.get("state") == "DEAD")

    def on_row(self, row, run):
        if row["round"] < self.after or os.path.exists(os.path.join(self.gate, "open")):
            return
        open(os.path.join(self.gate, "open"), "w").close()
        if self.kill:
            wait_for(lambda: self._dead() > self.dead, timeout=30)


def _env(**env):
    return {"runtime_env": {"env_vars": {k: str(v) for k, v in env.items()}}}


def _zeros():
    return [np.zeros_like(w) for w in MODEL().get_weights()]


def test_backup_worker_closes_rounds_and_folds_the_late_delta_in(train_cluster, tmp_path):
    result = train_sync(MODEL, hard_blobs_dataset, **PLAIN, workers=2, backup_workers=1,
                        master_epochs=2, rounds_per_epoch=2, trainer_cls=GatedTrainer,
                        progress=False, initial_weights=_zeros(),
                        callbacks=[_OpenGate(tmp_path)],
                        trainer_options=_env(DDLF_TEST_GATE_DIR=tmp_path))
    h = result.history
    assert [r["round"] for r in h] == [1, 2, 3, 4]
    # Round 1 closed with trainer 1 alone: trainer 0 was held at the gate.
    assert h[0]["workers"] == 1 and h[0]["late"] == 0 and h[0]["samples"] == 150
    # Trainer 0 got no new work while late; its delta came in later, stale.
    ups = result.updates
    first0 = [u for u in ups if u["trainer"] == 0][0]
    assert first0["start_version"] == 0 and first0["staleness"] >= 1
    assert h[first0["applied_version"] - 1]["late"] >= 1
    # A round that closes without one of two trainers leaves it late (when not the last).
    assert sum(r["late"] for r in h) == sum(1 for u in ups if u["staleness"] > 0)
    for r in h[1:first0["applied_version"]]:
        assert r["trainer_samples"][0] == 0 and r["trainer_samples"][1] == 300
    # Nothing thrown away: every sample of both epochs is in some applied delta.
    assert sum(u["samples"] for u in ups) == 2 * N_TRAIN == sum(r["samples"] for r in h)
    # The weights: each round subtracts the mean of its deltas (slot j's delta is j + 1
    # everywhere), a late one weighted by samples / (1 + staleness).
    expected = 0.0
    for v in range(1, len(h) + 1):
        rows = [u for u in ups if u["applied_version"] == v]
        assert all(u["staleness"] == v - 1 - u["start_version"] for u in rows)
        m = [u["samples"] / (1 + u["staleness"]) for u in rows]
        expected += sum(mi * (u["trainer"] + 1) for mi, u in zip(m, rows)) / sum(m)
    for w in result.weights:
        np.testing.assert_allclose(w, -expected, rtol=1e-5)
    assert abs(expected - 2.0 * len(h)) > 1e-3   # not what ignoring trainer 0 would give
    # Compute is attributed by interval: no row's overhead is negative.
    assert all(r["overhead_s"] >= 0 for r in h)
    assert all(r["compute_s"] <= r["wall_s"] for r in h)


def test_trainer_lost_while_late_is_replaced_and_the_run_goes_on(train_cluster, tmp_path):
    gate, kill = tmp_path / "gate", tmp_path / "kill"
    gate.mkdir()
    kill.mkdir()
    # min_workers=2: the round after the loss waits for the replacement.
    result = train_sync(MODEL, hard_blobs_dataset, **PLAIN, workers=2, min_workers=2, backup_workers=1,
                        master_epochs=3, rounds_per_epoch=2, trainer_cls=GatedTrainer,
                        progress=False, initial_weights=_zeros(),
                        callbacks=[_OpenGate(gate, kill=True)],
                        trainer_options=_env(DDLF_TEST_GATE_DIR=gate, DDLF_TEST_KILL_DIR=kill))
    assert (kill / "killed").exists()
    h = result.history
    assert [r["round"] for r in h] == [1, 2, 3, 4, 5, 6]
    lost = [e for e in result.events if e["kind"] == "trainer_lost"]
    joined = [e for e in result.events if e["kind"] == "trainer_joined"]
    assert [e["trainer"] for e in lost] == [0] and [e["trainer"] for e in joined] == [0]
    # The late delta died with its trainer: its 150 samples are the only ones missing ...
    assert sum(r["samples"] for r in h) == 3 * N_TRAIN - 150
    assert not [u for u in result.updates if u["trainer"] == 0 and u["start_version"] == 0]
    # ... and the replacement trained again before the end.
    assert any(u["trainer"] == 0 for u in result.updates)
    assert any(r["trainer_samples"][0] > 0 for r in h if r["round"] > lost[0]["round"])


def test_balance_gives_the_slow_trainer_fewer_samples(train_cluster):
    result = train_sync(MODEL, hard_blobs_dataset, **PLAIN, workers=2, balance=True, master_epochs=2,
                        rounds_per_epoch=2, trainer_cls=VirtualSpeedTrainer, progress=False,
                        trainer_options=_env(DDLF_TEST_SLOW_FACTOR=4))
    sizes = [r["trainer_samples"] for r in result.history]
    assert sizes[0] == [150, 150]        # nothing measured yet: even
    for s in sizes[1:]:                  # trainer 0 is 4x slower: a fifth of each chunk
        assert s == [round(300 / 5), 300 - round(300 / 5)]
    assert all(r["samples"] == 300 for r in result.history)
    assert result.history[-1]["test_accuracy"] > 0.5
    # Every row, its per-trainer list included, is one the head's dashboard accepts (the
    # DashboardPublisher sends them as they come; a refused row stops its publishing).
    for row in result.history:
        assert runs.check({"run_id": "r", "rows": [row]})["rows"][0]["trainer_samples"] == \
            row["trainer_samples"]


def test_balance_follows_real_speeds(train_cluster):
    result = train_sync(MODEL, hard_blobs_dataset, **PLAIN, workers=2, balance=True, master_epochs=1,
                        rounds_per_epoch=3, trainer_cls=SlowOneTrainer, progress=False,
                        trainer_options=_env(DDLF_TEST_SLOW_FACTOR=8))
    sizes = [r["trainer_samples"] for r in result.history]
    assert sizes[0] == [100, 100]
    assert all(s[0] < s[1] for s in sizes[1:])


class _Abort(Callback):
    def __init__(self, n):
        self.n = n

    def on_row(self, row, run):
        if row["round"] == self.n:
            raise KeyboardInterrupt("driver stopped")


def test_balanced_run_resumes_bit_equal(train_cluster, tmp_path):
    common = dict(workers=2, master_epochs=3, rounds_per_epoch=2, balance=True,
                  trainer_cls=VirtualSpeedTrainer, progress=False, seed=3,
                  trainer_options=_env(DDLF_TEST_SLOW_FACTOR=3))
    whole = train_sync(MODEL, hard_blobs_dataset, **PLAIN, **common)
    with pytest.raises(KeyboardInterrupt):
        train_sync(MODEL, hard_blobs_dataset, **PLAIN, checkpoint_dir=str(tmp_path),
                   callbacks=[_Abort(3)], **common)
    ckpt = checkpoint.load(str(tmp_path))
    assert ckpt.round == 3 and set(ckpt.meta["position"]["rates"]) == {"0", "1"}
    resumed = train_sync(MODEL, hard_blobs_dataset, **PLAIN, resume=str(tmp_path), **common)
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    assert ([r["trainer_samples"] for r in resumed.history]
            == [r["trainer_samples"] for r in whole.history])
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)


def test_options_are_checked_and_async_refuses_them():
    from ddlf_actors.apps.config import ConfigError
    from ddlf_actors.apps.schemes import resolve_options

    for bad in (dict(backup_workers=2), dict(backup_workers=-1), dict(backup_workers=True),
                dict(balance=1)):
        with pytest.raises(ConfigError) as e:
            resolve_options("sync", workers=2, **bad)
        assert e.value.option == next(iter(bad))
    with pytest.raises(ValueError, match="backup_workers= does not apply to the 'async' "
                                         "scheme; it is read by 'sync'"):
        train_async(MODEL, hard_blobs_dataset, trainer_cls=NumpyTrainer, backup_workers=1)
    with pytest.raises(ValueError, match="balance= does not apply to the 'async' scheme"):
        train_async(MODEL, hard_blobs_dataset, trainer_cls=NumpyTrainer, balance=True)
    with pytest.raises(ValueError, match="balance= does not apply to the 'allreduce' scheme"):
        train(MODEL, hard_blobs_dataset, "allreduce", trainer_cls=NumpyTrainer, balance=True)


def test_rate_shares_and_plan_are_a_function_of_the_rates():
    b = RateBalancer()
    assert b.shares([0, 1, 2]) == [1.0, 1.0, 1.0]
    b.observe(0, 100, 1.0)
    b.observe(1, 100, 0.5)
    assert b.shares([0, 1, 2]) == [100.0, 200.0, 150.0]   # unmeasured: the mean
    b.observe(0, 100, 0.5)                                 # EMA: halfway to 200
    assert b.rates[0] == 150.0
    b.forget(1)
    assert b.shares([0, 1]) == [150.0, 150.0]
    again = RateBalancer.from_json(b.to_json())
    plan = Plan(1, 2, 1000)
    assert (plan.round_pieces(1, 0, [0, 1, 2], again.shares([0, 1, 2]))[0].tolist()
            == plan.round_pieces(1, 0, [0, 1, 2], b.shares([0, 1, 2]))[0].tolist())
    b.observe(2, 100, 100.0)   # very slow, but keeps a minimum share to be measured on
    assert min(b.shares([0, 2])) > 0


def test_no_row_counts_work_from_before_it(train_cluster):
    # Trainers kept between runs (as App does) report the previous run's last evaluation
    # with their first train call of the next run: it must not count in that run's rows.
    config = TrainConfig(workers=2, trainer_cls=SlowEvalTrainer, progress=False)
    trainers = start_trainers(MODEL, hard_blobs_dataset, config)
    try:
        for _ in range(2):
            result = train_sync(MODEL, hard_blobs_dataset, **PLAIN, trainers=trainers, workers=2,
                                trainer_cls=SlowEvalTrainer, master_epochs=2, progress=False)
            for row in result.history:
                assert row["overhead_s"] >= 0, row
                assert row["compute_s"] <= row["wall_s"] and row["eval_s"] <= row["wall_s"], row
    finally:
        stop_trainers(trainers)


def test_backup_workers_and_balance_together_train_every_sample(train_cluster):
    result = train_sync(MODEL, hard_blobs_dataset, **PLAIN, workers=2, backup_workers=1, balance=True,
                        master_epochs=2, rounds_per_epoch=3, trainer_cls=SlowOneTrainer,
                        progress=False, trainer_options=_env(DDLF_TEST_SLOW_FACTOR=8))
    h = result.history
    assert sum(r["samples"] for r in h) == 2 * N_TRAIN == sum(u["samples"] for u in result.updates)
    both = [r["trainer_samples"] for r in h[1:] if min(r["trainer_samples"]) > 0]
    assert all(s[0] < s[1] for s in both)
    assert all(r["overhead_s"] >= 0 for r in h)


def test_checkpoint_lists_late_calls_and_resume_goes_on_without_them(train_cluster, tmp_path):
    gate, ckpt_dir = tmp_path / "gate", tmp_path / "ckpt"
    gate.mkdir()
    common = dict(workers=2, backup_workers=1, master_epochs=2, rounds_per_epoch=2,
                  trainer_cls=GatedTrainer, progress=False,
                  trainer_options=_env(DDLF_TEST_GATE_DIR=gate))
    with pytest.raises(KeyboardInterrupt):   # trainer 0 is still at its gate: late
        train_sync(MODEL, hard_blobs_dataset, **PLAIN, checkpoint_dir=str(ckpt_dir),
                   callbacks=[_Abort(1)], **common)
    ckpt = checkpoint.load(str(ckpt_dir))
    assert ckpt.round == 1
    assert ckpt.meta["position"]["late"] == [{"trainer": 0, "round": 1, "samples": 150}]
    resumed = train_sync(MODEL, hard_blobs_dataset, **PLAIN, resume=str(ckpt_dir),
                         callbacks=[_OpenGate(gate)], **common)
    h = resumed.history
    assert [r["round"] for r in h] == [1, 2, 3, 4]
    # The late call's 150 samples were not in the checkpoint; everything after was trained.
    assert sum(r["samples"] for r in h) == 2 * N_TRAIN - 150
    assert all(r["overhead_s"] >= 0 for r in h)
