"""The paper's App API (its IApp, Table 3.6), on TrainerActors.

    class MnistApp(App):
        async def load_dataset(self):
            (self.x_train, self.y_train), (self.x_test, self.y_test) = datasets.load("mnist")
        async def create_model(self):
            self.model = models.paper_cnn()

    async def main():
        app = MnistApp(workers=2)
        await app.connect()
        await app.load_dataset()
        await app.create_model()
        await app.train_sync(master_epochs=2, worker_epochs=1, batch_size=32)
        await app.evaluate_model()
        await app.save_model("model.keras")
        await app.close()

``create_model`` may build a ``torch.nn.Module`` instead (``App(optimizer=..., loss=...)``
then set how each trainer trains it; ``save_model("model.pt")`` writes its state dict).

As in the paper, ``load_dataset`` and ``create_model`` run on the master (the driver)
and on every worker: each trainer runs them once, on its own copy of the app, and
keeps the result (a method may return ``((x, y), (x_test, y_test))`` / the model, or
set ``self.x_train``... / ``self.model`` as the paper's examples do). Trainers on one
node share one read-only copy of the dataset. ``App.cluster`` is the Cluster API over
the same trainers.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import ddlf_actors as ddlf
from ddlf_actors.cluster import Cluster, WorkerProxy

from . import backends, datasets, frameworks, models
from .arrays import combine_shards
from .config import FRAMEWORK_OPTIONS, TrainConfig, framework_settings
from .frameworks.keras import KerasAdapter
from .options import ConfigError
from .schemes import registry
from .schemes.api import split_options
from .schemes.driver import Driver
from .schemes.pool import describe_trainers, start_trainers, stop_trainers
from .trainer import TrainerActor

__all__ = ["App"]

# What stays on the driver: never shipped to trainers with the app's settings.
_DRIVER_ONLY = ("model", "x_train", "y_train", "x_test", "y_test", "weights", "result")


class _AppStep:
    """One of an App's steps, run on a trainer with a copy of the app's settings."""

    def __init__(self, app: App, step: str):
        self.app = app
        self.step = step

    def __call__(self):
        app = self.app
        returned = asyncio.run(getattr(app, self.step)())
        if self.step == "load_dataset":
            if returned is not None:
                return returned
            return (app.x_train, app.y_train), (app.x_test, app.y_test)
        model = returned if returned is not None else app.model
        if KerasAdapter.owns(model) and getattr(model, "optimizer", None) is None:
            # The paper's create_model builds without compiling: use its SGD set-up.
            model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"])
        return model


class App:
    """Subclass and override ``load_dataset()`` and ``create_model()``; the defaults
    load ``dataset`` (a registered name) and build the paper's CNN for it.

    ``optimizer``, ``loss`` (a PyTorch ``create_model``) and ``keras_backend`` (a Keras
    one) are the trainers' framework settings, as in ``train_sync``: set once, here,
    because the app's trainers are built once and kept between its runs. They reach the
    trainers as ``TrainConfig.framework_options()`` (an app asks no GPUs: it takes no
    ``trainer_options``)."""

    # What load_dataset() sets (a subclass's may set them, or return the two pairs).
    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any

    def __init__(self, workers: int = 2, *, dataset: str = "fashion-mnist",
                 address: str | None = None, token: str | None = None, num_cpus: float = 1,
                 trainer_cls=None, progress: bool = True, optimizer=None, loss=None,
                 keras_backend: str | None = None):
        self.workers = workers
        self.dataset = dataset
        self.address = address
        self.token = token
        self.num_cpus = num_cpus
        self.trainer_cls = trainer_cls or TrainerActor
        self.progress = progress
        self.optimizer = optimizer
        self.loss = loss
        self.keras_backend = keras_backend
        self._config()   # a bad setting fails here, not when the first run starts
        self.model: Any = None
        self.weights: Any = None
        self.result: Any = None
        self._ddlf_trainers: Any = None
        self._ddlf_cluster: Any = None
        self._ddlf_started_session = False

    def __getstate__(self):
        # What a trainer gets: the app's settings, not the driver's data, model or session.
        state = {k: v for k, v in self.__dict__.items()
                 if not k.startswith("_ddlf_") and k not in _DRIVER_ONLY}
        return copy.copy(state)

    def __setstate__(self, state):
        self.__dict__.update(state)
        for k in _DRIVER_ONLY:
            self.__dict__.setdefault(k, None)

    # -- IApp --------------------------------------------------------------------------------
    async def connect(self) -> App:
        """Join the cluster at ``address`` (or start an embedded one)."""
        if not ddlf.is_initialized():
            await asyncio.to_thread(ddlf.init, self.address, token=self.token)
            self._ddlf_started_session = True
        return self

    async def load_dataset(self):
        """Override: return ``((x, y), (x_test, y_test))`` or set ``self.x_train`` etc."""
        return await asyncio.to_thread(datasets.load_shared, self.dataset)

    async def create_model(self):
        """Override: return a compiled model or set ``self.model``."""
        return models.paper_cnn(input_shape=models.INPUT_SHAPES.get(self.dataset, (28, 28, 1)))

    async def train(self, weights=None, worker_epochs: int = 1, batch_size: int = 32):
        """One synchronous round over the whole training set; return the new weights."""
        result = await self.train_sync(1, worker_epochs, batch_size, initial_weights=weights)
        return result.weights

    async def train_sync(self, master_epochs: int, worker_epochs: int = 1,
                         batch_size: int = 32, **options):
        return await self._train("sync", master_epochs, worker_epochs, batch_size, options)

    async def train_async(self, master_epochs: int, worker_epochs: int = 1,
                          batch_size: int = 32, **options):
        return await self._train("async", master_epochs, worker_epochs, batch_size, options)

    async def evaluate_model(self) -> dict:
        """Test loss and accuracy of the current weights, evaluated on the trainers."""
        trainers = await self._trainers()
        weights = await self._current_weights()
        ref = backends.select().put(weights)
        shards = await asyncio.gather(*(t.evaluate.remote(ref, (j, len(trainers)))
                                        for j, t in enumerate(trainers)))
        num_test = (await trainers[0].describe.remote())["num_test"]
        loss, accuracy = combine_shards(num_test, shards)
        return {"test_loss": loss, "test_accuracy": accuracy}

    async def save_model(self, path: str) -> str:
        """Save the model with the current weights in its framework's format: ``.keras``
        for Keras, a ``torch.save`` of the state dict for PyTorch (``model.pt``)."""
        model = await self._driver_model()
        await asyncio.to_thread(frameworks.for_model(model).save, model, path)
        return path

    async def load_model(self, path: str):
        """Load a ``.keras`` model, or a PyTorch state dict (``torch.load(path)``) into
        ``create_model()``'s module; its weights become the starting point of training."""
        if path.endswith(".keras"):
            import keras

            self.model = await asyncio.to_thread(keras.saving.load_model, path)
        else:
            import torch

            model = await asyncio.to_thread(_AppStep(self, "create_model"))
            model.load_state_dict(torch.load(path))
            self.model = model
        self.weights = frameworks.for_model(self.model).weights_of(self.model)
        return self.model

    async def close(self) -> None:
        """Stop the trainers (and the session, if ``connect`` started it)."""
        self.shutdown_trainers()
        if self._ddlf_started_session:
            await asyncio.to_thread(ddlf.shutdown)
            self._ddlf_started_session = False

    async def shutdown(self) -> None:
        await self.close()

    # -- the Cluster API over the same workers -------------------------------------------------
    @property
    def cluster(self) -> Cluster:
        if self._ddlf_trainers is None:
            raise ddlf.errors.DDLFError("the app has no workers yet: call train_sync, "
                                        "train_async or evaluate_model first, or await "
                                        "app.start_workers()")
        if self._ddlf_cluster is None:
            c = Cluster()
            c.workers = [WorkerProxy(t, j, None) for j, t in enumerate(self._ddlf_trainers)]
            self._ddlf_cluster = c
        return self._ddlf_cluster

    async def start_workers(self) -> list:
        return await self._trainers()

    def shutdown_trainers(self) -> None:
        stop_trainers(self._ddlf_trainers)
        self._ddlf_trainers = None
        self._ddlf_cluster = None

    # -- internals -----------------------------------------------------------------------------
    def _config(self) -> TrainConfig:
        return TrainConfig(workers=self.workers, num_cpus=self.num_cpus,
                           trainer_cls=self.trainer_cls, progress=self.progress,
                           **framework_settings(self))

    async def _trainers(self) -> list:
        if self._ddlf_trainers is None:
            await self.connect()
            dataset, model_fn = _AppStep(self, "load_dataset"), _AppStep(self, "create_model")
            trainers = await asyncio.to_thread(start_trainers, model_fn, dataset, self._config())
            self._ddlf_trainers = trainers
            try:
                await asyncio.to_thread(describe_trainers, trainers)
            except BaseException:
                self.shutdown_trainers()
                raise
        return self._ddlf_trainers

    async def _current_weights(self) -> list:
        if self.weights is None:
            trainers = await self._trainers()
            self.weights = await trainers[0].get_weights.remote()
        return self.weights

    async def _driver_model(self):
        if self.model is None:   # its own thread: the step runs create_model's coroutine
            self.model = await asyncio.to_thread(_AppStep(self, "create_model"))
        self._set_driver_weights(await self._current_weights())
        return self.model

    def _set_driver_weights(self, weights) -> None:
        """The driver's model takes ``weights`` through its adapter (no optimizer built)."""
        model = self.model
        frameworks.for_model(model).local_model(lambda: model, weights)

    async def _train(self, scheme: str, master_epochs, worker_epochs, batch_size, options):
        trainers = await self._trainers()
        for name in FRAMEWORK_OPTIONS:
            if name in options:
                raise ConfigError(f"{name}=", f"is set once for the app's trainers: "
                                  f"App(..., {name}=...)")
        initial = options.pop("initial_weights", None)
        resume = options.pop("resume", None)
        if resume is not None:
            options.setdefault("checkpoint_dir", resume)
        elif initial is None:
            initial = await self._current_weights()
        config, scheme_options = split_options(scheme, dict(
            workers=self.workers, num_cpus=self.num_cpus, trainer_cls=self.trainer_cls,
            progress=self.progress, master_epochs=master_epochs, worker_epochs=worker_epochs,
            batch_size=batch_size, **framework_settings(self), **options),
            caller=f"App.train_{scheme}")
        driver = Driver(registry.get(scheme), _AppStep(self, "create_model"),
                        _AppStep(self, "load_dataset"), config, scheme_options, trainers)
        self.result = await asyncio.to_thread(driver.run, initial, resume)
        self.weights = self.result.weights
        if self.model is not None:
            self._set_driver_weights(self.weights)
        return self.result
