"""Objects callers shipped to this worker (``OBJ`` and ``OBJ_SHM`` frames)."""

from __future__ import annotations

from ..client import current
from ..client.object_store import OK
from ..errors import DDLFError
from ..wire.serialization import loads

__all__ = ["ObjectCache", "adopt_shipped"]


class ObjectCache:
    """Objects shipped by callers, keyed by 16-byte id, deserialized on first use."""

    def __init__(self):
        self._raw: dict[bytes, list] = {}
        self._values: dict[bytes, object] = {}

    def raw(self, obj_id: bytes):
        """The shipped segments of ``obj_id``, or None."""
        return self._raw.get(obj_id)

    def add(self, obj_id: bytes, segments: list) -> None:
        self._raw[obj_id] = segments
        self._values.pop(obj_id, None)

    def get(self, obj_id: bytes):
        """The value of ``obj_id``; ``KeyError`` naming it if it was never shipped here."""
        try:
            return self._values[obj_id]
        except KeyError:
            pass
        segs = self._raw.get(obj_id)
        if segs is None:
            raise KeyError(
                f"object {obj_id.hex()} was not shipped to this worker (was it freed by its owner?)"
            )
        value = loads(segs)
        self._values[obj_id] = value
        return value

    def drop(self, obj_id: bytes) -> None:
        self._raw.pop(obj_id, None)
        self._values.pop(obj_id, None)

    def __len__(self):
        return len(self._raw)


def adopt_shipped(cache: ObjectCache):
    """Resolver for refs nested in call arguments: the caller shipped their objects."""
    def resolve(obj_id: bytes):
        segs = cache.raw(obj_id)
        if segs is None:
            return None
        core = current.get_core(auto=True)
        if core is None:   # a worker always joins; only a cleared worker context stops it
            raise DDLFError(f"cannot adopt shipped object {obj_id.hex()}: this process has "
                            "no DDLF core (its worker context was cleared)")
        return core.adopt(obj_id, OK, segs)
    return resolve
