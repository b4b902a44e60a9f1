"""Small Keras models and an App subclass for the few tests that need TensorFlow."""

from __future__ import annotations

from ddlf_actors.apps import App
from helpers_modules.numpy_trainer import blobs


def tiny_keras_model():
    import keras
    from keras import layers

    model = keras.Sequential([keras.Input(shape=(8, 8, 1)), layers.Flatten(),
                              layers.Dense(16, activation="relu"),
                              layers.Dense(4, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def bn_model_fn():
    """Softmax regression on 8x8x1 images behind a BatchNormalization: moving mean and
    moving variance among its weights (Keras' non-trainable weights)."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(8, 8, 1)), layers.Flatten(),
                              layers.BatchNormalization(momentum=0.9),
                              layers.Dense(4, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


class BlobsApp(App):
    """The paper's style: methods set attributes, and create_model does not compile."""

    async def load_dataset(self):
        (self.x_train, self.y_train), (self.x_test, self.y_test) = blobs(600, 200)

    async def create_model(self):
        import keras
        from keras import layers

        self.model = keras.Sequential([keras.Input(shape=(8, 8, 1)), layers.Flatten(),
                                       layers.Dense(4, activation="softmax")])


def fashion_mnist_2000(data_dir):
    """The first 2,000 training and 1,000 test images of the real Fashion-MNIST."""
    from ddlf_actors.apps import datasets

    (x, y), (xt, yt) = datasets.load("fashion-mnist", data_dir=data_dir, download=False)
    return (x[:2000], y[:2000]), (xt[:1000], yt[:1000])
