"""Starting, watching and killing worker processes: a ``multiprocessing`` forkserver that
has already imported the worker package, numpy, cloudpickle and uvloop.

This is the only part of the node that touches processes; :class:`~pool.WorkerPool`
decides when, and tests give the pool a fake launcher instead.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import signal

from ..errors import DDLFError
from ..worker import worker_main

__all__ = ["ForkserverLauncher", "kill_pid"]

log = logging.getLogger("ddlf.node")


class ForkserverLauncher:
    """Starts each worker as ``worker_main(*args(w))`` in a forkserver child.

    ``args(w)`` gives a worker's arguments when it starts (they name the node's current
    id, which changes when it registers again).
    """

    def __init__(self, loop, args):
        self.loop = loop
        self._args = args
        self._ctx = multiprocessing.get_context("forkserver")
        # uvloop too: importing it costs each new worker 3 ms of CPU otherwise.
        self._ctx.set_forkserver_preload(
            ["ddlf_actors.runtime.worker", "numpy", "cloudpickle", "uvloop"])
        _skip_main_module_in_workers()

    async def start(self, w, on_exit) -> None:
        """Start ``w``'s process (off the loop: it talks to the forkserver); then call
        ``on_exit(w)`` on the loop when it exits. ``DDLFError`` if it cannot start."""
        w.process = self._ctx.Process(target=worker_main, name=f"ddlf-worker-{w.worker_id}",
                                      daemon=False, args=self._args(w))
        try:
            await self.loop.run_in_executor(None, w.process.start)
        except Exception as e:
            raise DDLFError(f"could not start a worker process: {e}") from e
        w.pid = w.process.pid
        _drop_parent_pipe(w.process)
        self.loop.add_reader(w.process.sentinel, on_exit, w)

    def reap(self, w) -> int | None:
        """On exit: stop watching ``w`` and collect its exit code."""
        try:
            self.loop.remove_reader(w.process.sentinel)
        except Exception as e:
            # The loop is closing (node shutdown): it watches nothing any more, and the
            # exit code below is all that is left to collect.
            log.debug("unwatching worker %s's exit: %r", w.worker_id, e)
        w.process.join(0)
        return w.process.exitcode

    def close(self, w) -> None:
        """Free an exited worker's process handle (its pipe). Not while another thread may
        still join it (shutdown)."""
        try:
            w.process.close()
        except ValueError:  # still running: cannot happen once its sentinel fired
            pass

    async def join(self, w, timeout: float) -> None:
        await self.loop.run_in_executor(None, w.process.join, timeout)

    def kill(self, w) -> None:
        kill_pid(w.pid)


def kill_pid(pid) -> None:
    """SIGKILL ``pid`` if there is one and it is still there."""
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _skip_main_module_in_workers() -> None:
    """Stop multiprocessing from re-running this process's ``__main__`` in every worker.

    Each process multiprocessing starts first re-executes the parent's main module (here
    the node daemon's own module, or the ``ddlf-node`` script) so that pickled references
    to ``__main__`` resolve. Workers never need it (their target is
    ``runtime.worker.worker_main``), and it cost each new worker about 7 ms of CPU: a
    third of an actor creation. The node runs no user code, so dropping the main-module
    entries from the start-up data is safe here; nothing else in the node uses them.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_ddlf_no_main", False):
        return

    def get_preparation_data(name):
        data = original(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    get_preparation_data._ddlf_no_main = True   # type: ignore[attr-defined]  # our marker
    spawn.get_preparation_data = get_preparation_data


def _drop_parent_pipe(process) -> None:
    """Close the spare pipe end multiprocessing keeps for each forkserver child.

    ``popen_forkserver`` holds a duplicate of the data pipe's write end for the child's
    whole life, only so that ``multiprocessing.parent_process().is_alive()`` works in the
    child. Workers watch the node by pid and by their control connection instead, so it
    is one descriptor per worker the node does not need (with it, a node held three per
    actor and hit a soft limit of 1024 at about 330 actors). If this Python's internals
    differ, the pipe is simply left open.
    """
    popen = getattr(process, "_popen", None)
    fin = getattr(popen, "finalizer", None)
    args = getattr(fin, "_args", None)
    sentinel = getattr(popen, "sentinel", None)
    if popen is None or fin is None or not (
            isinstance(args, tuple) and len(args) == 2 and args[1] == sentinel
            and isinstance(args[0], int)):
        return
    fin.cancel()
    popen.finalizer = multiprocessing.util.Finalize(
        popen, multiprocessing.util.close_fds, (sentinel,))   # type: ignore[attr-defined]
    try:
        os.close(args[0])
    except OSError:
        pass
