"""A Keras model's training steps over a round's batches, in one compiled call per epoch.

A trainer's round of local SGD is a few dozen batches. ``model.fit`` pays about 0.2 s of
set-up per call on one thread (its data adapter, callbacks and iterator), which a round
of 32 steps would pay every round; one ``train_on_batch`` per batch avoids that but pays
a Python call per step instead (it resets the metrics, enters the compiled step and
converts the logs to numpy, which waits for the step to finish). :func:`fit_steps` runs
the same ``model.train_step`` on each batch, in the same order, inside one
``tf.function`` (a ``tf.while_loop`` over the batches): one call per local epoch. The
ops and their order are those of the ``train_on_batch`` loop, so the weights come out
bit-equal to it (checked in ``tests/apps/test_keras_steps.py``).

TensorFlow is imported on the first call only (trainers only: see ``tf_startup.py``).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

__all__ = ["fit_steps"]

# model -> (a weak reference to Keras's train_function when the loops were made,
# {(x spec, y spec): the compiled loop}). Compiling a model again (a new optimizer or loss)
# makes Keras drop its train_function, and so these loops. Weak keys: a dropped model
# takes its loops along (they hold its variables, never the model itself).
_LOOPS: weakref.WeakKeyDictionary[Any, tuple[Any, dict]] = weakref.WeakKeyDictionary()


def fit_steps(model, x, y, epochs: int, batch_size: int) -> float:
    """Train ``model`` in place on ``x, y`` for ``epochs`` passes, in order (no shuffle:
    the driver shuffled the indices), in batches of ``batch_size`` (the last one may be
    short): the steps of ``model.fit(x, y, batch_size, epochs, shuffle=False)``.

    Returns the mean training loss of the last epoch, weighted by samples (what ``fit``
    reports), or 0.0 when there is nothing to train on. A model whose Keras backend is
    not TensorFlow gets one ``train_on_batch`` per batch instead (the same steps, slower).
    Raises what Keras raises for the model (e.g. ``ValueError`` for one never compiled).
    """
    epochs, batch_size = int(epochs), int(batch_size)
    if len(x) == 0 or epochs <= 0:
        return 0.0
    import keras

    if keras.backend.backend() != "tensorflow":
        return _train_on_batch_loop(model, x, y, epochs, batch_size)
    import tensorflow as tf

    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "built", True):
        # Its slots made now, not inside the first trace: a tf.function that creates
        # variables is traced twice (a first 16-step call: 0.85 s, 0.52 s with this; the
        # paper CNN with Adam, 1 thread).
        optimizer.build(model.trainable_variables)
    x = tf.convert_to_tensor(x)
    y = tf.convert_to_tensor(y)
    loop = _loop_for(model, x, y)
    size = tf.constant(batch_size, tf.int32)
    loss = 0.0
    for _ in range(epochs):
        model.reset_metrics()    # the loss is the mean over this epoch, as fit reports
        loss = loop(x, y, size)
    return float(loss)


def _loop_for(model, x, y):
    """The compiled loop for ``model`` and these arrays' shapes and dtypes."""
    import tensorflow as tf

    model.make_train_function()   # Keras's step function; a new one after each compile
    current = model.train_function
    entry = _LOOPS.get(model)
    if entry is None or entry[0]() is not current:
        entry = _LOOPS[model] = (weakref.ref(current), {})
    specs = (_spec(x), _spec(y))
    loop = entry[1].get(specs)
    if loop is None:
        loop = entry[1][specs] = _make_loop(weakref.ref(model), tf.TensorSpec(*specs[0]),
                                            tf.TensorSpec(*specs[1]))
    return loop


def _spec(t) -> tuple:
    """``(shape with a free first axis, dtype)``: one trace serves every round's size."""
    return ((None,) + tuple(t.shape[1:]), t.dtype)


def _make_loop(model_ref, x_spec, y_spec):
    import tensorflow as tf

    @tf.function(input_signature=[x_spec, y_spec, tf.TensorSpec((), tf.int32)])
    def loop(x, y, batch_size):
        # The model through a weak reference: the traced graph holds its variables, not
        # the model, so the cache above does not keep a dropped model alive.
        model = model_ref()
        n = tf.shape(x)[0]
        steps = (n + batch_size - 1) // batch_size

        def step(i, _loss):
            start = i * batch_size
            logs = model.train_step((x[start:start + batch_size], y[start:start + batch_size]))
            # The running mean since reset_metrics; carried out so that the step's updates
            # are ordered before the next step reads the variables (automatic control
            # dependencies do this already; the carried value makes it explicit).
            return i + 1, tf.cast(logs["loss"], tf.float32)

        _, loss = tf.while_loop(lambda i, _loss: i < steps, step,
                                [tf.constant(0, tf.int32), tf.constant(0.0, tf.float32)])
        return loss

    return loop


def _train_on_batch_loop(model, x, y, epochs: int, batch_size: int) -> float:
    """The same steps, one ``train_on_batch`` per batch; the loss weighted by samples."""
    loss = 0.0
    for _ in range(epochs):
        total, seen = 0.0, 0
        for start in range(0, len(x), batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            # Keras before 3.13 does not reset its metrics in train_on_batch: "loss" is then
            # the running mean since the last reset, not this batch's (issue 31, Python 3.10).
            model.reset_metrics()
            logs = model.train_on_batch(xb, yb, return_dict=True)
            total += float(logs["loss"]) * len(xb)
            seen += len(xb)
        loss = total / seen
    return float(np.float32(loss))
