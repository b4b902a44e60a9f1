"""``ObjectRef``: a future for a value produced by a remote call or stored with ``put``."""

from __future__ import annotations

__all__ = ["ObjectRef"]


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
        # Refs are owned by the process that made them; elsewhere they only name an id.
        return (_foreign_ref, (self.id,))


class ForeignObjectRef:
    """An ``ObjectRef`` that crossed into another process inside a container argument."""

    __slots__ = ("id",)

    def __init__(self, obj_id: bytes):
        self.id = obj_id

    def __repr__(self):
        return f"ForeignObjectRef({self.id.hex()})"


def _foreign_ref(obj_id: bytes) -> ForeignObjectRef:
    return ForeignObjectRef(obj_id)
