"""The training schemes, by name (``registry.py``), and ``train()`` for any of them.

- ``sync``: Algorithm 6, averaging in rounds, with an outer optimizer (``sync.py``);
- ``async``: Algorithm 3 with SSP (``asynchronous.py``);
- ``easgd``: elastic averaging SGD (``easgd.py``);
- ``downpour``: Downpour SGD (``downpour.py``).

A new scheme is one module with a ``Scheme`` subclass and one ``register`` line below.
"""

from . import registry
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
register("easgd", EasgdScheme)
register("downpour", DownpourScheme)
# register("allreduce", AllreduceScheme)   <- the allreduce scheme's line goes here

__all__ = ["train", "train_sync", "train_async", "register", "registry", "Scheme",
           "SyncScheme", "AsyncScheme", "EasgdScheme", "DownpourScheme", "OuterOptimizer",
           "TrainerPool", "TrainerStartError", "TooFewTrainersError", "UnknownSchemeError"]
