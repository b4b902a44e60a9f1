"""The worker process: becomes one actor, or runs tasks from a pool.

A node daemon starts workers ahead of need (through a forkserver that has already
imported this package, numpy and cloudpickle), so creating an actor only costs handing
its class to an idle worker. Callers connect to the worker directly; the data path
never relays through the node or the head.

Execution model (as in Ray's core worker):

* The event loop thread only does I/O: it authenticates callers, parses frames,
  resolves arguments and sends replies. It never runs user code that may block.
* Sync methods, sync tasks and the actor's ``__init__`` run on an execution thread
  (:class:`~.executor.Executor`), in the order their frames arrived, so calls from one
  caller run in submission order. A minute-long ``train`` call therefore leaves the
  worker answering pings, accepting new callers and flushing replies. With
  ``max_concurrency > 1`` there are that many execution threads, and calls may overlap.
* ``async def`` methods run as tasks on the loop, at most ``max_concurrency`` at once.
* Objects (``OBJ`` frames) and task code (``FUNC`` frames) arrive once per connection
  and are cached until the owner frees them or the connection closes.

A worker exits as soon as its connection to the node daemon closes, so a node that
dies (even by SIGKILL) leaves no orphaned workers behind.

One call's path through the package::

    frames.CallerFrames   a CALL frame arrives (one handler table for every kind)
    decode.CallDecoder    its body -> CallSpec/TaskSpec (once), code found, args resolved
    call.Call             the decoded call, from arrival to reply
    runner.Runner         run on a thread or the loop; values -> frames (results.py,
                          stream_out.py); the one cancel rule; the reply
    worker.Worker         the process: its node's requests, an actor's start and exit

``main.worker_main`` is the process's entry point.
"""

from .env import apply_sys_path
from .main import worker_main
from .worker import Worker

__all__ = ["worker_main", "apply_sys_path", "Worker"]
