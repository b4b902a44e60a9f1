"""The start of a ring run sends the weights only to trainers that do not hold them.

``schemes/initial_weights.py``: trainers build through ``SeededBuild`` (the run's seed in
Python's and NumPy's generators), report a fingerprint of their weights, and the start
skips those that hold the start weights. Numpy trainers on the module's embedded
cluster; one Keras check that Keras 3's unseeded initializers follow the seeding.
"""

from __future__ import annotations

import os
import pickle
import random

import cloudpickle
import numpy as np
import pytest
from helpers_modules.numpy_trainer import NumpyTrainer, SoftmaxModel, blobs
from helpers_modules.wire_meter import metering

from ddlf_actors.apps.schemes import train_allreduce
from ddlf_actors.apps.schemes.initial_weights import SeededBuild, fingerprint, holders
from ddlf_actors.apps.schemes.slots import Slot

FEATURES, CLASSES = 256, 10
WEIGHTS_BYTES = (FEATURES * CLASSES + CLASSES) * 4


def _data():
    return blobs(n_train=6000, n_test=200, num_classes=CLASSES, side=16)


def global_random_model():
    """Unseeded, as most models are: its kernel comes from NumPy's global generator."""
    model = SoftmaxModel(FEATURES, CLASSES)
    model.w[0] = np.random.normal(0, 0.01, model.w[0].shape).astype(np.float32)
    return model


def entropy_model():
    """A model that draws from the OS: every trainer builds different weights."""
    model = SoftmaxModel(FEATURES, CLASSES)
    noise = np.frombuffer(os.urandom(model.w[0].size * 4), np.uint32).reshape(model.w[0].shape)
    model.w[0] = (noise / 2**32 * 0.02 - 0.01).astype(np.float32)
    return model


# -- the pieces ----------------------------------------------------------------------------------
def test_a_seeded_build_is_the_same_every_time_and_leaves_the_generators_as_they_were():
    def draws():
        return random.random(), float(np.random.random())

    build = SeededBuild(lambda n: (random.random(), np.random.normal(size=n)), 42)
    random.seed(1)
    np.random.seed(1)
    first = build(3)
    after_first = draws()
    random.seed(1)
    np.random.seed(1)
    assert after_first == draws()            # the call put both generators back
    second = build(3)
    assert first[0] == second[0] and np.array_equal(first[1], second[1])
    other = SeededBuild(build.model_fn, 43)(3)
    assert not np.array_equal(first[1], other[1])   # the seed is the run's: another differs


def test_a_seeded_build_travels_and_shows_the_model_functions_attributes():
    def model_fn():
        return np.random.normal(size=4)

    model_fn.settings = {"dim": 4}
    build = pickle.loads(cloudpickle.dumps(SeededBuild(model_fn, 5)))
    assert build.settings == {"dim": 4} and build.seed == 5
    assert np.array_equal(build(), SeededBuild(model_fn, 5)())
    with pytest.raises(AttributeError):
        build.no_such_attribute   # noqa: B018


def test_the_fingerprint_sees_bytes_dtype_and_shape_and_names_the_holders():
    w = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(3, np.float32)]
    fp = fingerprint(w)
    assert fp == fingerprint([a.copy() for a in w])
    changed = [w[0].copy(), w[1].copy()]
    changed[0][1, 2] = np.nextafter(changed[0][1, 2], np.float32(10))   # one ulp
    assert len({fp, fingerprint(changed), fingerprint([w[0].reshape(3, 2), w[1]]),
                fingerprint([w[0].astype(np.float64), w[1]])}) == 4
    slots = [Slot(0), Slot(1), Slot(2), Slot(3)]
    slots[0].info = {"weights_fingerprint": fp}
    slots[1].info = {"weights_fingerprint": fingerprint(changed)}
    slots[2].info = {"weights_fingerprint": fp}
    # slots[3] has not described itself (starting): it is sent the weights.
    assert holders(slots, w) == {0, 2}


def test_keras_unseeded_initializers_follow_the_seeded_build():
    keras = pytest.importorskip("keras")

    def model_fn():
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                 keras.layers.Dense(3)])

    a = [w.copy() for w in SeededBuild(model_fn, 3)().get_weights()]
    b = SeededBuild(model_fn, 3)().get_weights()
    c = SeededBuild(model_fn, 4)().get_weights()
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)


# -- on a cluster --------------------------------------------------------------------------------
def _start_bytes(model_fn, k: int):
    """``(extra, wire)``: what the first row carries beyond a later row's indices and
    control, in model copies (the driver's own accounting); and the bytes the driver's
    process put on its connections in all."""
    with metering() as meter:
        result = train_allreduce(model_fn, _data, workers=k, num_cpus=0.5, master_epochs=2,
                                 rounds_per_epoch=1, trainer_cls=NumpyTrainer, seed=3,
                                 progress=False)
    rows = result.history
    assert len(rows) == 2 and rows[-1]["test_accuracy"] > 0.5
    per_row = [r["bytes_sent"] + r["bytes_received"] for r in rows]
    return (per_row[0] - per_row[1]) / WEIGHTS_BYTES, meter.total, result


def test_trainers_that_built_the_same_weights_are_not_sent_them(train_cluster):
    k = 3
    held, held_wire, result = _start_bytes(global_random_model, k)
    # The driver fetched trainer 0's weights (one copy) and sent none: every trainer
    # built the same from the run's seed.
    assert held == 1
    assert result.history[0]["workers"] == k
    sent, sent_wire, _ = _start_bytes(entropy_model, k)
    # Weights only trainer 0 holds: the other K - 1 are sent them.
    assert sent == 1 + (k - 1)
    # The wire agrees: K - 1 more copies left the driver, within a copy's control bytes.
    assert abs((sent_wire - held_wire) - (k - 1) * WEIGHTS_BYTES) < WEIGHTS_BYTES, (
        sent_wire, held_wire)
