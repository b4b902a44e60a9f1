"""``Queue``: a first-in first-out queue held by an actor, shared by drivers, tasks and actors.

Ray's ``ray.util.queue`` API: ``put``/``get`` block (optionally with a timeout) and raise
:class:`Full`/:class:`Empty`; ``*_nowait`` and ``*_nowait_batch`` never block. Pass the
``Queue`` itself to tasks and actors: it pickles as a handle to the same queue actor.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Queue", "Empty", "Full"]

# The queue actor answers every call at once or parks it on its event loop; a parked
# get/put costs a coroutine, not a thread, so allow many (Ray's default for async actors).
_QUEUE_CONCURRENCY = 1000


class Empty(Exception):
    """``get`` found the queue empty (``block=False``) or waited ``timeout`` in vain."""


class Full(Exception):
    """``put`` found the queue full (``block=False``) or waited ``timeout`` in vain."""


class _QueueActor:
    # Replies are (ok, value) pairs instead of raised exceptions: an empty or full queue
    # is an ordinary outcome, so it costs no remote traceback.
    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.queue: asyncio.Queue | None = None

    def _q(self) -> asyncio.Queue:
        # Created on first use, inside the actor's event loop.
        if self.queue is None:
            self.queue = asyncio.Queue(self.maxsize)
        return self.queue

    async def qsize(self) -> int:
        return self._q().qsize()

    async def empty(self) -> bool:
        return self._q().empty()

    async def full(self) -> bool:
        return self._q().full()

    async def put(self, item, timeout=None):
        try:
            await asyncio.wait_for(self._q().put(item), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def put_nowait(self, item) -> bool:
        try:
            self._q().put_nowait(item)
            return True
        except asyncio.QueueFull:
            return False

    async def put_nowait_batch(self, items) -> bool:
        q = self._q()
        if self.maxsize > 0 and len(items) + q.qsize() > self.maxsize:
            return False
        for item in items:
            q.put_nowait(item)
        return True

    async def get(self, timeout=None):
        try:
            return True, await asyncio.wait_for(self._q().get(), timeout)
        except asyncio.TimeoutError:
            return False, None

    async def get_nowait(self):
        try:
            return True, self._q().get_nowait()
        except asyncio.QueueEmpty:
            return False, None

    async def get_nowait_batch(self, num_items: int):
        q = self._q()
        if num_items > q.qsize():
            return False, q.qsize()
        return True, [q.get_nowait() for _ in range(num_items)]


class Queue:
    """A queue of at most ``maxsize`` items (``maxsize <= 0``: unbounded).

    ``actor_options`` go to the queue actor's ``.options()`` (e.g. ``num_cpus``, ``name``).
    """

    def __init__(self, maxsize: int = 0, actor_options: dict | None = None):
        from ddlf_actors.api import remote

        options = {"num_cpus": 0, "max_concurrency": _QUEUE_CONCURRENCY, **(actor_options or {})}
        self.maxsize = maxsize
        self.actor = remote(_QueueActor).options(**options).remote(maxsize)

    def __len__(self) -> int:
        return self.size()

    def size(self) -> int:
        """The number of items in the queue now."""
        return _get(self.actor.qsize.remote())

    def qsize(self) -> int:
        return self.size()

    def empty(self) -> bool:
        return _get(self.actor.empty.remote())

    def full(self) -> bool:
        return _get(self.actor.full.remote())

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item``; wait up to ``timeout`` s (forever if None) for room, then raise Full."""
        if not block:
            return self.put_nowait(item)
        _check_timeout(timeout)
        if not _get(self.actor.put.remote(item, timeout)):
            raise Full(f"the queue stayed full (maxsize={self.maxsize}) for {timeout} s")

    async def put_async(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """``put`` for ``async`` code: awaits instead of blocking the thread."""
        if not block:
            if not await self.actor.put_nowait.remote(item):
                raise Full(f"the queue is full (maxsize={self.maxsize})")
            return
        _check_timeout(timeout)
        if not await self.actor.put.remote(item, timeout):
            raise Full(f"the queue stayed full (maxsize={self.maxsize}) for {timeout} s")

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return the oldest item; wait up to ``timeout`` s, then raise Empty."""
        if not block:
            return self.get_nowait()
        _check_timeout(timeout)
        ok, item = _get(self.actor.get.remote(timeout))
        if not ok:
            raise Empty(f"the queue stayed empty for {timeout} s")
        return item

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """``get`` for ``async`` code: awaits instead of blocking the thread."""
        if not block:
            ok, item = await self.actor.get_nowait.remote()
            if not ok:
                raise Empty("the queue is empty")
            return item
        _check_timeout(timeout)
        ok, item = await self.actor.get.remote(timeout)
        if not ok:
            raise Empty(f"the queue stayed empty for {timeout} s")
        return item

    def put_nowait(self, item: Any) -> None:
        """Add ``item`` now or raise Full."""
        if not _get(self.actor.put_nowait.remote(item)):
            raise Full(f"the queue is full (maxsize={self.maxsize})")

    def put_nowait_batch(self, items) -> None:
        """Add all ``items`` now, or none of them and raise Full."""
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"put_nowait_batch expects a list of items, got {type(items).__name__}")
        if not _get(self.actor.put_nowait_batch.remote(list(items))):
            raise Full(f"cannot add {len(items)} items: the queue would exceed "
                       f"maxsize={self.maxsize}")

    def get_nowait(self) -> Any:
        """Remove and return the oldest item now, or raise Empty."""
        ok, item = _get(self.actor.get_nowait.remote())
        if not ok:
            raise Empty("the queue is empty")
        return item

    def get_nowait_batch(self, num_items: int) -> list:
        """Remove and return the ``num_items`` oldest items now, or none and raise Empty."""
        if not isinstance(num_items, int) or num_items < 0:
            raise ValueError(f"num_items must be an int >= 0, got {num_items!r}")
        ok, items = _get(self.actor.get_nowait_batch.remote(num_items))
        if not ok:
            raise Empty(f"cannot get {num_items} items: the queue holds {items}")
        return items

    def shutdown(self, force: bool = False, grace_period_s: int = 5) -> None:
        """Stop the queue actor; its items are lost and later calls raise ``ActorDiedError``.

        DDLF kills the actor at once (calls in flight fail) whatever ``force`` and
        ``grace_period_s`` say; they are accepted for Ray compatibility.
        """
        from ddlf_actors.api import kill

        if self.actor is not None:
            kill(self.actor)
        self.actor = None


def _get(ref):
    from ddlf_actors.api import get

    return get(ref)


def _check_timeout(timeout):
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be None or a number >= 0, got {timeout!r}")
