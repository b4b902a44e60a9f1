"""Fetching the object of a ref pickled out of band, from the worker that owns it.

``pickle.dumps(ref)`` outside DDLF's calls pins the ref's object in its owner (see
``object_ref``) and writes the owner's address into the pickle when the owner is a
worker. Unpickling it in another process makes a pending ref there and asks the owner
for the object over an authenticated connection:

    requester                         owner (a worker's server)
    FETCH        seg1 = object id  ->
                                  <-  FETCH_REPLY  seg1 = outcome byte, then segments

The owner answers once the object is ready (a pinned ref may still be pending). The
outcome is ``VALUE`` (the value's segments), ``REFS`` (``bundle_refs`` segments: objects
the value refers to travel with it), ``ERROR`` (an encoded error) or ``MISSING`` (not
pinned there: freed, or never pickled out of band). Workers answer on their server; a
driver starts a small server of its own (on its I/O loop, on the interface that reaches
the head) the first time it pickles a ref out of band.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ..errors import DDLFError
from ..wire import protocol
from ..wire.connection import connect
from ..wire.frames import TableFrameHandler
from ..wire.remote_error import encode_error
from .object_ref import pinned
from .object_store import ERR, OK, bundle_refs, unbundle_refs

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["ObjectFetchError", "start_fetch", "serve_fetch", "owner_address",
           "close_driver_server"]

log = logging.getLogger("ddlf.oob")

# FETCH_REPLY outcomes
VALUE, REFS, ERROR, MISSING = 1, 2, 3, 4


class ObjectFetchError(DDLFError):
    """The owner of an out-of-band ref could not give its object (gone, or freed it)."""


def owner_address(core) -> str | None:
    """Where the driver whose core is ``core`` serves its pinned objects: its fetch server
    (started here on first use); None if it cannot serve. (A worker serves them on its own
    server, whose address its context holds.)"""
    if core.head is None or core.closed:
        return None
    server = _driver_servers.get(id(core))
    if server is None:
        if threading.current_thread() is core.io.thread:
            return None   # pickled on the I/O thread itself: it cannot wait for itself
        with _lock:
            server = _driver_servers.get(id(core))
            if server is None:
                server = _driver_servers[id(core)] = core.io.run(_serve_driver(core), 30)
    return server[1]


# id(core) -> (server, "host:port"); one per driver session.
_driver_servers: dict = {}
_lock = threading.Lock()


async def _serve_driver(core):
    from ..wire.connection import serve

    # The interface this driver reaches the head from is the one the cluster can reach.
    host = core.head.transport.get_extra_info("sockname")[0]
    server = await serve(host, 0, core.token, _DriverServer(core))
    return server, f"{host}:{server.sockets[0].getsockname()[1]}"


def close_driver_server(core) -> None:
    """Stop the fetch server of ``core`` (on its I/O loop, as the core closes)."""
    entry = _driver_servers.pop(id(core), None)
    if entry is not None:
        entry[0].close()


class _DriverServer(TableFrameHandler):
    def __init__(self, core):
        self.core = core

    def _on_fetch(self, conn: Connection, kind, msg_id, segs):
        serve_fetch(conn, msg_id, segs, self.core.loop)

    FRAMES = {protocol.FETCH: _on_fetch}

    def connection_closed(self, conn: Connection, exc):
        pass


def start_fetch(core, obj_id: bytes, owner: str) -> None:
    """Ask ``owner`` for ``obj_id`` (on the core's I/O loop); its answer settles the ref."""
    core.background.spawn(_fetch(core, obj_id, owner))


async def _fetch(core, obj_id: bytes, owner: str) -> None:
    handler = _Requester(core, obj_id, owner)
    host, _, port = owner.rpartition(":")
    try:
        conn = await connect(host, int(port), core.token, handler)
    except Exception as e:
        handler.fail(f"its owner, the worker at {owner}, cannot be reached ({e}); the "
                     "owner has probably exited, taking its pinned objects with it")
        return
    conn.send_msg(protocol.FETCH, 1, [obj_id])


class _Requester(TableFrameHandler):
    def __init__(self, core, obj_id: bytes, owner: str):
        self.core = core
        self.obj_id = obj_id
        self.owner = owner
        self.done = False

    def fail(self, why: str) -> None:
        self.done = True
        self.core.store.fail(self.obj_id, ObjectFetchError(
            f"ObjectRef {self.obj_id.hex()} (pickled out of band) could not be fetched: {why}"))

    def _on_reply(self, conn: Connection, kind, msg_id, segs):
        if self.done or len(segs) < 2 or len(segs[1]) != 1:
            conn.abort()
            return
        outcome = segs[1][0]
        body = segs[2:]
        if outcome == VALUE:
            self.done = True
            self.core.store.complete(self.obj_id, OK, body)
        elif outcome == REFS:
            try:
                contained, rest = unbundle_refs(self.core, body)
            except Exception as e:
                self.fail(f"its owner sent a malformed object ({e!r})")
            else:
                self.done = True
                self.core.store.complete(self.obj_id, OK, rest, contained=contained)
        elif outcome == ERROR:
            self.done = True
            self.core.store.complete(self.obj_id, ERR, body)
        else:
            self.fail(f"its owner, the worker at {self.owner}, no longer pins it (it was "
                      "freed with free(), or pickled in another process)")
        conn.close()

    FRAMES = {protocol.FETCH_REPLY: _on_reply}

    def connection_closed(self, conn: Connection, exc):
        if not self.done:
            self.fail(f"the connection to its owner, the worker at {self.owner}, closed "
                      f"before the object arrived ({exc or 'the owner exited'})")


def serve_fetch(conn: Connection, msg_id: int, segs, loop) -> None:
    """Answer a FETCH frame on a worker's server (on its event loop ``loop``)."""
    if len(segs) != 2:
        conn.abort()
        return
    ref = pinned(bytes(segs[1]))
    core = ref._core if ref is not None else None
    entry = core.objects.get(ref.id) if core is not None else None
    if core is None or entry is None:
        conn.send_msg(protocol.FETCH_REPLY, msg_id, [bytes([MISSING])])
        return

    def reply():
        # Runs on the core's I/O thread once the object is ready; sends on ours.
        try:
            body = _outcome(core, entry)
        except Exception as e:   # never leave the requester waiting
            log.exception("could not encode a fetched object")
            body = [bytes([ERROR]), *encode_error(DDLFError(f"encoding failed: {e!r}"), "fetch")]
        loop.call_soon_threadsafe(_send, conn, msg_id, body)

    if not core.store.on_done(entry, reply):
        reply()


def _send(conn: Connection, msg_id, body) -> None:
    if not conn.closed:
        conn.send_msg(protocol.FETCH_REPLY, msg_id, body)


def _outcome(core, entry) -> list:
    if entry.state == OK:
        if entry.contained:
            return [bytes([REFS]), *bundle_refs(entry.contained, entry.segments)]
        return [bytes([VALUE]), *entry.segments]
    if entry.state == ERR:
        return [bytes([ERROR]), *entry.segments]
    return [bytes([ERROR]), *encode_error(entry.value, "an object pickled out of band")]
