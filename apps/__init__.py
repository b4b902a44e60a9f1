"""Training on DDLF actors: the paper's App API, TrainerActor and the schemes.

    import ddlf_actors as ddlf
    from ddlf_actors.apps import models, train, train_sync

    ddlf.init()
    result = train_sync(models.paper_cnn, "fashion-mnist", workers=2, master_epochs=2)
    print(result.history[-1]["test_accuracy"])
    result = train(models.paper_cnn, "fashion-mnist", scheme="easgd", workers=2)

TensorFlow is imported only inside trainers and when a result's model is built, never
when this package is imported.
"""

from . import checkpoint, codecs, datasets, models
from .app import App
from .callbacks import (
    Callback,
    CsvLogger,
    EarlyStopping,
    EventLog,
    History,
    ProgressBar,
    TensorBoard,
)
from .checkpoint import CheckpointMismatchError
from .config import ConfigError, TrainConfig
from .result import TrainResult
from .schemes import (
    TooFewTrainersError,
    TrainerStartError,
    UnknownSchemeError,
    train,
    train_allreduce,
    train_async,
    train_sync,
)
from .trainer import TrainerActor

__all__ = [
    "App",
    "TrainerActor",
    "datasets",
    "models",
    "train",
    "codecs",
    "train_sync",
    "train_async",
    "train_allreduce",
    "UnknownSchemeError",
    "TrainConfig",
    "ConfigError",
    "TrainResult",
    "TrainerStartError",
    "TooFewTrainersError",
    "CheckpointMismatchError",
    "checkpoint",
    "EventLog",
    "Callback",
    "History",
    "ProgressBar",
    "EarlyStopping",
    "CsvLogger",
    "TensorBoard",
]
