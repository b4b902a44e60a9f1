"""What a worker process knows about the cluster it belongs to.

Set by :mod:`worker` at start-up; read by the client core so that code running inside
an actor or task can call other actors without an explicit ``init``.
"""

from __future__ import annotations

import threading

__all__ = ["WorkerContext", "current", "running_task", "set_running_task"]


class WorkerContext:
    def __init__(self, head_address: str, token: str, node_id: str, worker_id: str):
        self.head_address = head_address
        self.token = token
        self.node_id = node_id
        self.worker_id = worker_id
        self.actor_id: str | None = None
        self.job_id: str | None = None
        # The runtime env this worker runs in (wire form): the parent of what it submits.
        self.runtime_env: dict | None = None
        self.gpu_ids: list = []      # GPUs assigned to this worker (its CUDA_VISIBLE_DEVICES)
        # The placement group this actor or task runs in: {"group_id", "bundles",
        # "capture"}, or None. With "capture", work it submits joins the group too.
        self.placement: dict | None = None
        self.address: str | None = None   # this worker's server, once it listens


current: WorkerContext | None = None


# True on the thread that runs a task, while it runs: a ``get`` there lends the task's
# CPU back to the scheduler (as Ray does), so nested tasks cannot deadlock.
_thread = threading.local()


def running_task() -> bool:
    return getattr(_thread, "task", False)


def set_running_task(flag: bool) -> None:
    _thread.task = flag
