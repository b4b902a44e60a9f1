"""Generator calls, worker side: the values a call yields, sent as they come.

Each value goes to the caller in a ``STREAM_ITEM`` frame, the end in a ``STREAM_END``
frame (runtime/wire/protocol.py). The caller sends back ``STREAM_ITEM`` credits saying how far
it has read, which pace a generator called with ``_generator_backpressure_num_objects``.
A connection's open streams are in ``conn.info.streams`` by message id.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import TYPE_CHECKING

from ..wire import protocol

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["StreamOut", "open_stream", "send_item", "end_stream"]


class StreamOut:
    """Worker side of one generator call: how many values went out, and the caller's
    backpressure credit.

    The generator pauses once ``limit`` items sent are still unconsumed by the caller
    (Ray's ``_generator_backpressure_num_objects``; -1: never). Credits arrive on the loop;
    a sync generator waits on ``cond`` in its execution thread, an async one on ``event``.
    """

    __slots__ = ("limit", "consumed", "sent", "cond", "event")

    def __init__(self, limit: int):
        self.limit = limit
        self.consumed = 0
        self.sent = 0   # items handed out so far (written by the one thread that runs it)
        self.cond = threading.Condition()
        self.event: asyncio.Event | None = None

    def credit(self, consumed: int) -> None:
        """The caller has read ``consumed`` items (-1: it dropped the stream, no limit)."""
        with self.cond:
            self.consumed = sys.maxsize if consumed < 0 else max(self.consumed, consumed)
            self.cond.notify_all()
        if self.event is not None:
            self.event.set()

    def _ahead(self, sent: int) -> bool:
        return self.limit > 0 and sent - self.consumed >= self.limit

    def wait_credit(self, sent: int, conn: Connection) -> bool:
        """Block while too far ahead of the caller; False once the caller is gone."""
        if self._ahead(sent):
            with self.cond:
                # The timeout only re-checks conn.closed; credits wake us at once.
                while self._ahead(sent) and not conn.closed:
                    self.cond.wait(0.5)
        return not conn.closed

    async def await_credit(self, sent: int, conn: Connection) -> bool:
        """The same, on the event loop, for an async generator."""
        while self._ahead(sent) and not conn.closed:
            if self.event is None:
                self.event = asyncio.Event()
            self.event.clear()
            try:
                await asyncio.wait_for(self.event.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        return not conn.closed


def open_stream(conn: Connection, msg_id: int, limit: int) -> StreamOut:
    out = StreamOut(limit)
    if conn.info.streams is None:
        conn.info.streams = {}
    conn.info.streams[msg_id] = out
    return out


def send_item(conn: Connection, msg_id: int, index: int, kind: int, segs) -> None:
    """On the loop: the ``index``-th value, as a result frame of ``kind``."""
    if not conn.closed:
        conn.send_msg(protocol.STREAM_ITEM, msg_id,
                      [protocol.STREAM_ITEM_HEAD.pack(index, kind), *segs])


def end_stream(conn: Connection, msg_id: int, count: int) -> None:
    """On the loop: the generator is done after ``count`` values."""
    if conn.info.streams is not None:
        conn.info.streams.pop(msg_id, None)
    if not conn.closed:
        conn.send_msg(protocol.STREAM_END, msg_id, [protocol.STREAM_COUNT.pack(count)])
