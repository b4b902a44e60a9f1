"""Generator calls, caller side: the streams of items that running calls yield.

Both submitters route a call's ``STREAM_ITEM`` and ``STREAM_END`` frames here
(``frame``); user threads read a :class:`~generators.Stream` through the
:class:`~generators.ObjectRefGenerator` that ``open`` returns, which calls back
``wait_stream``, ``stream_consumed``, ``stream_dropped`` and ``failed``. Each item
becomes an entry of the object store; backpressure credits go back on the connection
the items came from.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import shm_store
from ..wire import protocol
from ..wire.serialization import dumps
from .generators import DYNAMIC, STREAMING, DynamicObjectRefGenerator, ObjectRefGenerator, Stream
from .object_ref import ObjectRef
from .object_store import OK, ObjectStore, dumps_with_refs

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["Streams"]

log = logging.getLogger("ddlf.core")

_ITEM = protocol.STREAM_ITEM_HEAD
_CREDIT = protocol.STREAM_CREDIT
_NONE = dumps(None)   # the value of a streaming call's own ref once it has ended


class Streams:
    """Generator calls still running, by the id of the call's ref.

    ``submit(fn, *args)`` runs ``fn`` on the I/O thread (credits sent for a user thread).
    """

    def __init__(self, store: ObjectStore, submit):
        self.store = store
        self.cb_lock = store.cb_lock   # a reader registering vs an item arriving
        self.streams: dict[bytes, Stream] = {}
        self._submit = submit

    def open(self, ref: ObjectRef, nret, backpressure: int):
        """The caller's view of the generator call whose reply settles ``ref``: an
        ``ObjectRefGenerator`` (``"streaming"``) or ``ref`` itself (``"dynamic"``)."""
        store = self.store
        stream = Stream(ref.id, nret, backpressure if nret == STREAMING else -1)
        # The stream keeps the call's ref (so its entry, and the callback below) alive until
        # the call ends, whatever the caller drops meanwhile.
        stream.call_ref = ObjectRef(ref.id, store.owner)
        self.streams[ref.id] = stream
        # Whatever settles the call's ref (the end frame, a lost worker, a failed
        # dependency) ends the stream.
        store.on_done(store.objects[ref.id], lambda: self._closed(stream))
        return ObjectRefGenerator(ref, stream, self) if nret == STREAMING else ref

    # -- frames (I/O thread) --------------------------------------------------------------------
    def frame(self, conn: Connection, kind: int, msg_id: int, obj_id: bytes, segs) -> None:
        """A STREAM_ITEM or STREAM_END frame of the generator call ``obj_id`` (I/O thread)."""
        stream = self.streams.get(obj_id)
        if kind == protocol.STREAM_END:
            if stream is not None:
                self._end(stream)
            return
        try:
            index, item_kind = _ITEM.unpack(segs[1])
        except Exception:
            conn.abort()   # a malformed frame: this connection cannot be trusted further
            return
        item = [None, *segs[2:]]
        if item_kind == protocol.RESULT_SHM:
            # Mapped (and acknowledged) even when discarded, so the worker unpins it.
            item_kind, item = shm_store.client_result(conn, item)
        if stream is None:
            return
        if stream.released:
            # The caller dropped the generator: its items are discarded, as in Ray, and a
            # paused generator (this run, or a retried one) is told to go on to its end.
            if stream.limit > 0 and conn is not stream.conn:
                stream.conn, stream.msg_id = conn, msg_id
                self._send_credit(stream)
            return
        stream.conn, stream.msg_id = conn, msg_id
        if index < len(stream.items):
            # A retried call replays what it yielded before: keep the first copies, and
            # tell the new run how far the caller has got.
            if stream.limit > 0 and stream.consumed:
                self._send_credit(stream)
            return
        if index != len(stream.items) or item_kind not in (
                protocol.RESULT_OK, protocol.RESULT_REFS, protocol.RESULT_ERR):
            conn.abort()
            return
        ref = self.store.new_ref()
        self.store.complete_result(ref.id, item_kind, item)
        with self.cb_lock:
            stream.items.append(ref)
        self._changed(stream)

    def _end(self, stream: Stream) -> None:
        self.streams.pop(stream.parent_id, None)
        if stream.mode == DYNAMIC:
            segs, contained = dumps_with_refs(DynamicObjectRefGenerator(stream.items))
            self.store.complete(stream.parent_id, OK, segs, contained=contained)
        else:
            self.store.complete(stream.parent_id, OK, _NONE)

    def _closed(self, stream: Stream) -> None:
        self.streams.pop(stream.parent_id, None)
        self._changed(stream, ended=True)
        stream.call_ref = None

    def _changed(self, stream: Stream, ended: bool = False) -> None:
        with self.cb_lock:
            if ended:
                stream.ended = True
            wakers, stream.wakers = stream.wakers, []
        for wake in wakers:
            try:
                wake()
            except Exception:
                log.exception("error waking a generator's reader")
        self.store.notify_waiters()

    # -- the reader's side (user threads) ---------------------------------------------------------
    def wait_stream(self, predicate, timeout: float | None) -> None:
        """Block a user thread until ``predicate()`` (a stream changed) or ``timeout``."""
        self.store.wait_for(predicate, timeout)

    def failed(self, ref: ObjectRef) -> bool:
        return self.store.failed(ref)

    def stream_consumed(self, stream: Stream, count: int) -> None:
        """The caller took ``count`` refs so far: under backpressure, let the worker go on."""
        stream.consumed = count
        if stream.limit > 0 and not stream.released:
            self._submit(self._send_credit, stream)

    def stream_dropped(self, stream: Stream) -> None:
        """The ObjectRefGenerator is gone: discard later items, lift the backpressure (the
        generator runs to its end, as in Ray)."""
        if self.store.closed or stream.ended:
            return
        stream.released = True
        self._submit(self._release, stream)

    def _release(self, stream: Stream) -> None:
        if stream.limit > 0:
            self._send_credit(stream)   # or at its next item, if none has come yet

    def _send_credit(self, stream: Stream) -> None:
        conn = stream.conn
        if conn is not None and not conn.closed:
            credit = -1 if stream.released else stream.consumed
            conn.send_msg(protocol.STREAM_ITEM, stream.msg_id, [_CREDIT.pack(credit)])
