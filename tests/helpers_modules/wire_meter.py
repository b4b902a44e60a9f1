"""Counts the bytes that this process's DDLF connections write and read.

Everything a driver exchanges with the head, nodes and workers goes through
``runtime.wire.connection.Connection``: frames are queued and written in ``Connection.flush``,
and every read after the handshake is reported to the connection's ``FrameDecoder``
(``buffer_updated``). Wrapping those two counts what crossed this process's sockets, frame
headers and control messages included, but not the authentication handshake (nor a frame
that arrives in the handshake's last read, which never happens to a driver: its peers
speak only when spoken to). The decoder, not the protocol: uvloop keeps the protocol's
``buffer_updated`` bound from when the connection opened, so patching that would miss
connections opened earlier.

Objects of 1 MiB or more sent to a worker on the same host travel through shared memory
(``runtime/shm_store.py``) and are counted here only as their descriptor; set
``DDLF_SHM=0`` before the cluster starts to send them over the socket and count them.
Used by ``tests/apps/test_allreduce.py`` and ``benchmarks/training/allreduce_bench.py``.
"""

from __future__ import annotations

import contextlib
import threading

from ddlf_actors.runtime.wire import connection, framing

__all__ = ["WireMeter", "metering"]


class WireMeter:
    """Running totals: ``sent``, ``received`` and ``total`` bytes."""

    def __init__(self):
        self.sent = 0
        self.received = 0
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return self.sent + self.received

    def snapshot(self) -> int:
        with self._lock:
            return self.sent + self.received


@contextlib.contextmanager
def metering():
    """Count this process's connection bytes while the block runs; yields a WireMeter."""
    meter = WireMeter()
    cls, dec = connection.Connection, framing.FrameDecoder
    flush, updated = cls.flush, dec.buffer_updated

    def counting_flush(self):
        if self._out and not self.closed:
            n = sum(memoryview(b).nbytes for b in self._out)
            with meter._lock:
                meter.sent += n
        return flush(self)

    def counting_updated(self, nbytes):
        with meter._lock:
            meter.received += nbytes
        return updated(self, nbytes)

    cls.flush, dec.buffer_updated = counting_flush, counting_updated
    try:
        yield meter
    finally:
        cls.flush, dec.buffer_updated = flush, updated
