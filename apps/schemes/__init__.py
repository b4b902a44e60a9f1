"""The training schemes, by name (``registry.py``), and ``train()`` for any of them.

- ``sync``: Algorithm 6, averaging in rounds, with an outer optimizer (``sync.py``);
- ``async``: Algorithm 3 with SSP (``asynchronous.py``);
- ``allreduce``: the trainers average among themselves over a ring, with the same
  outer optimizer as sync (``allreduce.py``);
- ``easgd``: elastic averaging SGD (``easgd.py``);
- ``downpour``: Downpour SGD (``downpour.py``);
- ``dataparallel``: a gradient all-reduce every step over allreduce's ring, as DDP
  (``dataparallel.py``);
- ``auto``, ``train()``'s default: ``allreduce`` with its steps per round and codec chosen
  from K, the model's size and a start-up probe of the trainers (``auto.py``).

Each is a state machine (``machine.py``) that one driver loop runs over a backend
(``driver.py``). A new scheme is one module with its options and its machine, and one
``register`` line below (``docs/training.md`` shows a whole one).
"""

from . import registry
from .allreduce import AllreduceMachine, AllreduceOptions, CollectiveError, WeightsLostError
from .api import resolve_options, split_options, train, train_allreduce, train_async, train_sync
from .asynchronous import AsyncMachine, AsyncOptions
from .auto import AutoMachine, AutoOptions
from .dataparallel import DataParallelMachine, DataParallelOptions
from .downpour import DownpourMachine, DownpourOptions
from .driver import Driver
from .easgd import EasgdMachine, EasgdOptions
from .errors import TooFewTrainersError, TrainerStartError
from .machine import Machine
from .outer import OuterOptimizer
from .pool import TrainerPool
from .registry import UnknownSchemeError, register
from .sync import SyncMachine, SyncOptions

register("sync", SyncMachine)
register("async", AsyncMachine)
register("allreduce", AllreduceMachine)
register("easgd", EasgdMachine)
register("downpour", DownpourMachine)
register("auto", AutoMachine)
register("dataparallel", DataParallelMachine)

__all__ = ["train", "train_sync", "train_async", "train_allreduce", "register", "registry",
           "resolve_options", "split_options", "Machine", "Driver", "SyncMachine",
           "SyncOptions", "AsyncMachine", "AsyncOptions", "AllreduceMachine",
           "AllreduceOptions", "EasgdMachine", "EasgdOptions", "DownpourMachine",
           "DownpourOptions", "AutoMachine", "AutoOptions",
           "DataParallelMachine", "DataParallelOptions", "OuterOptimizer", "TrainerPool",
           "TrainerStartError",
           "TooFewTrainersError", "UnknownSchemeError", "WeightsLostError", "CollectiveError"]
