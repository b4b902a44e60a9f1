"""A ``TrainerActor`` subclass written as the README says, and nothing more.

The README's "Another framework" bullet: subclass ``TrainerActor``, override ``fit``,
``get_weights``, ``set_weights``, ``evaluate_arrays`` (and the optional hooks it names),
and pass ``trainer_cls=``. :class:`ReadmeTrainer` does exactly that for softmax regression
whose model lives in numpy attributes of the trainer: ``build_model`` keeps ``model_fn()``'s
arrays and returns None, so no framework adapter holds the model. Unlike
``numpy_trainer.NumpyTrainer`` (which trains through ``NumpyAdapter``, an adapter), every
hook it leaves out must work without an adapter: no learning rate, no optimizer state,
no buffers. ``tests/apps/test_readme_hooks.py`` checks that its overrides are the README's
list, word for word.
"""

from __future__ import annotations

import numpy as np

from ddlf_actors.apps import TrainerActor

__all__ = ["ReadmeTrainer", "readme_model_fn", "RecordsPid", "RATE"]

#: Plain SGD's rate, fixed in the trainer: it has no learning-rate hook to set it.
RATE = 0.5


def readme_model_fn(num_features: int = 64, num_classes: int = 4, seed: int = 0):
    """A model function returning the initial arrays, ``[W, b]`` (no framework object)."""
    def build():
        rng = np.random.default_rng(seed)
        return [rng.normal(0, 0.01, (num_features, num_classes)).astype(np.float32),
                np.zeros(num_classes, np.float32)]
    return build


class ReadmeTrainer(TrainerActor):
    """Softmax regression trained by plain SGD in numpy, the model in ``self.w``."""

    def configure_threads(self, n):
        self.threads = n   # numpy's BLAS reads OMP_NUM_THREADS, which the trainer sets

    def build_model(self, model_fn):
        self.w = [np.array(a, np.float32) for a in model_fn()]
        return None

    def get_weights(self):
        return [a.copy() for a in self.w]

    def set_weights(self, weights):
        self.w = [np.array(a, np.float32, copy=True) for a in weights]

    def _probs(self, x):
        z = np.asarray(x, np.float32).reshape(len(x), -1) @ self.w[0] + self.w[1]
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def fit(self, x, y, epochs, batch_size):
        x, y = np.asarray(x, np.float32), np.asarray(y)
        total = 0.0
        for _ in range(epochs):
            total = 0.0
            for i in range(0, len(x), batch_size):
                xb, yb = x[i:i + batch_size], y[i:i + batch_size]
                p = self._probs(xb)
                total += float(-np.sum(np.log(p[np.arange(len(yb)), yb] + 1e-9)))
                p[np.arange(len(yb)), yb] -= 1.0
                p /= len(yb)
                self.w[0] -= RATE * (xb.reshape(len(xb), -1).T @ p)
                self.w[1] -= RATE * p.sum(axis=0)
        return total / max(1, len(x))

    def compute_gradients(self, x, y):
        x, y = np.asarray(x, np.float32), np.asarray(y)
        p = self._probs(x)
        loss = float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-9)))
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        return [x.reshape(len(x), -1).T @ p, p.sum(axis=0)], loss

    def apply_gradients(self, grads):
        self.w[0] -= RATE * np.asarray(grads[0], np.float32)
        self.w[1] -= RATE * np.asarray(grads[1], np.float32)

    def evaluate_arrays(self, x, y, batch_size=512):
        y = np.asarray(y)
        p = self._probs(x)
        return (float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-9))),
                float(np.mean(p.argmax(axis=1) == y)))


class RecordsPid:
    """A ``model_fn`` that writes its process's pid to ``directory/pid-<pid>`` before it
    builds ``inner()``: a test finds the trainers' processes (to kill one from outside)
    without changing the trainer class."""

    def __init__(self, inner, directory: str):
        self.inner = inner
        self.directory = directory

    def __call__(self):
        import os

        with open(os.path.join(self.directory, f"pid-{os.getpid()}"), "w") as f:
            f.write(str(os.getpid()))
        return self.inner()
