"""The node daemon: one per host. Starts, watches and kills worker processes.

Workers come from a ``forkserver`` that has already imported the worker package, numpy
and cloudpickle, and the daemon keeps a few of them started ahead of need, so creating
an actor costs handing its class to an idle worker rather than starting Python.

========== =================================================================================
module     holds
========== =================================================================================
daemon     ``NodeDaemon``: the head link (register, heartbeat, its requests) and the wiring
pool       ``WorkerPool``, ``WorkerProc``: workers from start to exit, idle ones by env
launcher   ``ForkserverLauncher``: the processes themselves (start, watch, kill, reap)
gpus       ``GpuAllocator``: which GPU ids each worker holds; ``detect_gpus``
logs       ``LogTailer``: worker output, read as it is written and sent to the head
main       ``run_node`` and ``main`` (``python -m ddlf_actors.runtime.node``)
========== =================================================================================
"""

from .daemon import NodeDaemon
from .gpus import GpuAllocator, detect_gpus
from .logs import LogTailer
from .main import main, run_node
from .pool import WorkerPool, WorkerProc

__all__ = ["NodeDaemon", "WorkerPool", "WorkerProc", "GpuAllocator", "LogTailer",
           "detect_gpus", "main", "run_node"]
