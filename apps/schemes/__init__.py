"""The training schemes: synchronous (Algorithm 6) and asynchronous (Algorithm 3, SSP)."""

from .asynchronous import AsyncScheme, train_async
from .base import Scheme, TooFewTrainersError
from .pool import TrainerPool, TrainerStartError
from .sync import SyncScheme, train_sync

__all__ = ["train_sync", "train_async", "Scheme", "SyncScheme", "AsyncScheme",
           "TrainerPool", "TrainerStartError", "TooFewTrainersError"]
