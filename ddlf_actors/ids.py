"""Typed ids: what the runtime context's Ray-style properties (``node_id``, ``job_id``
...) return, as Ray's ``NodeID``, ``JobID`` ... do.

DDLF's ids are hex strings everywhere else (``get_node_id()``, ``ddlf.nodes()``); these
wrap one so that code written for Ray's id objects (``ctx.node_id.hex()``, passing
``ctx.node_id`` to ``NodeAffinitySchedulingStrategy``) runs unchanged.
"""

from __future__ import annotations

__all__ = ["BaseID", "JobID", "NodeID", "WorkerID", "TaskID", "ActorID", "PlacementGroupID"]


class BaseID:
    """An id: ``hex()`` gives DDLF's id string. Equal to an id of the same class and
    string, never to a plain string (as in Ray)."""

    __slots__ = ("_hex",)

    def __init__(self, id_hex: str):
        if not isinstance(id_hex, str):
            raise TypeError(f"{type(self).__name__} takes an id string, got "
                            f"{type(id_hex).__name__}: {id_hex!r}")
        self._hex = id_hex

    @classmethod
    def from_hex(cls, id_hex: str):
        return cls(id_hex)

    @classmethod
    def nil(cls):
        """The id that names nothing (``is_nil()``)."""
        return cls("")

    def hex(self) -> str:
        return self._hex

    def binary(self) -> bytes:
        """The id's bytes: decoded from hex when it is hex, else its UTF-8 (a node id may
        be a name given to ``ddlf-node start``)."""
        try:
            return bytes.fromhex(self._hex)
        except ValueError:
            return self._hex.encode()

    def is_nil(self) -> bool:
        return not self._hex

    def __eq__(self, other):
        return type(other) is type(self) and other._hex == self._hex

    def __hash__(self):
        return hash((type(self).__name__, self._hex))

    def __repr__(self):
        return f"{type(self).__name__}({self._hex})"

    __str__ = __repr__

    def __reduce__(self):
        return (type(self), (self._hex,))


class JobID(BaseID):
    __slots__ = ()


class NodeID(BaseID):
    __slots__ = ()


class WorkerID(BaseID):
    __slots__ = ()


class TaskID(BaseID):
    __slots__ = ()


class ActorID(BaseID):
    __slots__ = ()


class PlacementGroupID(BaseID):
    __slots__ = ()
