"""``ObjectRef``: a future for a value produced by a remote call or stored with ``put``.

Refs nested inside values (``f.remote([r1, r2])``, a method returning ``ddlf.put(x)``)
travel as refs, as in Ray. Pickling a ref only writes its id; the runtime learns which
refs a value contains through :func:`collect_refs`, ships their objects alongside it,
and while unpickling turns each id back into a ref through :func:`resolving_refs`.
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["ObjectRef", "ForeignObjectRef", "collect_refs", "resolving_refs",
           "set_default_resolver"]

# Per thread, so concurrent pickling in several threads of one process cannot mix up
# whose refs were found.
_tls = threading.local()


class ObjectRef:
    """A reference to a value that is (or will be) held by the process that created it.

    Collect it with ``ddlf.get``/``ddlf.wait`` or ``await ref``. Pass it as a top-level
    argument of a remote call and the callee receives the value; the value is shipped
    at most once per connection, however many calls use it.
    """

    __slots__ = ("id", "_core", "__weakref__")

    def __init__(self, obj_id: bytes, core):
        self.id = obj_id
        self._core = core
        core.incref(obj_id)

    def __del__(self):
        try:
            self._core.decref(self.id)
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    def __await__(self):
        return self._core.await_ref(self).__await__()

    def future(self):
        """A ``concurrent.futures.Future`` that completes with this ref's value."""
        return self._core.concurrent_future(self)

    def hex(self) -> str:
        return self.id.hex()

    def __eq__(self, other):
        return isinstance(other, ObjectRef) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"ObjectRef({self.id.hex()})"

    def __reduce__(self):
        # Only the id is pickled; the runtime ships the object itself next to the value
        # that contains the ref (see collect_refs).
        sink = getattr(_tls, "sink", None)
        if sink is not None:
            sink.append(self)
        return (_foreign_ref, (self.id,))


class ForeignObjectRef:
    """A ref whose object did not travel with it (it was pickled outside DDLF's calls).

    ``ddlf.get`` on it raises an error that says so.
    """

    __slots__ = ("id",)

    def __init__(self, obj_id: bytes):
        self.id = obj_id

    def __repr__(self):
        return f"ForeignObjectRef({self.id.hex()})"


# A worker sets this once: any ref unpickled in its threads (call arguments) is looked
# up among the objects its callers shipped.
_default_resolve = None


def set_default_resolver(resolve) -> None:
    global _default_resolve
    _default_resolve = resolve


def _foreign_ref(obj_id: bytes):
    resolve = getattr(_tls, "resolve", None) or _default_resolve
    if resolve is not None:
        ref = resolve(obj_id)
        if ref is not None:
            return ref
    return ForeignObjectRef(obj_id)


def collect_refs(fn, value):
    """``(fn(value), refs)``: every ``ObjectRef`` pickled on this thread while ``fn`` runs
    (duplicates included). A plain function, not a context manager: it wraps every
    remote call and every result."""
    found: list = []
    outer = getattr(_tls, "sink", None)
    _tls.sink = found
    try:
        return fn(value), found
    finally:
        _tls.sink = outer


@contextlib.contextmanager
def resolving_refs(resolve):
    """Within the block, an unpickled ref id becomes ``resolve(obj_id)``, or a
    ``ForeignObjectRef`` where that returns None."""
    outer = getattr(_tls, "resolve", None)
    _tls.resolve = resolve
    try:
        yield
    finally:
        _tls.resolve = outer
