"""train_allreduce: the trainers average among themselves; the driver sends indices.

One embedded 2-CPU cluster for the module; numpy trainers (seconds per test). Faults are
real SIGKILLs of a trainer's own process, while it trains or inside the ring.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers_modules.numpy_trainer import (
    DriftingTrainer,
    HangsInCollective,
    MomentumTrainer,
    NumpyTrainer,
    SigkillEveryTrainerOnce,
    SigkillInCollective,
    SigkillOnce,
    blobs,
    hard_blobs_dataset,
    momentum_model_fn,
    softmax_model_fn,
)
from helpers_modules.wire_meter import metering

from ddlf_actors.apps import TrainConfig, checkpoint, train_sync
from ddlf_actors.apps.callbacks import Callback
from ddlf_actors.apps.schemes import (
    AllreduceMachine,
    CollectiveError,
    Driver,
    WeightsLostError,
    split_options,
    train_allreduce,
)
from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

MODEL = softmax_model_fn(64, 4)


def _kill_env(tmp_path, sleep=0.05, **more):
    env = {"DDLF_TEST_KILL_DIR": str(tmp_path), "DDLF_TEST_FIT_SLEEP": str(sleep)}
    env.update({f"DDLF_TEST_KILL_{k.upper()}": str(v) for k, v in more.items()})
    return {"runtime_env": {"env_vars": env}}


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


# The defaults (Nesterov outer momentum, the K rule with its warm-up), a plain average,
# and heavy-ball momentum with the trainers' rate scaled instead.
SETTINGS = [{}, dict(outer_momentum=0.0, lr_scaling="none"),
            dict(outer_lr=0.7, outer_momentum=0.5, nesterov=False, lr_scaling="inner",
                 warmup_rounds=2)]


@pytest.mark.parametrize("k,settings", [(2, SETTINGS[0]), (3, SETTINGS[0]), (2, SETTINGS[1]),
                                        (3, SETTINGS[2])])
def test_same_result_as_sync(train_cluster, k, settings):
    common = dict(workers=k, num_cpus=0.5, master_epochs=2, rounds_per_epoch=2, seed=11,
                  eval_every=1, trainer_cls=NumpyTrainer, progress=False, **settings)
    ring = train_allreduce(MODEL, hard_blobs_dataset, **common)
    star = train_sync(MODEL, hard_blobs_dataset, **common)
    assert ring.scheme == "allreduce" and len(ring.history) == len(star.history) == 4
    for a, b in zip(ring.weights, star.weights):
        if k == 2:    # a + b == b + a: the ring sums in the driver's order
            np.testing.assert_array_equal(a, b)
        else:         # each chunk's sum starts at another member: rounding differs (and
            # the outer step, K times the rate with momentum, carries it into later rounds)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(ring.history, star.history):
        assert a["samples"] == b["samples"] and a["workers"] == b["workers"] == k
        # The same outer step and trainers' rate, round by round.
        assert a.get("outer_lr") == b.get("outer_lr")
        assert a.get("learning_rate") == b.get("learning_rate")
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.01)
        # Every trainer sent 2 (K-1)/K of the model to its neighbour.
        assert a["ring_bytes"] == 2 * (k - 1) * (64 * 4 + 4) * 4
    # The reported accuracy is that of the weights the result holds (fetched from a
    # trainer at the end), evaluated on the trainers.
    (_x, _y), (xt, yt) = hard_blobs_dataset()
    accuracy = float(np.mean(ring.model.probs(xt).argmax(axis=1) == yt))
    assert ring.history[-1]["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)


def _wide_blobs():
    return blobs(n_train=8000, n_test=200, num_classes=10, side=16)


WIDE_MODEL = softmax_model_fn(256, 10)


def _driver_bytes_per_round(train, trainers):
    """The driver's bytes on the wire per round: what 3 more rounds add to a run, over 3
    (start and end, the same in both runs, cancel out). Also the longer run's history."""
    totals = {}
    for epochs in (1, 4):
        with metering() as meter:
            result = train(WIDE_MODEL, _wide_blobs, trainers=trainers, master_epochs=epochs,
                           rounds_per_epoch=1, trainer_cls=NumpyTrainer, progress=False)
        totals[epochs] = meter.total
    return (totals[4] - totals[1]) / 3, result.history


