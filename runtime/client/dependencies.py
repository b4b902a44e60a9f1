"""A call's dependencies: the objects its arguments refer to, on both ends of the call.

Ray's ``LocalDependencyResolver`` plays this part in its core worker. The caller
(``split_refs``) replaces each top-level ``ObjectRef`` argument by an ``ArgRef``
placeholder and keeps the ref; refs nested deeper stay refs (``with_nested``). Before the
call is sent, a submitter asks ``deps_state`` whether every dependency is ready (and
none failed), then ``ship_deps`` sends each value once per connection. The callee
(``resolve_args``) puts the shipped values back in place of the placeholders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import shm_store
from ..wire import protocol
from .object_ref import ObjectRef
from .object_store import OK, PENDING, Entry, ObjectStore
from .refs import ArgRef

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["split_refs", "with_nested", "deps_state", "ship_deps", "deps_objects",
           "await_deps", "resolve_args"]


# -- the caller's side -------------------------------------------------------------------------
def split_refs(args, kwargs):
    """Replace top-level ObjectRefs by ArgRef placeholders; return (args, kwargs, refs)."""
    refs = None
    if any(type(a) is ObjectRef for a in args):
        refs = [a for a in args if type(a) is ObjectRef]
        args = tuple(ArgRef(a.id) if type(a) is ObjectRef else a for a in args)
    if kwargs and any(type(v) is ObjectRef for v in kwargs.values()):
        refs = (refs or []) + [v for v in kwargs.values() if type(v) is ObjectRef]
        kwargs = {k: ArgRef(v.id) if type(v) is ObjectRef else v for k, v in kwargs.items()}
    return args, kwargs, refs


def with_nested(refs, nested):
    """Top-level refs plus refs found nested in the arguments (shipped, not replaced)."""
    if not nested:
        return refs
    return (refs or []) + nested


def deps_state(store: ObjectStore, refs) -> tuple[Entry | None, Entry | None]:
    """Return (pending_entry, failed_entry) for the first dependency not yet ready/ok."""
    for ref in refs:
        e = store.objects.get(ref.id)
        if e is None:
            continue
        if e.state == PENDING:
            return e, None
        if e.state != OK:
            return None, e
        if e.contained:
            pending, failed = deps_state(store, e.contained)
            if pending is not None or failed is not None:
                return pending, failed
    return None, None


def ship_deps(store: ObjectStore, conn: Connection, refs) -> None:
    """Send each dependency's value on ``conn`` unless it was sent there already; the
    objects a value contains go first, so the callee has them when it unpickles it."""
    for ref in refs:
        e = store.objects.get(ref.id)
        if e is None:
            continue
        if e.sent_to is None:
            e.sent_to = set()
        if conn not in e.sent_to:
            if e.contained:
                ship_deps(store, conn, e.contained)
            segs = e.segments
            # Callers ship only after deps_state found every dependency (contained ones
            # too) settled OK, and an OK entry holds its segments.
            assert segs is not None
            if not shm_store.ship(conn, ref.id, segs):
                conn.send_msg(protocol.OBJ, 0, [ref.id, *segs])
            e.sent_to.add(conn)


def deps_objects(store: ObjectStore, refs, out: dict) -> dict:
    """id -> segments of ``refs`` and of the objects their values contain (actor creation
    ships them inside the request rather than as ``OBJ`` frames)."""
    for ref in refs:
        e = store.objects.get(ref.id)
        if e is None or ref.id in out:
            continue
        if e.contained:
            deps_objects(store, e.contained, out)
        out[ref.id] = e.segments
    return out


async def await_deps(store: ObjectStore, loop, refs) -> None:
    """On the I/O loop ``loop``: return once none of ``refs`` is pending."""
    for r in refs:
        e = store.objects.get(r.id)
        if e is not None and e.state == PENDING:
            fut = loop.create_future()
            if store.on_done(e, lambda f=fut: f.done() or f.set_result(None)):
                await fut


# -- the callee's side -------------------------------------------------------------------------
def resolve_args(args, kwargs, cache):
    """Put the shipped objects (``cache.get(obj_id)``) back in place of ``ArgRef``s."""
    if any(type(a) is ArgRef for a in args):
        args = tuple(cache.get(a.obj_id) if type(a) is ArgRef else a for a in args)
    if kwargs and any(type(v) is ArgRef for v in kwargs.values()):
        kwargs = {k: cache.get(v.obj_id) if type(v) is ArgRef else v for k, v in kwargs.items()}
    return args, kwargs
