"""The training schemes, by name (``registry.py``), and ``train()`` for any of them.

- ``sync``: Algorithm 6, averaging in rounds, with an outer optimizer (``sync.py``);
- ``async``: Algorithm 3 with SSP (``asynchronous.py``);
- ``allreduce``: the trainers average among themselves over a ring, with the same
  outer optimizer as sync (``allreduce.py``);
- ``easgd``: elastic averaging SGD (``easgd.py``);
- ``downpour``: Downpour SGD (``downpour.py``).

A new scheme is one module with a ``Scheme`` subclass and one ``register`` line below.
"""

from . import registry
from .allreduce import AllreduceScheme, CollectiveError, WeightsLostError, train_allreduce
from .api import train
from .asynchronous import AsyncScheme, train_async
from .base import Scheme, TooFewTrainersError
from .downpour import DownpourScheme
from .easgd import EasgdScheme
from .outer import OuterOptimizer
from .pool import TrainerPool, TrainerStartError
from .registry import UnknownSchemeError, register
from .sync import SyncScheme, train_sync

register("sync", SyncScheme)
register("async", AsyncScheme)
register("allreduce", AllreduceScheme)
register("easgd", EasgdScheme)
register("downpour", DownpourScheme)

__all__ = ["train", "train_sync", "train_async", "train_allreduce", "register", "registry",
           "Scheme", "SyncScheme", "AsyncScheme", "AllreduceScheme", "EasgdScheme",
           "DownpourScheme", "OuterOptimizer", "TrainerPool", "TrainerStartError",
           "TooFewTrainersError", "UnknownSchemeError", "WeightsLostError", "CollectiveError"]