def test_driver_bytes_per_round_do_not_grow_with_k(train_cluster):
    weights = (256 * 10 + 10) * 4          # 10 KB of model
    indices = 8000 * 4                     # 32 KB of indices per round, split among K
    # The same four trainers for every run: no start-up in between.
    trainers = start_trainers(WIDE_MODEL, _wide_blobs, TrainConfig(
        workers=4, num_cpus=0.5, trainer_cls=NumpyTrainer))
    try:
        wire = {}
        for k in (2, 3, 4):
            wire[k], history = _driver_bytes_per_round(train_allreduce, trainers[:k])
            # What the driver ships in a round is the indices, for any K ...
            assert [r["bytes_sent"] + r["bytes_received"] for r in history[1:]] == [indices] * 3
            # ... plus a kilobyte or two of control per trainer (its calls and their
            # replies: stats, status, the right neighbour's handle, whose pickle lists the
            # trainer class's methods): no weights, which are 10 KB a copy.
            assert indices < wire[k] < indices + k * 2500, wire
        # Each trainer the ring gains adds its control, well under a quarter of one
        # model copy: a driver that relayed weights would add two copies per trainer.
        # (A ratio of the totals would depend on how many indices a round ships.)
        assert (wire[4] - wire[2]) / 2 < weights / 4, wire
        # The same meter sees sync's star grow by two model copies per trainer.
        star = {k: _driver_bytes_per_round(train_sync, trainers[:k])[0] for k in (2, 4)}
        assert star[4] - star[2] > 2 * 2 * weights, star
    finally:
        stop_trainers(trainers)


def test_trainer_sigkilled_while_training_is_replaced(train_cluster, tmp_path):
    # min_workers=2: round 3 waits for the replacement, so it joins there, however long
    # it takes to start on a busy machine.
    result = train_allreduce(MODEL, hard_blobs_dataset, workers=2, min_workers=2,
                             master_epochs=3, rounds_per_epoch=2, trainer_cls=SigkillOnce,
                             batch_size=25,   # whole batches cut 600 rows into 150s
                             progress=False, trainer_options=_kill_env(tmp_path, slot=1, call=2))
    assert (tmp_path / "killed").exists()
    h = result.history
    assert [r["round"] for r in h] == list(range(1, 7))     # every round completed
    lost = _kinds(result, "trainer_lost")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and lost[0]["round"] == 2
    # The survivor's delta alone made round 2, for its own samples (as sync does).
    assert h[1]["workers"] == 1 and h[1]["samples"] == 150 and h[1]["ring_bytes"] == 0
    # The replacement copied the weights from trainer 0 and took part again: the driver
    # checks every round that all trainers hold the same weights (their CRCs agree).
    joined = _kinds(result, "trainer_joined")
    assert len(joined) == 1 and joined[0]["trainer"] == 1 and joined[0]["round"] == 3
    assert all(r["workers"] == 2 and r["ring_bytes"] > 0 for r in h[2:])
    assert h[-1]["test_accuracy"] > 0.5


def test_trainer_sigkilled_inside_the_ring_the_survivors_redo_it(train_cluster, tmp_path):
    config, options = split_options("allreduce", dict(
        workers=3, min_workers=3, num_cpus=0.5, master_epochs=3, rounds_per_epoch=2,
        batch_size=25,   # whole batches cut 600 rows into 100s
        trainer_cls=SigkillInCollective, progress=False,
        trainer_options=_kill_env(tmp_path, slot=1, round=2, sends=3)))
    driver = Driver(AllreduceMachine, MODEL, hard_blobs_dataset, config, options)
    result = driver.run()
    scheme = driver.machine
    assert (tmp_path / "killed").exists()
    h = result.history
    assert [r["round"] for r in h] == list(range(1, 7))
    lost = _kinds(result, "trainer_lost")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and lost[0]["round"] == 2
    # Round 2's first collective was called off: trainer 2 waited for a chunk trainer 1
    # never sent (trainer 0 usually finished first: it had all it needed). The two
    # survivors ran it again from the deltas they still held.
    first, again = [c for c in scheme.collectives if c["round"] == 2]
    assert first["ring"] == [0, 1, 2] and first["status"][1] == "lost"
    assert first["status"][2] in ("aborted", "peer_lost")
    assert again["ring"] == [0, 2] and again["status"] == {0: "done", 2: "done"}
    assert h[1]["workers"] == 2 and h[1]["samples"] == 200
    # The replacement joined at round 3 (min_workers=3 waits for it) with the weights
    # copied from a survivor, and the ring was whole again.
    joined = _kinds(result, "trainer_joined")
    assert len(joined) == 1 and joined[0]["trainer"] == 1 and joined[0]["round"] == 3
    assert all(r["workers"] == 3 for r in h[2:])
    assert [c["round"] for c in scheme.collectives] == [1, 2, 2, 3, 4, 5, 6]
    assert h[-1]["test_accuracy"] > 0.5


