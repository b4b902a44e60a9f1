"""What runs on ``train_chaos.py``'s trainers: the seeded models (Keras, PyTorch, numpy), a
small Fashion-MNIST, and trainer classes that log every call's start and end (for the
wasted-compute figure) and can be slowed down per call.
"""

from __future__ import annotations

import json
import os
import sys
import time

CALL_LOG_ENV = "DDLF_CHAOS_CALL_LOG"
FIT_SLEEP_ENV = "DDLF_CHAOS_FIT_S"
TRAINER_CLASSES = ("ChaosCnnTrainer", "ChaosNumpyTrainer")


def now() -> float:
    return time.time()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- what runs on the trainers ----------------------------------------------------------------


def fashion_subset(n_train: int, n_test: int):
    """The first ``n_train``/``n_test`` images of Fashion-MNIST (a dataset callable)."""
    from ddlf_actors.apps import datasets

    (x, y), (x_test, y_test) = datasets.load("fashion-mnist")
    return (x[:n_train], y[:n_train]), (x_test[:n_test], y_test[:n_test])


def seeded_cnn(seed: int):
    """The paper's CNN, initialised from ``seed`` (every trainer and every run alike)."""
    import keras

    from ddlf_actors.apps.models import paper_cnn

    keras.utils.set_random_seed(seed)
    return paper_cnn()


def seeded_cnn_torch(seed: int):
    """The paper's CNN in PyTorch, initialised from ``seed`` (every trainer and run alike)."""
    import torch

    from ddlf_actors.apps.models import paper_cnn_torch

    torch.manual_seed(seed)
    return paper_cnn_torch()


def softmax_784(seed: int):
    from helpers_modules.numpy_trainer import SoftmaxModel

    return SoftmaxModel(28 * 28, 10, lr=0.1, seed=seed)


def _call_log(record: dict) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if not path:
        return
    # One short line per write with O_APPEND: lines of concurrent trainers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


class _LoggedCalls:
    """Logs when each train call starts and ends (pid, slot, wall clock): the benchmark's
    record of work in progress when a fault hits, and of when the next round starts."""

    def train(self, weights, indices, epochs, batch_size, return_state=False, **kwargs):
        slot, pid = getattr(self, "_ddlf_index", None), os.getpid()
        _call_log({"e": "start", "slot": slot, "pid": pid, "t": time.time()})
        out = super().train(weights, indices, epochs, batch_size, return_state, **kwargs)
        _call_log({"e": "end", "slot": slot, "pid": pid, "t": time.time(),
                   "n": out[1]["samples"]})
        return out

    def evaluate(self, weights=None, shard=None):
        # A round's first work on a trainer is its shard of the last row's evaluation.
        _call_log({"e": "eval", "slot": getattr(self, "_ddlf_index", None),
                   "pid": os.getpid(), "t": time.time()})
        return super().evaluate(weights, shard)


def trainer_classes():
    from helpers_modules.numpy_trainer import NumpyTrainer

    from ddlf_actors.apps import TrainerActor

    class ChaosCnnTrainer(_LoggedCalls, TrainerActor):
        pass

    class ChaosNumpyTrainer(_LoggedCalls, NumpyTrainer):
        def fit(self, x, y, epochs, batch_size):
            time.sleep(float(os.environ.get(FIT_SLEEP_ENV, "0")))
            return super().fit(x, y, epochs, batch_size)

    return ChaosCnnTrainer, ChaosNumpyTrainer
