"""The owner's object store: every object a core made or received, and who waits on it.

Ray's ``CoreWorkerMemoryStore`` plays this part in its core worker. One store per core;
the core's I/O thread settles entries (``complete``, ``fail``, ``complete_result``) and
user threads wait on them (``get``, ``wait``, ``await_ref``). The task and actor
submitters are handed the store and use only the public methods below, so none of them
reaches into another's state.

An entry's value stays as raw frame segments (maybe in shared memory, see
``shm_store``) until a thread that calls ``get`` deserializes it. A value that contains
refs keeps their entries alive in ``Entry.contained`` and travels with them
(``bundle_refs`` / ``unbundle_refs``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import threading
import time
from typing import Any

from .. import context, shm_store
from ..errors import DDLFError, GetTimeoutError, TaskCancelledError
from ..wire import protocol
from ..wire.remote_error import decode_error, encode_error
from ..wire.serialization import dumps, loads, snapshot
from .generators import ObjectRefGenerator
from .object_ref import ForeignObjectRef, ObjectRef, collect_refs, resolving_refs

__all__ = ["ObjectStore", "Entry", "PENDING", "OK", "ERR", "LOCAL_ERR", "dumps_with_refs",
           "bundle_refs", "unbundle_refs"]

log = logging.getLogger("ddlf.core")

# Entry states: LOCAL_ERR holds an exception object made in this process (``value``),
# ERR an encoded remote error (``segments``).
PENDING, OK, ERR, LOCAL_ERR = 0, 1, 2, 3


class Entry:
    __slots__ = ("state", "segments", "value", "has_value", "refs", "sent_to", "callbacks",
                 "contained", "origin")

    def __init__(self):
        self.state = PENDING
        self.segments = None
        # The value once deserialized (any object), or for LOCAL_ERR the exception itself.
        self.value: Any = None
        self.has_value = False
        self.refs = 0
        self.sent_to = None
        self.callbacks = None
        self.contained = None   # ObjectRefs inside this value: kept alive, shipped with it
        # Who computes it, for ddlf.cancel: an actor id (str), a task pool key (tuple), or
        # the id of the num_returns parent it is split from (bytes); None for put/adopted.
        self.origin = None


def dumps_with_refs(value) -> tuple[list, list]:
    """``dumps(value)`` and the distinct ``ObjectRef``s found inside it."""
    segs, found = collect_refs(dumps, value)
    if not found:
        return segs, found
    distinct: dict = {}
    for r in found:
        if type(r) is ObjectRef:
            distinct.setdefault(r.id, r)
    return segs, list(distinct.values())


class ObjectStore:
    """Entries by object id, their reference counts, callbacks and waiters.

    ``owner`` is the core whose ``ObjectRef``s this store backs (refs hold it, and call
    its ``incref``/``decref``). ``submit(fn, *args)`` runs ``fn`` on the I/O thread (how a
    user thread gets a FREE frame sent). ``lend_cpu()`` (-> bool) and ``take_cpu_back()``
    bracket a blocking wait inside a task, so its CPU can run other work meanwhile.
    """

    def __init__(self, owner, submit, lend_cpu, take_cpu_back):
        self.owner = owner
        self.objects: dict[bytes, Entry] = {}
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0
        # Orders a callback registering against the entry settling (and, for generator
        # streams, a reader registering against an item arriving).
        self.cb_lock = threading.Lock()
        self.closed = False
        self._submit = submit
        self._lend_cpu = lend_cpu
        self._take_cpu_back = take_cpu_back
        self._prefix = os.urandom(8)
        self._counter = itertools.count(1)

    # -- entries and their refs --------------------------------------------------------------
    def new_ref(self, origin=None) -> ObjectRef:
        obj_id = self._prefix + next(self._counter).to_bytes(8, "big")
        e = self.objects[obj_id] = Entry()
        if origin is not None:
            e.origin = origin
            call = context.current_call()
            if call is not None:   # submitted by a running call: a recursive cancel reaches it
                call.add_child(obj_id)
        return ObjectRef(obj_id, self.owner)

    def incref(self, obj_id: bytes) -> None:
        e = self.objects.get(obj_id)
        if e is not None:
            e.refs += 1

    def decref(self, obj_id: bytes) -> None:
        e = self.objects.get(obj_id)
        if e is None:
            return
        e.refs -= 1
        if e.refs <= 0:
            self.objects.pop(obj_id, None)
            if e.sent_to and not self.closed:
                self._submit(self._send_free, obj_id, e.sent_to)

    def _send_free(self, obj_id: bytes, conns) -> None:
        for conn in conns:
            if not conn.closed:
                conn.send_msg(protocol.FREE, 0, [obj_id])

    def put(self, value) -> ObjectRef:
        if isinstance(value, ObjectRef):
            raise TypeError("ddlf.put() of an ObjectRef is not allowed: pass the ref itself")
        # put() snapshots the value, as Ray's does: later changes to the caller's array
        # must not leak into what workers receive. Large buffers are copied into shared
        # memory instead (that copy is the snapshot), unless it is off or full.
        segs, contained = dumps_with_refs(value)
        segs = shm_store.store(segs) or snapshot(segs)
        ref = self.new_ref()
        e = self.objects[ref.id]
        e.segments = segs
        e.contained = contained or None
        e.state = OK
        return ref

    def adopt(self, obj_id: bytes, state: int, segments) -> ObjectRef:
        """A ref of this core for an object another process shipped with a value.

        The copy lives here until the last local ref is dropped, whatever its sender
        does meanwhile (the sender may exit: Ray's borrowers keep objects alive too).
        """
        if obj_id not in self.objects:
            e = self.objects[obj_id] = Entry()
            e.segments = segments
            e.state = state
        return ObjectRef(obj_id, self.owner)

    def _resolve_known(self, obj_id: bytes):
        return ObjectRef(obj_id, self.owner) if obj_id in self.objects else None

    # -- settling (on the I/O thread) ---------------------------------------------------------
    def complete(self, obj_id: bytes, state: int, segments=None, value=None,
                 contained=None) -> None:
        e = self.objects.get(obj_id)
        if e is None:
            return  # the caller dropped every ref to it
        e.segments = segments
        if contained:
            e.contained = contained
        if state == LOCAL_ERR:
            e.value = value
        with self.cb_lock:
            e.state = state
            callbacks, e.callbacks = e.callbacks, None
        if callbacks:
            for cb in callbacks:
                try:
                    cb()
                except Exception:
                    log.exception("error in an ObjectRef callback")
        if self.waiters:
            with self.cond:
                self.cond.notify_all()

    def fail(self, obj_id: bytes, exc: BaseException) -> None:
        self.complete(obj_id, LOCAL_ERR, value=exc)

    def fail_cancelled(self, obj_id: bytes, what: str) -> None:
        """Settle a call that ``ddlf.cancel`` dropped before it was sent."""
        self.fail(obj_id, TaskCancelledError(
            f"{what} was cancelled with ddlf.cancel() before it ran"))

    def copy_outcome(self, obj_id: bytes, src: Entry) -> None:
        self.complete(obj_id, src.state, src.segments, src.value)

    def complete_result(self, obj_id: bytes, kind: int, segs) -> None:
        """Record a RESULT_* frame (on the I/O thread)."""
        if kind == protocol.RESULT_OK or kind == protocol.RESULT_MULTI:
            self.complete(obj_id, OK, segs[1:])  # RESULT_MULTI: split by split_returns
        elif kind == protocol.RESULT_REFS:
            try:
                contained, rest = unbundle_refs(self, segs[1:])
            except Exception as e:
                self.fail(obj_id, DDLFError(f"a result carrying ObjectRefs was malformed: {e!r}"))
                return
            self.complete(obj_id, OK, rest, contained=contained)
        else:
            self.complete(obj_id, ERR, segs[1:])

    def on_done(self, entry: Entry, cb) -> bool:
        """Register ``cb`` (run on the I/O thread). Return False if already done."""
        with self.cb_lock:
            if entry.state != PENDING:
                return False
            if entry.callbacks is None:
                entry.callbacks = []
            entry.callbacks.append(cb)
            return True

    def notify_waiters(self) -> None:
        """Wake user threads blocked in ``wait_until`` to re-check what they wait for."""
        if self.waiters:
            with self.cond:
                self.cond.notify_all()

    def split_returns(self, parent: ObjectRef, nret: int) -> list:
        """``nret`` refs completed from the RESULT_MULTI that will settle ``parent``.

        Every failure path (dead actor, lost worker, failed dependency) settles the one
        parent entry, and its error is copied to each ref here.
        """
        children = [self.new_ref() for _ in range(nret)]
        ids = [c.id for c in children]
        for obj_id in ids:
            self.objects[obj_id].origin = parent.id

        def split():
            e = self.objects.get(parent.id)
            if e is None:
                return
            if e.state != OK:
                for obj_id in ids:
                    self.copy_outcome(obj_id, e)
                return
            try:
                segs = e.segments
                assert segs is not None  # an OK entry holds its segments (else: malformed)
                index = pickle.loads(segs[0])
                pos = 1
                for obj_id, (kind, n) in zip(ids, index):
                    self.complete_result(obj_id, kind, [None, *segs[pos:pos + n]])
                    pos += n
            except Exception as exc:
                for obj_id in ids:
                    self.fail(obj_id, DDLFError(f"a num_returns result was malformed: {exc!r}"))
            self.objects.pop(parent.id, None)  # its segments now live in the children

        holder = [parent]  # keeps the parent entry until split() has run

        def run():
            split()
            holder.clear()

        if not self.on_done(self.objects[parent.id], run):
            run()
        return children

    # -- reading ------------------------------------------------------------------------------
    def entry(self, ref) -> Entry:
        """The entry of ``ref``; raises if ``ref`` is not a live ref of this store's core."""
        if type(ref) is ForeignObjectRef:
            raise ref._error()
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"expected an ObjectRef, got {type(ref).__name__}: {ref!r}")
        if ref._core is not self.owner:
            raise DDLFError(f"{ref!r} belongs to an earlier ddlf session that was shut down")
        e = self.objects.get(ref.id)
        if e is None:
            raise DDLFError(f"{ref!r} is unknown to this process")
        return e

    def value(self, e: Entry):
        """A settled entry's value (deserialized once); raises its error."""
        state = e.state
        if state == OK:
            if not e.has_value:
                if e.contained:
                    with resolving_refs(self._resolve_known):
                        e.value = loads(e.segments)
                else:
                    e.value = loads(e.segments)
                e.has_value = True
            return e.value
        if state == ERR:
            raise decode_error(e.segments)
        raise e.value

    def error_of(self, e: Entry) -> BaseException:
        """The exception a failed entry holds (a failed dependency's, for its dependents)."""
        try:
            self.value(e)
        except BaseException as exc:
            return exc
        return DDLFError("dependency failed")

    def failed(self, ref: ObjectRef) -> bool:
        e = self.objects.get(ref.id)
        return e is not None and e.state != PENDING and e.state != OK

    # -- get / wait / await (user threads) ----------------------------------------------------
    def pending_among(self, ids: list) -> list:
        """Those of ``ids`` this store holds and that are still pending, in order."""
        objects = self.objects
        return [i for i in ids if (e := objects.get(i)) is not None and e.state == PENDING]

    def get(self, refs, timeout: float | None = None):
        entries = [self.entry(r) for r in refs]
        if any(e.state == PENDING for e in entries):
            lent = self._lend_cpu()
            try:
                self.wait_until(lambda: all(e.state != PENDING for e in entries), timeout,
                                lambda: sum(e.state == PENDING for e in entries), len(entries))
            finally:
                if lent:
                    self._take_cpu_back()
        return [self.value(e) for e in entries]

    def wait(self, refs, num_returns: int, timeout: float | None):
        # A streaming generator is ready when next() on it would not block (Ray's rule).
        entries = [r if type(r) is ObjectRefGenerator else self.entry(r) for r in refs]

        def ready(e) -> bool:
            return e._settled() if type(e) is ObjectRefGenerator else e.state != PENDING

        def enough():
            return sum(ready(e) for e in entries) >= num_returns

        if not enough():
            self.wait_for(enough, timeout)
        ready_refs: list = []
        not_ready: list = []
        for r, e in zip(refs, entries):
            (ready_refs if ready(e) and len(ready_refs) < num_returns else not_ready).append(r)
        return ready_refs, not_ready

    def wait_for(self, predicate, timeout: float | None) -> None:
        """Block a user thread until ``predicate()`` or ``timeout`` (no error on timeout)."""
        lent = self._lend_cpu()
        try:
            self.wait_until(predicate, timeout, None, 0)
        except GetTimeoutError:
            pass
        finally:
            if lent:
                self._take_cpu_back()

    def wait_until(self, predicate, timeout, pending_count, total) -> None:
        """Block until ``predicate()``; ``GetTimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            self.waiters += 1
            try:
                while not predicate():
                    if self.closed:
                        raise DDLFError("DDLF was shut down while waiting for results")
                    if deadline is None:
                        self.cond.wait(1.0)
                    else:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            n = pending_count() if pending_count else 0
                            raise GetTimeoutError(
                                f"ddlf.get timed out after {timeout} s with {n} of {total} "
                                "objects still pending")
                        self.cond.wait(min(left, 1.0))
            finally:
                self.waiters -= 1

    def close(self) -> None:
        """Wake every waiter; later waits raise (the core is shut down)."""
        self.closed = True
        with self.cond:
            self.cond.notify_all()

    async def await_ref(self, ref):
        e = self.entry(ref)
        if e.state == PENDING:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()

            def wake():
                loop.call_soon_threadsafe(_settle, fut)

            if self.on_done(e, wake):
                await fut
        return self.value(e)

    def concurrent_future(self, ref):
        import concurrent.futures

        f: concurrent.futures.Future = concurrent.futures.Future()
        e = self.entry(ref)

        def settle():
            try:
                f.set_result(self.value(e))
            except BaseException as exc:
                f.set_exception(exc)

        if not self.on_done(e, settle):
            settle()
        return f


# -- values that carry refs ------------------------------------------------------------------
def bundle_refs(refs, segs) -> list:
    """RESULT_REFS segments: a value's segments preceded by the objects it refers to.

    Runs where the value was made (a worker), once each ref is settled. Objects inside
    those objects go first (a returned ref to a ``put`` of refs). A ref whose object
    failed travels as its error, so ``get`` on it raises that error at the caller; one
    unknown here arrives as a ``ForeignObjectRef``.
    """
    index, body, seen = [], [], set()

    def visit(ref):
        if ref.id in seen or ref._core is None:
            return
        seen.add(ref.id)
        e = ref._core.objects.get(ref.id)
        if e is None or e.state == PENDING:
            return
        for inner in e.contained or ():
            visit(inner)
        if e.state == OK:
            state, obj = OK, e.segments
        elif e.state == ERR:
            state, obj = ERR, e.segments
        else:
            state, obj = ERR, encode_error(e.value, "a returned ObjectRef")
        index.append((ref.id, state, len(obj)))
        body.extend(obj)

    for r in refs:
        visit(r)
    return [pickle.dumps(index, protocol=5), *body, *segs]


def unbundle_refs(store, segs):
    """Adopt the objects of a RESULT_REFS body into ``store`` (anything with ``adopt``,
    such as a core); return (their refs, the value's segments)."""
    index = pickle.loads(segs[0])
    pos = 1
    contained = []
    for obj_id, state, n in index:
        if state not in (OK, ERR) or n < 0 or pos + n > len(segs):
            raise ValueError("bad object index")
        contained.append(store.adopt(bytes(obj_id), state, segs[pos:pos + n]))
        pos += n
    return contained, segs[pos:]


def _settle(fut) -> None:
    if not fut.done():
        fut.set_result(None)
