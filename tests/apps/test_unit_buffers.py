"""Buffers are values, never gradients (apps/schemes/averaging.py, outer.py).

BatchNorm's running mean and variance (and PyTorch's ``num_batches_tracked``) are set by
the model while it trains. A scheme that steps them like weights (a stale delta in
``async``, the outer Nesterov step of ``sync``) drove every running variance of a model
negative. Here: the arithmetic on its own, then a tiny BatchNorm model, PyTorch and
Keras, through every scheme on the in-process fake backend: running variances stay
>= 0, and counters advance by what the trainers ran.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers_modules.numpy_trainer import hard_blobs_dataset
from helpers_modules.torch_trainer import Sgd, TinyTorch, TorchTrainer, running_stats

from ddlf_actors.apps import train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.schemes.averaging import (
    ValueBuffers,
    apply_delta,
    buffer_mask,
    elastic_exchange,
    like_layers,
    ring_layers,
    weighted_mean,
)
from ddlf_actors.apps.schemes.outer import OuterOptimizer, apply_outer

MASK = [False, True, True]   # a weight, a running variance, a counter


def _w(weight, var, count):
    return [np.array([weight], np.float32), np.array([var], np.float32),
            np.array(count, np.int64)]


# -- the arithmetic --------------------------------------------------------------------------
def test_an_outer_step_sets_buffers_to_the_mean_of_the_trainers_values():
    """Nesterov at 0.5·K with momentum: weights take the amplified step, buffers the plain
    mean (the velocity of a buffer stays zero)."""
    w = _w(1.0, 0.5, 10)
    # Two trainers started from w; one reached var 0.1, the other 0.3 (and ran 3 batches).
    deltas = [[np.array([0.2], np.float32), np.array([0.4], np.float32), np.array(-3)],
              [np.array([0.4], np.float32), np.array([0.2], np.float32), np.array(-3)]]
    mean = weighted_mean(deltas, [1, 1])
    outer = OuterOptimizer(0.5, momentum=0.9, nesterov=True, scale_with_k=True)
    for _ in range(5):   # momentum builds up over rounds of the same mean
        new = outer.step(w, mean, 2, MASK)
    assert new[1][0] == pytest.approx(0.2) and new[2] == 13
    assert new[0][0] < 1.0 - 0.3 * 2      # the weight's step is amplified
    assert not outer.velocity[1].any() and not outer.velocity[2].any()
    # Without the mask, the same step drives the variance negative: why buffers skip it.
    assert OuterOptimizer(0.5, momentum=0.9, nesterov=True, scale_with_k=True).step(
        w, mean, 2)[1][0] < 0


def test_allreduce_and_sync_take_the_same_outer_step():
    w = _w(1.0, 0.5, 10)
    mean = [np.array([0.3], np.float32), np.array([0.3], np.float32), np.array(-3)]
    outer = OuterOptimizer(0.5, momentum=0.9, nesterov=True, scale_with_k=True)
    velocity = None
    ours = w
    for _ in range(3):
        settings = outer.remote_settings(2)
        expected = outer.step(w, mean, 2, MASK)
        ours, velocity = apply_outer(w, mean, velocity, settings, MASK)
        for a, b in zip(ours, expected):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_an_asynchronous_buffer_moves_toward_the_value_reached_never_past_it():
    values = ValueBuffers({"buffers": MASK})
    w = _w(1.0, 0.5, 10)
    values.started(0, w)                 # trainer 0 starts from var 0.5, count 10
    values.started(1, w)
    # Trainer 1's update lands first and moves var to 0.05.
    w = values.apply(w, [np.array([0.0], np.float32), np.array([0.45], np.float32),
                         np.array(-4)], 1.0, 1)
    assert w[1][0] == pytest.approx(0.05, abs=1e-6) and w[2] == 14
    # Trainer 0 reached var 0.1 from 0.5 (delta 0.4), 4 batches: its delta, applied as a
    # step at 1/K to today's 0.05, would give -0.15; as a value it gives 0.075.
    delta = [np.array([0.2], np.float32), np.array([0.4], np.float32), np.array(-4)]
    assert apply_delta(w, delta, 0.5)[1][0] < 0
    w = values.apply(w, delta, 0.5, 0)
    assert w[1][0] == pytest.approx(0.075) and w[0][0] == pytest.approx(0.9)
    assert w[2].dtype == np.int64 and w[2] == 14   # halfway from 14 to 14
    # What it reached is where its next call starts when it does not fetch (Downpour).
    assert values.starts[0][0][0] == pytest.approx(0.1)


def test_buffer_scale_differs_from_the_weights_scale():
    values = ValueBuffers({"buffers": MASK})
    w = _w(1.0, 1.0, 0)
    values.started(0, w)
    out = values.apply(w, [np.array([0.5], np.float32), np.array([0.5], np.float32),
                           np.array(-8)], 1.0, 0, buffer_scale=0.25)
    assert out[0][0] == pytest.approx(0.5)       # Downpour: the weight at full rate
    assert out[1][0] == pytest.approx(0.875)     # the buffer a quarter of the way
    assert out[2] == 2


def test_without_buffers_the_arithmetic_is_what_it_was():
    w = [np.array([1.0, 2.0], np.float32)]
    values = ValueBuffers({})
    values.started(0, w)
    d = [np.array([0.5, 0.5], np.float32)]
    for a, b in zip(values.apply(w, d, 0.5, 0), apply_delta(w, d, 0.5)):
        assert a.tobytes() == b.tobytes()
    assert buffer_mask({}) == [] and buffer_mask({"buffers": [0, 1]}, 2) == [False, True]
    with pytest.raises(ValueError):
        buffer_mask({"buffers": [True]}, 3)


def test_easgd_moves_an_integer_counter():
    center = [np.array([0.0], np.float32), np.array(10, np.int64)]
    local = [np.array([1.0], np.float32), np.array(30, np.int64)]
    c, x = elastic_exchange(center, local, 0.45)
    assert c[1] == 19 and x[1] == 21 and c[1].dtype == np.int64   # rint(0.45 * 20) = 9
    assert c[0][0] == pytest.approx(0.45) and x[0][0] == pytest.approx(0.55)


def test_a_ring_sums_counters_in_float64_and_rounds_them_back():
    delta = [np.array([0.5], np.float32), np.array(-29, np.int64)]
    layers = ring_layers(delta)
    assert layers[0] is delta[0] and layers[1].dtype == np.float64
    summed = [layers[0] * np.float32(0.5) * 2, layers[1] * 0.5 + np.float64(-28) * 0.5]
    back = like_layers(summed, delta)
    assert back[1].dtype == np.int64 and back[1] == -28   # -28.5: half to even
    assert back[0].dtype == np.float32


# -- a BatchNorm model through every scheme ----------------------------------------------------
SCHEMES = ["sync", "async", "allreduce", "downpour", "easgd"]


def small_blobs():
    """The numpy model's task at 1/20 of the scale: the inputs' variance (~0.04) is far
    below a running variance's initial 1, so running variances fall a long way, and a
    step that overshoots (outer momentum, a stale delta) takes them below 0."""
    (x, y), (xt, yt) = hard_blobs_dataset()
    return (x * 0.05, y), (xt * 0.05, yt)
RUN = dict(workers=2, master_epochs=2, seed=3, progress=False)


def _rounds_expected(history, batch):
    """A sync or allreduce run's counter: each round adds the mean, weighted by samples,
    of the batches each trainer ran (rounded)."""
    total = 0
    for row in history:
        # sync lists each trainer's samples; allreduce's rounds are split evenly
        n = [s for s in row.get("trainer_samples") or () if s] or [
            len(p) for p in np.array_split(np.arange(row["samples"]), row["workers"])]
        total += int(np.rint(sum(math.ceil(s / batch) * s for s in n) / sum(n)))
    return total


@pytest.mark.parametrize("scheme", SCHEMES)
def test_torch_batchnorm_statistics_stay_values_in_every_scheme(scheme):
    pytest.importorskip("torch")
    options = {"rounds_per_epoch": 3} if scheme in ("sync", "allreduce") else {}
    result = train(TinyTorch(batchnorm=True), small_blobs, scheme,
                   trainer_cls=TorchTrainer, backend=FakeBackend(), optimizer=Sgd(0.1),
                   batch_size=32, **RUN, **options)
    assert result.framework == "torch"
    model = result.model
    mask = [name in dict(model.named_buffers()) for name in model.state_dict()]
    stats = running_stats(result.weights, mask)
    (var,), (mean,), (count,) = stats["var"], stats["mean"], stats["count"]
    assert (var > 0.005).all() and (var < 1).all(), var   # the data's variance is ~0.04
    assert np.abs(mean).max() > 0.002                     # moved from zeros
    assert count.dtype == np.int64 and count > 0
    ran = sum(math.ceil(u) for u in [600 / 32]) * RUN["master_epochs"]
    # A trainer runs about half the batches of an epoch: the count is one trainer's.
    assert count <= 2 * ran
    if scheme in ("sync", "allreduce"):
        assert int(count) == _rounds_expected(result.history, 32)
    assert result.history[-1]["test_accuracy"] > 0.5


@pytest.mark.parametrize("scheme", SCHEMES)
def test_keras_batchnorm_statistics_stay_values_in_every_scheme(scheme):
    from helpers_modules.keras_defs import bn_model_fn

    pytest.importorskip("keras")
    options = {"rounds_per_epoch": 3} if scheme in ("sync", "allreduce") else {}
    result = train(bn_model_fn, small_blobs, scheme, backend=FakeBackend(),
                   batch_size=32, **RUN, **options)
    assert result.framework == "keras"
    mask = [not v.trainable for v in result.model.weights]
    assert sum(mask) == 2    # moving mean and moving variance
    stats = running_stats(result.weights, mask)
    (var,), (mean,) = stats["var"], stats["mean"]
    assert (var > 0.005).all() and (var < 1).all(), var
    assert np.abs(mean).max() > 0.002


@pytest.mark.parametrize("scheme", ["sync", "allreduce"])
@pytest.mark.parametrize("extra", [dict(overlap=True), dict(fragments=2),
                                   dict(overlap=True, fragments=2, compression="int8:ef")])
def test_torch_batchnorm_statistics_stay_values_in_streamed_rounds(scheme, extra):
    """Streamed rounds (docs/training.md) step buffers' pieces of a fragment at rate 1
    with no momentum too, and keep counters integers."""
    pytest.importorskip("torch")
    if scheme == "allreduce" and "compression" in extra:
        extra = {**extra, "compression": "int8"}
    result = train(TinyTorch(batchnorm=True), small_blobs, scheme,
                   trainer_cls=TorchTrainer, backend=FakeBackend(), optimizer=Sgd(0.1),
                   batch_size=32, rounds_per_epoch=3, **RUN, **extra)
    model = result.model
    mask = [name in dict(model.named_buffers()) for name in model.state_dict()]
    stats = running_stats(result.weights, mask)
    (var,), (count,) = stats["var"], stats["count"]
    assert (var > 0.005).all() and (var < 1).all(), var
    assert count.dtype == np.int64 and count > 0
    assert result.history[-1]["test_accuracy"] > 0.5
