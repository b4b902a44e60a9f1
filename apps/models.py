"""Models for the training schemes. TensorFlow is imported only when a model is built.

Importing this module costs nothing: a node's forkserver may import ``ddlf_actors.apps``
without starting TensorFlow's threads (TF is not fork-safe once they run).
"""

from __future__ import annotations

__all__ = ["paper_cnn", "INPUT_SHAPES", "OPTIMIZERS"]

# The image shape of each built-in dataset, as datasets.load returns it (NHWC).
INPUT_SHAPES = {"mnist": (28, 28, 1), "fashion-mnist": (28, 28, 1), "cifar10": (32, 32, 3)}

# The trainers' (inner) optimizers paper_cnn can compile, with their default rates. "adam"
# is the default: with sync's defaults it reached 0.85 validation accuracy on
# Fashion-MNIST in the fewest epochs of those tried (benchmarks/explore_defaults.py;
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
