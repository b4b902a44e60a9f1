"""The tests' small PyTorch model, and one ``Kit`` per framework the training tests run on.

The training tests are written once and run on the numpy softmax model
(``numpy_trainer.py``, the fast default) and on a small ``torch.nn.Module`` through the
real PyTorch adapter: the ``framework`` fixture (``tests/apps/conftest.py``) hands a test
a :class:`Kit`, which says how to build that framework's model, which trainer class to
pass (a test trainer that injects a fault, in its variant for the framework), and which
options to add (``optimizer=`` for torch).

Nothing here imports torch at import time: trainers' forkservers import test modules.
"""

from __future__ import annotations

import numpy as np

from ddlf_actors.apps import TrainerActor

from . import numpy_trainer as nt

__all__ = ["TinyTorch", "Sgd", "TorchTrainer", "Kit", "KITS", "torch_variant",
           "running_stats"]


class TinyTorch:
    """``model_fn`` of softmax regression on 8x8x1 images in PyTorch (the numpy model's
    task), optionally with a BatchNorm1d (8 channels of 8 positions, so a batch of one
    sample still has statistics) in front: running mean, running variance and the
    ``num_batches_tracked`` counter among its ``state_dict``.

    Initialised from its own generator (``seed``), not torch's global one: the in-process
    fake backend builds several trainers' models on threads at once."""

    def __init__(self, batchnorm: bool = False, seed: int = 0, features: int = 64,
                 classes: int = 4):
        self.batchnorm = batchnorm
        self.seed = seed
        self.features = features
        self.classes = classes

    def __call__(self):
        import torch
        from torch import nn

        layers: list = [nn.Flatten()]
        if self.batchnorm:
            layers += [nn.Unflatten(1, (8, self.features // 8)), nn.BatchNorm1d(8),
                       nn.Flatten()]
        layers.append(nn.Linear(self.features, self.classes))
        model = nn.Sequential(*layers)
        g = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for p in model.parameters():   # kernels small and random, the rest as built
                if p.dim() > 1:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.01)
                elif p is not getattr(model[-1], "bias", None):
                    continue           # BatchNorm's weight (ones) and bias (zeros)
                else:
                    p.zero_()
        return model


class Sgd:
    """``optimizer=``: ``torch.optim.SGD(params, lr, momentum)`` (picklable)."""

    def __init__(self, lr: float = 0.5, momentum: float = 0.0):
        self.lr = lr
        self.momentum = momentum

    def __call__(self, params):
        import torch

        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)


class TorchTrainer(TrainerActor):
    """A trainer whose adapter follows the model (PyTorch here)."""


def torch_variant(cls: type) -> type:
    """``cls`` (a ``NumpyTrainer`` subclass that injects a fault or a timing) training a
    PyTorch module: the same hooks, with the adapter picked by the model's type."""
    if cls is nt.NumpyTrainer:
        return TorchTrainer
    name = f"{cls.__name__}Torch"
    made = globals().get(name)
    if made is None:
        raise KeyError(f"no PyTorch variant of {cls.__name__}: add it to _VARIANTS in "
                       "tests/helpers_modules/torch_trainer.py (workers import it by name)")
    return made


# Made at import, so a worker process finds each by name when it unpickles the class.
_VARIANTS = (nt.SigkillOnce, nt.DiesInRoundTwo, nt.SigkillInCollective, nt.GatedTrainer,
             nt.SlowFirstTrainer, nt.ConstantDeltaTrainer, nt.SigkillInInit)
for _cls in _VARIANTS:
    globals()[f"{_cls.__name__}Torch"] = type(f"{_cls.__name__}Torch", (_cls,), {
        "adapter_cls": None, "__module__": __name__,
        "__doc__": f"{_cls.__name__} on a PyTorch module."})


class Kit:
    """How a training test builds its model on one framework."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def model_fn(self, batchnorm: bool = False):
        if self.name == "numpy":
            if batchnorm:
                raise ValueError("the numpy model has no BatchNorm")
            return nt.softmax_model_fn()
        return TinyTorch(batchnorm=batchnorm)

    def trainer(self, cls: type = nt.NumpyTrainer) -> type:
        return cls if self.name == "numpy" else torch_variant(cls)

    @property
    def options(self) -> dict:
        """Options a run adds: the numpy model's rate (0.5, plain SGD) for torch."""
        return {} if self.name == "numpy" else {"optimizer": Sgd(0.5)}

    def momentum(self) -> tuple:
        """``(model_fn, trainer_cls, options)`` of a model with optimizer state
        (momentum 0.9): what a checkpoint must keep for a bit-equal resume."""
        if self.name == "numpy":
            return nt.momentum_model_fn(), nt.MomentumTrainer, {}
        return TinyTorch(), TorchTrainer, {"optimizer": Sgd(0.5, momentum=0.9)}


KITS = {"numpy": Kit("numpy"), "torch": Kit("torch")}


def running_stats(weights: list, mask: list) -> dict:
    """The buffers of a BatchNorm model's weights, by kind: ``{"var": [...], "mean":
    [...], "count": [...]}`` (float buffers alternate mean, variance in torch's and
    Keras' order; integer ones are counters)."""
    floats = [np.asarray(w) for w, b in zip(weights, mask) if b and np.asarray(w).dtype.kind == "f"]
    ints = [np.asarray(w) for w, b in zip(weights, mask) if b and np.asarray(w).dtype.kind in "iu"]
    return {"mean": floats[0::2], "var": floats[1::2], "count": ints}