def test_a_silent_member_times_the_others_out_and_the_round_is_redone(train_cluster, tmp_path):
    env = _kill_env(tmp_path)
    env["runtime_env"]["env_vars"]["DDLF_TEST_HANG_S"] = "2"
    config, options = split_options("allreduce", dict(
        workers=3, num_cpus=0.5, master_epochs=2, rounds_per_epoch=2, chunk_timeout_s=0.5,
        trainer_cls=HangsInCollective, progress=False, trainer_options=env))
    driver = Driver(AllreduceMachine, MODEL, hard_blobs_dataset, config, options)
    result = driver.run()
    scheme = driver.machine
    assert (tmp_path / "hung").exists()
    first, again = [c for c in scheme.collectives if c["round"] == 2]
    # Trainers 2 and 0 waited for chunks that trainer 1 held up; the first to reach
    # 0.5 s gave up, and the driver called the collective off for the others. Trainer 1,
    # once awake, found it called off. Nobody was lost, so the same three ran it again.
    assert "timeout" in first["status"].values() and first["status"][1] == "aborted"
    assert again["ring"] == [0, 1, 2] and set(again["status"].values()) == {"done"}
    assert not _kinds(result, "trainer_lost")
    assert [r["workers"] for r in result.history] == [3, 3, 3, 3]


def test_every_trainer_lost_at_once_is_a_clear_error(train_cluster, tmp_path):
    with pytest.raises(WeightsLostError, match="every trainer holding the current weights") as e:
        train_allreduce(MODEL, hard_blobs_dataset, workers=2, master_epochs=3,
                        trainer_cls=SigkillEveryTrainerOnce, progress=False,
                        checkpoint_dir=str(tmp_path / "ckpt"),
                        trainer_options=_kill_env(tmp_path, call=2))
    assert "ckpt-00000001.npz" in str(e.value) and "resume=" in str(e.value)


def test_trainers_that_disagree_are_an_error_not_a_silent_drift(train_cluster):
    with pytest.raises(CollectiveError, match="hold different weights"):
        train_allreduce(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                        rounds_per_epoch=2, trainer_cls=DriftingTrainer, progress=False)


class _Abort(Callback):
    def __init__(self, n):
        self.n = n

    def on_row(self, row, run):
        if row["round"] == self.n:
            raise KeyboardInterrupt("driver stopped")


@pytest.mark.parametrize("trainer,model", [(NumpyTrainer, MODEL),
                                           (MomentumTrainer, momentum_model_fn(64, 4))])
def test_resume_is_continuous_and_bit_equal(train_cluster, tmp_path, trainer, model):
    # Every round evaluated, so row 3 (where the driver stops) comes after its checkpoint;
    # the default outer optimizer: its velocity, on the trainers, is checkpointed too.
    common = dict(workers=2, master_epochs=3, rounds_per_epoch=2, eval_every=1,
                  trainer_cls=trainer, progress=False, seed=5)
    whole = train_allreduce(model, hard_blobs_dataset, **common)
    with pytest.raises(KeyboardInterrupt):
        train_allreduce(model, hard_blobs_dataset, checkpoint_dir=str(tmp_path),
                        callbacks=[_Abort(3)], **common)
    saved = checkpoint.load(str(tmp_path))
    assert saved.round == 3 and saved.meta["scheme"] == "allreduce"
    assert sorted(saved.optimizer_states) == ([0, 1] if trainer is MomentumTrainer else [])
    resumed = train_allreduce(model, hard_blobs_dataset, resume=str(tmp_path), **common)
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    assert [e["kind"] for e in resumed.events].count("resumed") == 1
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)   # bit-equal, momentum state included
    for a, b in zip(whole.history, resumed.history):
        assert a["test_accuracy"] == b["test_accuracy"] and a["samples"] == b["samples"]
    # Each checkpoint fetched the weights and the outer velocity (the same shapes) from
    # one trainer; the run without checkpoints received no weights after its first round.
    model = sum(w.nbytes for w in whole.weights)
    assert [r["bytes_received"] for r in whole.history[1:]] == [0] * 5
    assert [r["bytes_received"] for r in resumed.history[1:]] == [2 * model] * 5
    assert [len(a) for a in saved.arrays["outer"]] == [len(w) for w in whole.weights]


def test_options_of_other_schemes_are_refused():
    with pytest.raises(ValueError, match="staleness_bound= does not apply to the 'allreduce'"):
        train_allreduce(MODEL, hard_blobs_dataset, staleness_bound=2)
    with pytest.raises(TypeError, match="train_allreduce.*'worker'"):
        train_allreduce(MODEL, hard_blobs_dataset, worker=2)
