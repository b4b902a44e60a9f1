"""Placeholders that stand in for objects inside a call's pickled arguments."""

from __future__ import annotations

from ..wire.serialization import PLAIN_TYPES

__all__ = ["ArgRef"]


class ArgRef:
    """Marks a top-level argument the callee must replace with a shipped object.

    The object itself travels once per connection in an ``OBJ`` frame; the call only
    carries this 16-byte id.
    """

    __slots__ = ("obj_id",)

    def __init__(self, obj_id: bytes):
        self.obj_id = obj_id

    def __reduce__(self):
        return (ArgRef, (self.obj_id,))

    def __repr__(self):
        return f"ArgRef({self.obj_id.hex()})"


PLAIN_TYPES.add(ArgRef)
