"""What callers send a worker, frame by frame (runtime/wire/protocol.py), through one table.

Calls go to the decoder and the runner; objects and task code to their caches; a
cancel, a generator's credit, a fetch and the shared-memory hello and acks to their
owners. Any other kind drops the caller's connection (runtime/wire/frames.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import shm_store
from ..client import oob
from ..wire import protocol
from ..wire.frames import TableFrameHandler
from ..wire.serialization import loads
from .env import apply_sys_path

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["CallerFrames"]


class CallerFrames(TableFrameHandler):
    """The handler of every caller connection of one worker."""

    __slots__ = ("worker",)

    def __init__(self, worker):
        self.worker = worker

    def _on_call(self, conn: Connection, kind, msg_id, segs):
        w = self.worker
        if w.exit_status is not None:
            return  # exiting: the connection closes soon, failing this call
        decoder = w.decoder
        call = (decoder.actor_call if w.is_actor else decoder.task_call)(conn, msg_id, segs)
        if call is not None:
            w.runner.run(call)

    def _on_object(self, conn: Connection, kind, msg_id, segs):
        obj_id = bytes(segs[1])
        self.worker.objects.add(obj_id, segs[2:])
        _shipped_by(conn).add(obj_id)

    def _on_shm_object(self, conn: Connection, kind, msg_id, segs):
        obj_id, obj_segs = shm_store.worker_object(conn, segs)
        if obj_segs is not None:
            self.worker.objects.add(obj_id, obj_segs)
            _shipped_by(conn).add(obj_id)

    def _on_free(self, conn: Connection, kind, msg_id, segs):
        ids = bytes(segs[1])
        owned = _shipped_by(conn)
        objects = self.worker.objects
        for i in range(0, len(ids), 16):
            obj_id = ids[i : i + 16]
            objects.drop(obj_id)
            owned.discard(obj_id)

    def _on_function(self, conn: Connection, kind, msg_id, segs):
        self.worker.decoder.functions[bytes(segs[1])] = segs[2:]

    def _on_push(self, conn: Connection, kind, msg_id, segs):
        event, data = loads(segs[1:])
        if event == "hello":
            apply_sys_path(data.get("sys_path", ()), data.get("cwd"))
            conn.info.demand = data.get("demand")   # a lease's resources, for tasks
            conn.info.shm_peer = shm_store.same_host(data.get("shm"))
            shm_store.send_hello(conn)   # the caller waits for ours before its first call

    def _on_shm_ack(self, conn: Connection, kind, msg_id, segs):
        shm_store.on_ack(conn, segs)

    def _on_credit(self, conn: Connection, kind, msg_id, segs):
        """A STREAM_ITEM from the caller: its backpressure credit for a generator call."""
        streams = conn.info.streams
        out = streams.get(msg_id) if streams is not None else None
        try:
            consumed = protocol.STREAM_CREDIT.unpack(segs[1])[0]
        except Exception:
            conn.abort()
            return
        if out is not None:
            out.credit(consumed)

    def _on_fetch(self, conn: Connection, kind, msg_id, segs):
        oob.serve_fetch(conn, msg_id, segs, self.worker.loop)

    def _on_cancel(self, conn: Connection, kind, msg_id, segs):
        flags = bytes(segs[1])[0] if len(segs) > 1 and len(segs[1]) else 0
        self.worker.runner.cancel(conn, msg_id, flags)

    FRAMES = {protocol.CALL: _on_call, protocol.OBJ: _on_object, protocol.FREE: _on_free,
              protocol.FUNC: _on_function, protocol.PUSH: _on_push,
              protocol.OBJ_SHM: _on_shm_object, protocol.SHM_ACK: _on_shm_ack,
              protocol.STREAM_ITEM: _on_credit, protocol.FETCH: _on_fetch,
              protocol.CANCEL: _on_cancel}

    def connection_closed(self, conn: Connection, exc):
        w = self.worker
        w.callers.discard(conn)
        info = conn.info
        for out in (info.streams or {}).values():
            out.credit(-1)   # wake paused generators: they see the caller is gone and stop
        for obj_id in info.objects or ():
            w.objects.drop(obj_id)
        info.shm_pins = None


def _shipped_by(conn: Connection) -> set[bytes]:
    """The ids of the objects the caller on ``conn`` shipped here (dropped when it leaves)."""
    objects = conn.info.objects
    if objects is None:
        objects = conn.info.objects = set()
    return objects
