"""Generator calls, caller side: what ``f.remote()`` returns when ``f`` yields.

* ``num_returns="streaming"`` (the default for a generator function or method, as in
  Ray >= 2.8): an :class:`ObjectRefGenerator`. Each yielded value becomes its own object
  as soon as the worker yields it; ``next(gen)`` (or ``async for``) hands out its ref.
* ``num_returns="dynamic"``: one ref whose value, once the generator has finished, is a
  :class:`DynamicObjectRefGenerator` (a list of refs, one per yielded value).

The worker sends one ``STREAM_ITEM`` frame per value and a ``STREAM_END`` frame at the
end (runtime/wire/protocol.py). The core's I/O thread turns each item into a ref and appends
it to the call's :class:`Stream`; user threads read the stream. The call's own ref
(``gen.completed()``) settles when the stream ends: with None, or with the error that
ended it early (the worker died, a dependency failed).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..wire.connection import Connection
    from .object_ref import ObjectRef

__all__ = ["ObjectRefGenerator", "DynamicObjectRefGenerator", "Stream", "STREAMING", "DYNAMIC"]

log = logging.getLogger("ddlf.core")

STREAMING = "streaming"
DYNAMIC = "dynamic"


class Stream:
    """One generator call's items as the caller receives them.

    Written by the core's I/O thread (``items``, ``ended``), read by user threads;
    ``Streams.cb_lock`` (runtime/client/streams.py) orders an arrival against a waiter registering (``wakers``).
    """

    __slots__ = ("parent_id", "mode", "items", "ended", "limit", "consumed", "conn",
                 "msg_id", "wakers", "released", "call_ref")

    def __init__(self, parent_id: bytes, mode: str, limit: int):
        self.parent_id = parent_id
        self.mode = mode
        self.items: list = []        # ObjectRef per index; None once handed out
        self.ended = False           # the call's ref has settled: no more items
        self.limit = limit           # backpressure: unconsumed items allowed (-1: off)
        self.consumed = 0
        self.conn: Connection | None = None   # where the items come from (credits go back there)
        self.msg_id = 0
        self.wakers: list = []       # callables run (on the I/O thread) at the next change
        self.released = False        # backpressure lifted: the caller dropped the stream
        self.call_ref: ObjectRef | None = None   # the call's ObjectRef, held until the call ends


class ObjectRefGenerator:
    """The refs of a streaming generator call, in the order the values were yielded.

    ``for ref in gen``, ``next(gen)``, ``async for ref in gen`` and
    ``await gen.__anext__()`` return each ref as soon as the worker has yielded its value
    (they block, or suspend, until then). An exception raised by the remote generator
    arrives as the ref at its position: ``ddlf.get`` on it re-raises it with the remote
    traceback; iteration then stops. If the worker dies, the next ref raises the
    worker-died error (``WorkerCrashedError``, ``ActorDiedError``) and iteration stops.
    ``ddlf.wait([gen])`` treats ``gen`` as ready when ``next(gen)`` would not block.
    """

    def __init__(self, generator_ref, stream: Stream, streams):
        self._generator_ref = generator_ref
        self._stream = stream
        self._streams = streams   # runtime/client/streams.py's Streams of the owning core
        self._next = 0
        self._error_given = False

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        return self._next_sync(None)

    def _next_sync(self, timeout_s: float | None = None):
        """The next ref; None if none arrived within ``timeout_s`` seconds.

        Raises ``StopIteration`` at the end of the stream.
        """
        if not self._settled():
            self._streams.wait_stream(self._settled, timeout_s)
            if not self._settled():
                return None
        return self._take()

    def __aiter__(self):
        return self

    async def __anext__(self):
        loop = asyncio.get_running_loop()
        while not self._settled():
            fut = loop.create_future()

            def wake(fut=fut):
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

            with self._streams.cb_lock:
                if not self._settled():
                    self._stream.wakers.append(wake)
                    wait = True
                else:
                    wait = False
            if wait:
                await fut
        try:
            return self._take()
        except StopIteration:
            raise StopAsyncIteration from None

    def _settled(self) -> bool:
        """True when taking the next ref cannot block (a ref is there, or the end is)."""
        s = self._stream
        return self._next < len(s.items) or s.ended

    def _take(self):
        s = self._stream
        i = self._next
        if i < len(s.items):
            ref = s.items[i]
            s.items[i] = None   # a consumed ref lives as long as the caller keeps it
            self._next = i + 1
            self._streams.stream_consumed(s, self._next)
            return ref
        if not self._error_given and self._streams.failed(self._generator_ref):
            # Ended early by a system error: hand it out once, as Ray does.
            self._error_given = True
            return self._generator_ref
        raise StopIteration

    # -- Ray's inspection methods -------------------------------------------------------------
    def completed(self):
        """A ref that settles when the generator call ends: its value is None, or ``get``
        raises the error that ended the call early (e.g. the worker died). An exception
        raised by the generator itself arrives as an item, not here."""
        return self._generator_ref

    def next_ready(self) -> bool:
        """True when ``next(gen)`` returns a ref without blocking (False at the end)."""
        s = self._stream
        return self._next < len(s.items) or (
            s.ended and not self._error_given and self._streams.failed(self._generator_ref))

    def is_finished(self) -> bool:
        """True when the call has ended and every ref has been handed out."""
        return self._stream.ended and not self.next_ready()

    # -- lifetime -------------------------------------------------------------------------------
    _debug = staticmethod(log.debug)   # held by the class (see ObjectRef._debug)

    def __del__(self):
        try:
            self._streams.stream_dropped(self._stream)
        except Exception as e:
            # Interpreter exit, or the core closed: the call's stream and its worker link
            # are gone with it, so there is no backpressure left to lift.
            self._debug("dropping a generator after shutdown: %r", e)

    def __reduce__(self):
        raise TypeError("an ObjectRefGenerator cannot be passed to another process; iterate "
                        "it here and pass the refs (or use num_returns='dynamic', whose "
                        "value is a list of refs that can travel)")

    def __repr__(self):
        return f"ObjectRefGenerator({self._generator_ref.hex()})"


class DynamicObjectRefGenerator:
    """The value of a ``num_returns="dynamic"`` call: one ref per yielded value.

    Iterate it (or ``len`` it); unlike :class:`ObjectRefGenerator` it can be passed to
    other tasks and actors, and the refs travel with it.
    """

    def __init__(self, refs: list):
        self._refs = list(refs)

    def __iter__(self):
        return iter(self._refs)

    def __len__(self):
        return len(self._refs)

    def __repr__(self):
        return f"DynamicObjectRefGenerator({len(self._refs)} refs)"
