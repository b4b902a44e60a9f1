"""The schemes behind ``train(..., scheme=...)`` with the numpy trainer: EASGD, Downpour,
sync's outer optimizer and learning-rate schedules, and the rows' time accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers_modules.numpy_trainer import (
    ConstantDeltaTrainer,
    NumpyTrainer,
    RateEchoTrainer,
    SlowFirstTrainer,
    hard_blobs_dataset,
    softmax_model_fn,
)

from ddlf_actors.apps import train, train_async, train_sync

MODEL = softmax_model_fn(64, 4)
N_TRAIN = 600     # hard_blobs_dataset


def _zeros():
    return [np.zeros((64, 4), np.float32), np.zeros(4, np.float32)]


@pytest.mark.parametrize("scheme,options", [
    ("easgd", dict(tau=4)),
    ("downpour", dict(n_fetch=2, n_push=4)),
    ("sync", dict(outer_momentum=0.5, nesterov=True, rounds_per_epoch=2)),
    ("allreduce", dict(outer_momentum=0.5, nesterov=True, rounds_per_epoch=2)),
    ("async", dict()),
])
def test_every_scheme_learns_through_train(train_cluster, scheme, options):
    result = train(MODEL, hard_blobs_dataset, scheme, workers=2, master_epochs=3,
                   batch_size=16, trainer_cls=NumpyTrainer, progress=False, **options)
    assert result.scheme == scheme
    h = result.history
    assert math.ceil(h[-1]["epoch"]) == 3 and h[-1]["test_accuracy"] > 0.5   # chance 0.25
    assert h[-1]["train_loss"] < h[0]["train_loss"]
    assert sum(r["samples"] for r in h) == 3 * N_TRAIN     # each sample once per epoch


@pytest.mark.parametrize("n_fetch,n_push", [(2, 4), (4, 2)])
def test_downpour_applies_every_pieces_update_once_at_full_rate(train_cluster, n_fetch, n_push):
    # ConstantDeltaTrainer moves its weights by -1 per call: a piece of min(n_fetch, n_push)
    # steps. Every piece's update must reach the weights exactly once, unscaled.
    batch = 16
    pieces = 3 * math.ceil(N_TRAIN / (min(n_fetch, n_push) * batch))
    result = train(MODEL, hard_blobs_dataset, "downpour", workers=2, master_epochs=3,
                   batch_size=batch, n_fetch=n_fetch, n_push=n_push, progress=False,
                   trainer_cls=ConstantDeltaTrainer, initial_weights=_zeros())
    for w in result.weights:
        np.testing.assert_allclose(w, -pieces)
    pushes = len(result.updates)
    per_push = max(1, n_push // n_fetch)
    # A trainer pushes every n_push steps, and once more with what it holds at the end.
    assert pieces / per_push <= pushes <= pieces / per_push + 2
    weights_bytes = sum(w.nbytes for w in _zeros())
    assert sum(r["bytes_received"] for r in result.history) == pushes * weights_bytes
    # Fetches follow n_fetch: bytes sent are fetches of the weights plus the indices
    # (and the evaluations' weights, one per trainer and row).
    fetches_max = pieces / max(1, n_fetch // n_push) + 2 + 2 * (3 + 1)
    assert sum(r["bytes_sent"] for r in result.history) < (fetches_max + 1) * weights_bytes + \
        3 * N_TRAIN * 4


def test_easgd_center_follows_the_elastic_rule(train_cluster):
    alpha = 0.3
    result = train(MODEL, hard_blobs_dataset, "easgd", workers=2, master_epochs=2,
                   batch_size=16, tau=8, alpha=alpha, trainer_cls=ConstantDeltaTrainer,
                   progress=False, initial_weights=_zeros())
    # Replay the exchanges in the order the driver applied them: each call moved its
    # trainer's own weights by -1 from what the driver last sent it.
    center, local = 0.0, {}
    for u in result.updates:
        x = local.get(u["trainer"], 0.0) - 1.0
        e = alpha * (x - center)
        center, local[u["trainer"]] = center + e, x - e
    assert len(result.updates) == 2 * math.ceil(N_TRAIN / (8 * 16))
    for w in result.weights:
        np.testing.assert_allclose(w, center, rtol=1e-5)
    assert len(set(local)) == 2


def test_sync_outer_nesterov_with_the_k_rule_and_warm_up(train_cluster):
    # Every delta is all ones, so the averaged delta is 1 in every round and the weights
    # follow the outer optimizer's formula alone.
    mu, lr, warm, rounds = 0.5, 0.8, 3, 6
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=3,
                        rounds_per_epoch=2, outer_lr=lr, outer_momentum=mu, nesterov=True,
                        lr_scaling="outer", warmup_rounds=warm, progress=False,
                        trainer_cls=ConstantDeltaTrainer, initial_weights=_zeros())
    w, v, rates = 0.0, 0.0, []
    for t in range(rounds):
        rate = lr * (1 + (2 - 1) * min(t, warm) / warm)
        v = mu * v + 1.0
        w -= rate * (1.0 + mu * v)
        rates.append(rate)
    for a in result.weights:
        np.testing.assert_allclose(a, w, rtol=1e-5)
    assert [r["outer_lr"] for r in result.history] == pytest.approx(rates)


@pytest.mark.parametrize("scheme", ["sync", "allreduce", "async", "downpour"])
def test_a_learning_rate_schedule_reaches_the_trainers(train_cluster, scheme):
    def schedule(step):
        return 0.5 / (1 + step)

    options = {"sync": dict(rounds_per_epoch=3), "allreduce": dict(rounds_per_epoch=3),
               "async": dict(rounds_per_epoch=3), "downpour": dict(n_fetch=2, n_push=2)}[scheme]
    result = train(MODEL, hard_blobs_dataset, scheme, workers=2, master_epochs=2,
                   batch_size=20, lr_schedule=schedule, trainer_cls=RateEchoTrainer,
                   progress=False, **options)
    losses = [r["train_loss"] for r in result.history]    # the rate each trainer used
    assert all(0 < x <= 0.5 for x in losses)
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    if scheme in ("sync", "allreduce"):
        # Round t starts at step t * (steps per trainer per round) = t * 5 here
        # (600 samples / 3 rounds / 2 trainers / batch 20).
        for t, row in enumerate(result.history):
            assert row["learning_rate"] == pytest.approx(schedule(5 * t))
            assert row["train_loss"] == pytest.approx(schedule(5 * t))


def test_the_inner_k_rule_scales_the_trainers_own_rate(train_cluster):
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                        rounds_per_epoch=2, lr_scaling="inner", warmup_rounds=2,
                        trainer_cls=RateEchoTrainer, progress=False)
    base = MODEL().lr   # the numpy model's own rate, reported by the trainers
    assert [r["learning_rate"] for r in result.history] == pytest.approx(
        [base, 1.5 * base, 2 * base, 2 * base])


def test_the_square_root_rule_scales_the_trainers_rate_by_the_root_of_k(train_cluster):
    # docs/training.md: lr_scaling="sqrt" sets the trainers' rate to sqrt(K) times their
    # own from the first round (no warm-up unless one is given); the outer step stays.
    result = train(MODEL, hard_blobs_dataset, "allreduce", workers=2, master_epochs=2,
                   rounds_per_epoch=2, lr_scaling="sqrt", trainer_cls=RateEchoTrainer,
                   progress=False)
    base = MODEL().lr
    assert [r["learning_rate"] for r in result.history] == pytest.approx(
        [2 ** 0.5 * base] * 4)
    assert result.settings["options"]["outer_lr"] == 0.7


@pytest.mark.parametrize("scheme,options", [
    ("async", dict(rounds_per_epoch=4)),
    ("downpour", dict(n_fetch=2, n_push=2)),
    ("easgd", dict(tau=2)),
    ("sync", dict(rounds_per_epoch=1)),
    ("allreduce", dict(rounds_per_epoch=1)),
])
def test_no_row_has_negative_overhead(train_cluster, scheme, options):
    # Trainer 0 is 8x slower, so calls straddle epoch ends all the time.
    result = train(MODEL, hard_blobs_dataset, scheme, workers=2, master_epochs=4,
                   batch_size=16, trainer_cls=SlowFirstTrainer, progress=False, **options)
    assert len(result.history) == 4
    for row in result.history:
        assert row["overhead_s"] >= 0, row
        assert row["compute_s"] <= row["wall_s"] and row["eval_s"] <= row["wall_s"], row
    assert sum(r["compute_s"] for r in result.history) <= result.history[-1]["time_s"]


def test_train_refuses_an_unknown_scheme_and_a_setting_it_does_not_read(train_cluster):
    with pytest.raises(ValueError, match="unknown scheme 'elastic'.*easgd"):
        train(MODEL, hard_blobs_dataset, "elastic", trainer_cls=NumpyTrainer)
    with pytest.raises(ValueError, match="n_push= does not apply to the 'async' scheme"):
        train_async(MODEL, hard_blobs_dataset, n_push=4, trainer_cls=NumpyTrainer)
    with pytest.raises(TypeError, match="unknown option 'taus'; did you mean 'tau'"):
        train(MODEL, hard_blobs_dataset, "easgd", taus=4, trainer_cls=NumpyTrainer)


def test_sync_evaluates_every_eval_every_rounds_and_the_last(train_cluster):
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                        rounds_per_epoch=4, eval_every=3, trainer_cls=NumpyTrainer,
                        progress=False)
    evaluated = [r["round"] for r in result.history if r["test_accuracy"] is not None]
    assert [r["round"] for r in result.history] == list(range(1, 9))   # rows stay in order
    assert evaluated == [3, 6, 8]
    assert sum(r["eval_s"] > 0 for r in result.history) == 2    # 8's ran after the last round


def test_sync_defaults_to_rounds_of_about_16_local_steps_each(train_cluster):
    from ddlf_actors.apps.schemes.rounds import STEPS_PER_ROUND, default_rounds

    assert STEPS_PER_ROUND == 16
    assert default_rounds(30000, 32) == 59 and default_rounds(100, 32) == 1
    assert default_rounds(30000, 32, steps=32) == 29
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=1,
                        batch_size=2, trainer_cls=NumpyTrainer, progress=False)
    # 600 samples, 2 trainers, batch 2: 150 steps each per epoch, about 16 per round.
    assert result.options.rounds_per_epoch == 9 == len(result.history)
    assert result.options.eval_every == 9
    assert [r["test_accuracy"] is not None for r in result.history] == [False] * 8 + [True]


@pytest.mark.parametrize("scheme", ["sync", "allreduce", "async", "easgd", "downpour"])
def test_every_scheme_stops_at_target_accuracy(train_cluster, scheme):
    result = train(MODEL, hard_blobs_dataset, scheme, workers=2, master_epochs=30,
                   batch_size=16, target_accuracy=0.5, trainer_cls=NumpyTrainer,
                   progress=False)
    evaluated = [r for r in result.history if r["test_accuracy"] is not None]
    assert evaluated[-1]["test_accuracy"] >= 0.5 and "target" in result.stopped_early
    # It stopped at the first evaluation that reached it, long before the 30 epochs.
    assert all(r["test_accuracy"] < 0.5 for r in evaluated[:-1])
    assert result.history[-1]["epoch"] < 30
