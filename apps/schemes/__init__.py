"""The training schemes: synchronous (Algorithm 6), asynchronous (Algorithm 3, SSP) and
allreduce (the trainers average among themselves)."""

from .allreduce import AllreduceScheme, CollectiveError, WeightsLostError, train_allreduce
from .asynchronous import AsyncScheme, train_async
from .base import Scheme, TooFewTrainersError
from .pool import TrainerPool, TrainerStartError
from .sync import SyncScheme, train_sync

__all__ = ["train_sync", "train_async", "train_allreduce", "Scheme", "SyncScheme", "AsyncScheme",
           "AllreduceScheme", "TrainerPool", "TrainerStartError", "TooFewTrainersError",
           "WeightsLostError", "CollectiveError"]
