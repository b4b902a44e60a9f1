"""The Keras adapter: a compiled Keras 3 model, on whichever backend Keras runs.

Training runs the batches of the indices the driver sent in order: the same steps as
``model.fit(x, y, epochs, batch_size, shuffle=False)``, without the ~0.2 s of set-up
``fit`` pays per call, which rounds of a few dozen steps would pay every round. On
TensorFlow it is one compiled loop per local epoch (``keras_steps.fit_steps``: about a
quarter less CPU per step than a ``train_on_batch`` per batch, the same weights bit for
bit); on the other backends one ``train_on_batch`` per batch.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from .. import keras_steps, tf_startup
from .base import FrameworkAdapter, eval_batch_size

__all__ = ["KerasAdapter"]


class KerasAdapter(FrameworkAdapter):
    name = "keras"
    model_file = "model.keras"

    @classmethod
    def owns(cls, model: Any) -> bool:
        keras = sys.modules.get("keras")
        return keras is not None and isinstance(model, keras.Model)

    @classmethod
    def configure_threads(cls, n: int) -> None:
        """TensorFlow gets ``n`` intra-op threads and 1 inter-op thread, set before TF
        starts (imported quietly: its start-up lines would reach the driver's terminal,
        see ``tf_startup.py``). Keras on another backend is left to that backend."""
        os.environ["OMP_NUM_THREADS"] = str(n)
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(n)
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
        keras = sys.modules.get("keras")
        if keras is not None and keras.backend.backend() != "tensorflow":
            return
        tf = tf_startup.import_tensorflow()
        try:
            tf.config.threading.set_intra_op_parallelism_threads(n)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TF already ran an op in this process: keep its pools
            pass

    def get_weights(self) -> list[np.ndarray]:
        return [np.asarray(w) for w in self.model.get_weights()]

    def set_weights(self, weights) -> None:
        self.model.set_weights(weights)

    def buffer_mask(self) -> list[bool]:
        """The non-trainable weights (BatchNorm's moving mean and variance, a frozen
        layer's weights), in ``model.weights`` order, which is ``get_weights``' order."""
        return [not bool(getattr(v, "trainable", True)) for v in self.model.weights]

    def fit(self, x, y, epochs: int, batch_size: int) -> float:
        # One compiled loop per local epoch on TensorFlow, one train_on_batch per batch on
        # the other backends: the same steps either way (keras_steps.py).
        return keras_steps.fit_steps(self.model, x, y, epochs, batch_size)

    # -- data-parallel: a gradient per batch, a step with the averaged one ----------------------
    def gradients_missing(self) -> str | None:
        keras = sys.modules.get("keras")
        backend = keras.backend.backend() if keras is not None else None
        if backend != "tensorflow":
            return (f"Keras on the {backend!r} backend: DDLF computes and applies gradients "
                    "for Keras on TensorFlow only (keras_backend='tensorflow')")
        if getattr(self.model, "optimizer", None) is None:
            return "the Keras model is not compiled (it has no optimizer to step)"
        return None

    def _gradient_fn(self):
        fn = getattr(self, "_grad_fn", None)
        if fn is None:
            tf = tf_startup.import_tensorflow()
            model = self.model

            # One graph for every batch of a shape: the forward pass and the loss as
            # compile() set them (regularisation included), through GradientTape.
            @tf.function(reduce_retracing=True)
            def fn(x, y):
                with tf.GradientTape() as tape:
                    pred = model(x, training=True)
                    loss = model.compute_loss(x=x, y=y, y_pred=pred, training=True)
                return tape.gradient(loss, model.trainable_variables), loss

            self._grad_fn = fn
        return fn

    def compute_gradients(self, x, y) -> tuple[list, float]:
        grads, loss = self._gradient_fn()(x, y)
        variables = self.model.trainable_variables
        return ([np.zeros(tuple(v.shape), str(v.dtype)) if g is None else np.asarray(g)
                 for g, v in zip(grads, variables)],
                float(loss))

    def apply_gradients(self, grads) -> None:
        fn: Any = getattr(self, "_apply_fn", None)
        if fn is None:
            tf = tf_startup.import_tensorflow()
            model = self.model

            # One graph for the step, as fit's compiled loop takes it (eager, the
            # optimizer's update of a 5 M-parameter model costs a few ops per variable).
            @tf.function
            def fn(grads):
                model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

            self._apply_fn = fn
        variables = self.model.trainable_variables
        fn([np.asarray(g, str(v.dtype)) for g, v in zip(grads, variables)])

    def evaluate(self, x, y, batch_size: int = 512) -> tuple[float, float]:
        batch_size = eval_batch_size(x, batch_size)
        out = self.model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
        acc = out.get("accuracy", out.get("sparse_categorical_accuracy"))
        if acc is None:  # the model was compiled without an accuracy metric
            pred = self.model.predict(x, batch_size=batch_size, verbose=0)
            acc = float(np.mean(np.argmax(pred, axis=-1) == np.asarray(y)))
        return float(out["loss"]), float(acc)

    def get_optimizer_state(self) -> list | None:
        opt = getattr(self.model, "optimizer", None)
        if opt is not None and not getattr(opt, "built", True):
            # Keras makes its slots at the first step: built now, the state before any step
            # is complete (zero moments, step 0) and fits set_optimizer_state after steps.
            opt.build(self.model.trainable_variables)
        variables = list(getattr(opt, "variables", None) or ())
        if not variables:
            return None
        return [np.array(v.numpy() if hasattr(v, "numpy") else v) for v in variables]

    def set_optimizer_state(self, state) -> None:
        opt = self.model.optimizer
        if not getattr(opt, "built", True):
            opt.build(self.model.trainable_variables)   # Keras creates slots lazily
        variables = list(opt.variables)
        if len(variables) != len(state) or any(tuple(v.shape) != np.shape(a)
                                               for v, a in zip(variables, state)):
            raise ValueError(f"optimizer state of {len(state)} arrays does not fit this "
                             f"model's optimizer ({len(variables)} variables)")
        for v, a in zip(variables, state):
            v.assign(a)

    def get_learning_rate(self) -> float | None:
        opt = getattr(self.model, "optimizer", None)
        rate = getattr(opt, "learning_rate", None)
        if rate is None:
            return None
        try:
            return float(np.asarray(rate))
        except (TypeError, ValueError):
            return None

    def step_schedule(self) -> str:
        """``"steps"`` for an optimizer compiled with a ``LearningRateSchedule`` (it counts
        the optimizer's iterations), else none."""
        opt = getattr(self.model, "optimizer", None)
        if opt is None:
            return "none"
        from keras.optimizers.schedules import LearningRateSchedule

        return ("steps" if isinstance(getattr(opt, "_learning_rate", None), LearningRateSchedule)
                else "none")

    def set_learning_rate(self, rate: float) -> None:
        opt = self.model.optimizer
        try:
            opt.learning_rate = float(rate)   # a variable's assign: no retracing
        except TypeError as e:
            raise TypeError(
                "this model's optimizer was built with a LearningRateSchedule, so the run's "
                "lr_schedule/lr_scaling cannot set its rate: compile the model with a number "
                "as learning_rate and pass the schedule as lr_schedule= instead") from e

    @classmethod
    def local_model(cls, model_fn, weights, options=None):
        with tf_startup.quiet_startup():   # the driver's first TF import, if it is one
            model = model_fn()
        model.set_weights(weights)
        return model

    @classmethod
    def save(cls, model, path: str) -> None:
        model.save(path)
