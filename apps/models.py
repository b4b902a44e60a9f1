"""Models for the training schemes. TensorFlow (or torch) is imported only when a model
is built. The GPTs for text (``gpt_tiny``, ``gpt_tiny_torch``) live in ``lm/``.

Importing this module costs nothing: a node's forkserver may import ``ddlf_actors.apps``
without starting TensorFlow's or torch's threads (neither is fork-safe once they run).
"""

from __future__ import annotations

from .lm.gpt_keras import gpt_tiny
from .lm.gpt_torch import gpt_tiny_torch

__all__ = ["paper_cnn", "wide_cnn", "paper_cnn_torch", "gpt_tiny", "gpt_tiny_torch",
           "INPUT_SHAPES", "OPTIMIZERS"]

# The image shape of each built-in dataset, as datasets.load returns it (NHWC).
INPUT_SHAPES = {"mnist": (28, 28, 1), "fashion-mnist": (28, 28, 1), "cifar10": (32, 32, 3)}

# The trainers' (inner) optimizers paper_cnn can compile, with their default rates. "adam"
# is the default: with sync's defaults it reached 0.85 validation accuracy on
# Fashion-MNIST in the fewest epochs of those tried (benchmarks/training/explore_defaults.py;
# docs/training.md, "the defaults"). "sgd" is the paper's (plain SGD, 0.01).
OPTIMIZERS = {"adam": 1e-3, "momentum": 0.03, "sgd": 0.01}


def paper_cnn(input_shape=(28, 28, 1), num_classes: int = 10,
              learning_rate: float | None = None, optimizer="adam"):
    """The DDLF paper's CNN (its Example 3.7), compiled for training.

    Conv2D(32, 3x3, relu) → MaxPool(2x2) → Conv2D(64, 3x3, relu) → Flatten →
    Dense(64, relu) → Dense(num_classes, softmax); sparse categorical cross-entropy and
    accuracy. At 28x28x1 it has 515,146 parameters.

    ``optimizer``: ``"adam"`` (the default, Adam at 1e-3), ``"momentum"`` (SGD with
    momentum 0.9 at 0.03), ``"sgd"`` (the paper's plain SGD at 0.01), or a Keras optimizer
    instance. ``learning_rate`` replaces a named optimizer's rate. Raises ``ValueError``
    for another name, or for a ``learning_rate`` given with an optimizer instance.
    """
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input(shape=tuple(input_shape)),
        layers.Conv2D(32, (3, 3), activation="relu"),
        layers.MaxPooling2D((2, 2)),
        layers.Conv2D(64, (3, 3), activation="relu"),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(num_classes, activation="softmax"),
    ])
    model.compile(optimizer=_optimizer(optimizer, learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def wide_cnn(input_shape=(28, 28, 1), num_classes: int = 10,
             learning_rate: float | None = None, filters: tuple = (32, 64), dense: int = 656,
             optimizer="adam"):
    """The paper CNN with a dense layer ten times wider: a workload where the links matter.

    Conv2D(filters[0], 3x3, relu) → MaxPool(2x2) → Conv2D(filters[1], 3x3, relu) →
    Flatten → Dense(dense, relu) → Dense(num_classes, softmax); sparse categorical
    cross-entropy and accuracy. At 28x28x1 with the defaults it has 5,106,106 parameters,
    20.4 MB of float32, 99.5 % of them in the first dense layer. ``optimizer`` and
    ``learning_rate`` as for :func:`paper_cnn`: Adam at 1e-3 by default, chosen on a
    validation split for one trainer (0.37 epochs to 0.875, against 0.75 for SGD momentum
    0.9 at 0.03 and more than 1 for plain SGD at 0.01, the old default:
    ``docs/training.md``, "The defaults, by K and by link").

    Why this shape (issue 23 section 1; ``docs/benchmarks/emulation.md``, "A workload
    where the links matter"): the bytes grow with the dense layer much faster than the compute, so
    at 100 Mbit/s one plain sync round's transfer (weights down, delta up: 40.8 MB per
    trainer, 3.3 s) takes three times as long as its 32 local steps of batch 32 on half a
    CPU (1.1 s), and at 1 Gbit/s a third of them; on one such node it reaches 0.887-0.889
    after 2 epochs of Fashion-MNIST. ``filters=(64, 128), dense=324`` (5,096,182
    parameters) has 1.5x the compute per byte, for runs that want the two closer.
    """
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input(shape=tuple(input_shape)),
        layers.Conv2D(filters[0], (3, 3), activation="relu"),
        layers.MaxPooling2D((2, 2)),
        layers.Conv2D(filters[1], (3, 3), activation="relu"),
        layers.Flatten(),
        layers.Dense(dense, activation="relu"),
        layers.Dense(num_classes, activation="softmax"),
    ])
    model.compile(optimizer=_optimizer(optimizer, learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def paper_cnn_torch(input_shape=(28, 28, 1), num_classes: int = 10):
    """The DDLF paper's CNN (its Example 3.7) as a ``torch.nn.Module`` that outputs logits.

    The same layers and sizes as :func:`paper_cnn` (515,146 parameters at 28x28x1), with
    PyTorch's default initialisation. It takes NHWC float32 images, as the datasets give
    them and as Keras takes them, and permutes them to NCHW in ``forward``: how a module
    that wants NCHW reads DDLF's data. No optimizer and no loss here: on PyTorch they are
    the run's ``optimizer=`` (default Adam 1e-3, as ``paper_cnn`` compiles) and ``loss=``
    (default cross-entropy on the logits).
    """
    import torch
    from torch import nn

    height, width, channels = (int(d) for d in input_shape)
    flat = 64 * ((height - 2) // 2 - 2) * ((width - 2) // 2 - 2)

    class PaperCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, 32, 3)
            self.pool = nn.MaxPool2d(2)
            self.conv2 = nn.Conv2d(32, 64, 3)
            self.fc1 = nn.Linear(flat, 64)
            self.fc2 = nn.Linear(64, num_classes)

        def forward(self, x):
            x = x.permute(0, 3, 1, 2)   # NHWC (the dataset's layout) -> NCHW (Conv2d's)
            x = self.pool(torch.relu(self.conv1(x)))
            x = torch.relu(self.conv2(x))
            x = torch.flatten(x, 1)
            return self.fc2(torch.relu(self.fc1(x)))

    return PaperCNN()


def _optimizer(optimizer, learning_rate):
    import keras

    if not isinstance(optimizer, str):
        if learning_rate is not None:
            raise ValueError("learning_rate= is for a named optimizer; set the rate on the "
                             f"optimizer instance you pass ({type(optimizer).__name__}) instead")
        return optimizer
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r} for paper_cnn: use one of "
                         f"{sorted(OPTIMIZERS)} or pass a Keras optimizer instance")
    rate = OPTIMIZERS[optimizer] if learning_rate is None else float(learning_rate)
    if optimizer == "adam":
        return keras.optimizers.Adam(rate)
    if optimizer == "momentum":
        return keras.optimizers.SGD(rate, momentum=0.9)
    return keras.optimizers.SGD(rate)
