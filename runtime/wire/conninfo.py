"""What the code handling one connection keeps about it: a typed object with slots.

Every :class:`~.connection.Connection` carries one as ``conn.info``. Each field belongs to
one role (the RPC layer, the shared-memory path, the head, a node, a worker, a task
caller); a field stays None until its owner first needs it, so a connection that never
uses a feature pays nothing for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..head.nodes import NodeRecord
    from ..node.pool import WorkerProc
    from ..worker.stream_out import StreamOut

__all__ = ["ConnInfo"]


class ConnInfo:
    """Per-connection state, by owner. All fields start as None (False for flags)."""

    __slots__ = ("rpc_pending", "shm_peer", "shm_pins", "hello_seen", "hello_waiter",
                 "node", "owner_id", "job_id", "worker", "streams", "objects", "demand",
                 "funcs")

    def __init__(self) -> None:
        # rpc.py: requests sent on this connection awaiting a reply, by message id.
        self.rpc_pending: dict[int, asyncio.Future] | None = None
        # shm_store.py: whether the peer shares this host's shared memory; objects sent
        # to it as descriptors, kept mapped until it acknowledges them (pin -> segments);
        # a caller's wait for the worker's hello that says whether memory is shared.
        self.shm_peer: bool = False
        self.shm_pins: dict[bytes, Any] | None = None
        self.hello_seen: bool = False
        self.hello_waiter: asyncio.Future | None = None
        # The head: the node this connection registered (a node daemon's), the owner id
        # of its actors and its job id (a driver's or a calling worker's).
        self.node: NodeRecord | None = None
        self.owner_id: str | None = None
        self.job_id: str | None = None
        # A node daemon: the worker process on the other end.
        self.worker: WorkerProc | None = None
        # A worker, per caller: the generator calls streaming to it (by message id), the
        # objects it shipped, and its lease's resources (a task caller's).
        self.streams: dict[int, StreamOut] | None = None
        self.objects: set[bytes] | None = None
        self.demand: dict | None = None
        # A task caller: the functions already sent on this lease's connection.
        self.funcs: set[bytes] | None = None

    def __repr__(self) -> str:
        set_fields = {k: getattr(self, k) for k in self.__slots__
                      if getattr(self, k) not in (None, False)}
        return f"ConnInfo({set_fields})"
