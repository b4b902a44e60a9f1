"""``keras_steps.fit_steps``: a round's batches in one compiled call, the same steps as one
``train_on_batch`` per batch (what ``TrainerActor.fit`` did before)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from ddlf_actors.apps.keras_steps import _train_on_batch_loop, fit_steps  # noqa: E402


def small_cnn(optimizer):
    from keras import layers

    model = keras.Sequential([keras.Input((8, 8, 1)), layers.Conv2D(4, 3, activation="relu"),
                              layers.MaxPooling2D(2), layers.Flatten(),
                              layers.Dense(8, activation="relu"),
                              layers.Dense(3, activation="softmax")])
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def train_on_batch_loop(model, x, y, epochs, batch_size):
    """TrainerActor.fit as it was: one train_on_batch per batch; the loss by samples.
    Each batch's own loss: Keras before 3.13 (the one Python 3.10 gets) keeps a running
    mean across train_on_batch calls unless its metrics are reset."""
    for _ in range(epochs):
        total = 0.0
        for start in range(0, len(x), batch_size):
            model.reset_metrics()
            logs = model.train_on_batch(x[start:start + batch_size],
                                        y[start:start + batch_size], return_dict=True)
            total += logs["loss"] * len(x[start:start + batch_size])
    return total / len(x)


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 1)).astype(np.float32)
    return x, (x[:, :4].sum(axis=(1, 2, 3)) > 0).astype(np.int64) + (x[:, 4:, :, 0].mean(
        axis=(1, 2)) > 0.2)


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(0.05),
    lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    lambda: keras.optimizers.Adam(1e-3),
], ids=["sgd", "nesterov", "adam"])
def test_the_weights_are_those_of_one_train_on_batch_per_batch(make_optimizer):
    keras.utils.set_random_seed(1)
    a, b = small_cnn(make_optimizer()), small_cnn(make_optimizer())
    b.set_weights(a.get_weights())
    # Rounds of different sizes, one with a short last batch, two local epochs in one,
    # and a rate set between rounds (as the driver's lr_schedule does).
    for r, (n, epochs) in enumerate([(96, 1), (70, 1), (64, 2), (33, 1)]):
        x, y = data(n, seed=r)
        if r == 2:
            a.optimizer.learning_rate = b.optimizer.learning_rate = 0.02
        loss_a = train_on_batch_loop(a, x, y, epochs, 16)
        loss_b = fit_steps(b, x, y, epochs, 16)
        for wa, wb in zip(a.get_weights(), b.get_weights()):
            np.testing.assert_array_equal(wa, wb)
        assert loss_b == pytest.approx(loss_a, rel=1e-5)
    assert int(a.optimizer.iterations) == int(b.optimizer.iterations) == 6 + 5 + 8 + 3


def test_the_per_batch_fallback_reports_each_rounds_own_loss():
    """The loop Keras on JAX or torch trains with: each round's loss is the mean of its
    batches' own losses, whatever Keras does with train_on_batch's metrics between calls
    (before 3.13 it kept a running mean: this failed on Python 3.10's Keras 3.12)."""
    keras.utils.set_random_seed(3)
    a, b = small_cnn(keras.optimizers.SGD(0.05)), small_cnn(keras.optimizers.SGD(0.05))
    b.set_weights(a.get_weights())
    for r, n in enumerate([64, 40]):
        x, y = data(n, seed=10 + r)
        assert _train_on_batch_loop(b, x, y, 1, 16) == pytest.approx(
            train_on_batch_loop(a, x, y, 1, 16), rel=1e-5)


def test_a_model_compiled_again_trains_with_its_new_optimizer():
    keras.utils.set_random_seed(2)
    model = small_cnn(keras.optimizers.SGD(0.05))
    x, y = data(64)
    fit_steps(model, x, y, 1, 16)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    fit_steps(model, x, y, 1, 16)    # rate 0: a loop still bound to the old SGD would move
    for w0, w1 in zip(before, model.get_weights()):
        np.testing.assert_array_equal(w0, w1)
    assert int(model.optimizer.iterations) == 4


def test_nothing_to_train_on_and_a_dropped_model():
    model = small_cnn(keras.optimizers.SGD(0.05))
    x, y = data(0)
    assert fit_steps(model, x, y, 1, 16) == 0.0
    x, y = data(20)
    assert np.isfinite(fit_steps(model, x, y, 1, 16))
    from ddlf_actors.apps import keras_steps

    assert len(keras_steps._LOOPS) >= 1
    del model
    gc.collect()
    assert len(keras_steps._LOOPS) == 0
