"""``ObjectRef``: a future for a value produced by a remote call or stored with ``put``.

Refs nested inside values (``f.remote([r1, r2])``, a method returning ``ddlf.put(x)``)
travel as refs, as in Ray. Pickling a ref only writes its id; the runtime learns which
refs a value contains through :func:`collect_refs`, ships their objects alongside it,
and while unpickling turns each id back into a ref through :func:`resolving_refs`.

A ref pickled anywhere else (``pickle.dumps(ref)``, ``cloudpickle.dump(ref, f)``) is
*out of band*: as in Ray, its object is then pinned in the owning process until
:func:`free` (or the owner's exit), and the pickle names the owner, so the ref stays
fetchable from any process of the cluster while its owner lives. See ``runtime/client/oob.py``.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from .. import context
from ..errors import DDLFError
from . import current

__all__ = ["ObjectRef", "ForeignObjectRef", "collect_refs", "resolving_refs",
           "set_default_resolver", "free", "pinned"]

log = logging.getLogger("ddlf.core")

# Per thread, so concurrent pickling in several threads of one process cannot mix up
# whose refs were found.
_tls = threading.local()

# Refs pickled out of band, by id: holding the ref keeps its object in its core.
_pinned: dict = {}


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

    # Held by the class, which lives as long as its instances: at interpreter exit this
    # module's globals may be gone before the last ref is (subprocess.Popen.__del__ keeps
    # warnings.warn the same way, as a default argument).
    _debug = staticmethod(log.debug)

    def __del__(self):
        try:
            self._core.decref(self.id)
        except Exception as e:
            # Interpreter exit or a shut-down core: the store, and every entry a FREE
            # would have released, is gone with it.
            self._debug("dropping a ref after shutdown: %r", e)

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
        sink = getattr(_tls, "sink", None)
        if sink is not None:
            # Only the id is pickled; the runtime ships the object itself next to the
            # value that contains the ref (see collect_refs).
            sink.append(self)
            return (_foreign_ref, (self.id,))
        # Out of band: nothing will ship the object, so pin it here for good (Ray does
        # the same) and name where it can be fetched.
        _pinned.setdefault(self.id, self)
        return (_out_of_band_ref, (self.id, _owner_address()))

    # A ref is immutable: a copy is the ref itself (and must not pin it as pickling does).
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class ForeignObjectRef(ObjectRef):
    """A ref whose object cannot be reached from this process; ``ddlf.get``, ``wait`` and
    ``await`` on it raise an error that says why (``why``)."""

    __slots__ = ("why",)

    def __init__(self, obj_id: bytes, why: str | None = None):
        self.id = obj_id
        self._core = None
        self.why = why or (
            "it was pickled inside a value whose objects did not travel with it")

    def __del__(self):
        pass

    def _error(self):
        return DDLFError(f"ObjectRef {self.id.hex()} cannot be fetched in this process: "
                         f"{self.why}.")

    def __await__(self):
        raise self._error()

    def future(self):
        raise self._error()

    def __reduce__(self):
        return (ForeignObjectRef, (self.id, self.why))

    def __repr__(self):
        return f"ForeignObjectRef({self.id.hex()})"


def free(refs) -> int:
    """Unpin objects pinned by out-of-band pickling (``ray._private.internal_api.free``);
    the number unpinned. An object is then freed once no ref to it is left."""
    if isinstance(refs, ObjectRef):
        refs = [refs]
    return sum(_pinned.pop(r.id, None) is not None for r in refs)


def pinned(obj_id: bytes):
    """The ref pinned for ``obj_id`` by out-of-band pickling in this process, or None."""
    return _pinned.get(obj_id)


def _owner_address() -> str | None:
    """Where this process serves the objects it pins: a worker's server, the driver's fetch
    server (started on first use), or None (no cluster)."""
    ctx = context.current
    if ctx is not None:
        return getattr(ctx, "address", None)
    core = current.get_core(auto=False)
    return core.pinned_objects_address() if core is not None else None


def _out_of_band_ref(obj_id: bytes, owner: str | None) -> ObjectRef:
    """Unpickling a ref pickled out of band: a ref of this process's core, fetched from its
    owner (see oob.py), or a ``ForeignObjectRef`` saying why it cannot be fetched."""
    ref = _resolve_local(obj_id)
    if ref is not None:
        return ref
    if owner is None:
        return ForeignObjectRef(obj_id, (
            "it was pickled out of band (pickle.dumps, cloudpickle.dump) by a process that "
            "was not connected to a DDLF cluster, so no owner serves its object"))
    core = current.get_core()   # in a worker, joins its cluster; in a driver, needs init()
    if core is None:
        return ForeignObjectRef(obj_id, (
            f"it was pickled out of band by the worker at {owner}, and this process is not "
            "connected to a DDLF cluster: call ddlf.init(address=...) before unpickling it"))
    return core.fetch_pinned(obj_id, owner)


def _shipped(obj_id: bytes):
    """The ref of an object shipped with the call being decoded (this thread's resolver, or
    the worker's default), or None."""
    resolve = getattr(_tls, "resolve", None) or _default_resolve
    return resolve(obj_id) if resolve is not None else None


def _resolve_local(obj_id: bytes):
    ref = _shipped(obj_id)
    if ref is not None:
        return ref
    core = current.get_core(auto=False)
    if core is not None and obj_id in core.objects:
        return ObjectRef(obj_id, core)
    return None


# A worker sets this once: any ref unpickled in its threads (call arguments) is looked
# up among the objects its callers shipped.
_default_resolve = None


def set_default_resolver(resolve) -> None:
    global _default_resolve
    _default_resolve = resolve


def _foreign_ref(obj_id: bytes):
    ref = _shipped(obj_id)
    return ref if ref is not None else ForeignObjectRef(obj_id)


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
