"""Where work may run, and the resource arithmetic of placing it: pure, no I/O.

* :class:`Scheduling`: the typed form of a ``scheduling_strategy`` (DEFAULT, SPREAD, a
  node affinity, a placement group's bundle), built by the API layer from the user's
  options, checked by the caller, sent to the head in ``create_actor`` and
  ``lease_worker`` (as the plain dict of :meth:`Scheduling.to_wire`), and read by the
  head's scheduler.
* :func:`fits`, :func:`subtract`, :func:`add`: demands against free resources.
* :func:`choose_node`, :func:`node_order`: DEFAULT's choice of node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from .errors import MessageError

__all__ = ["Strategy", "Scheduling", "fits", "subtract", "add", "choose_node", "node_order",
           "feasible_anywhere"]

_EPS = 1e-9


class Strategy(str, Enum):
    """How work that is not pinned to a node or a group picks a node."""

    DEFAULT = "DEFAULT"   # the least loaded node with room
    SPREAD = "SPREAD"     # round-robin over the nodes with room

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Scheduling:
    """Where one actor or task may run. ``None`` in its place means DEFAULT.

    Exactly one of three kinds: a ``strategy`` alone; a node affinity (``node_id``, hard
    unless ``soft``; ``spill``: a soft affinity leaves a busy node instead of waiting;
    ``fail``: a hard one fails on a busy node instead of waiting); or a placement
    group's bundle (``group_id``, ``bundle_index`` -1 for any bundle, ``bundles`` the
    group's bundle specs, ``capture``: work submitted from inside joins the group too).
    """

    strategy: Strategy = Strategy.DEFAULT
    node_id: str | None = None
    soft: bool = False
    spill: bool = False
    fail: bool = False
    group_id: str | None = None
    bundle_index: int = -1
    capture: bool = False
    bundles: tuple = ()

    @property
    def in_group(self) -> bool:
        return bool(self.group_id)

    def pool_key(self) -> tuple:
        """What separates task pools besides the demand: where their leases come from
        (not ``bundles`` or ``capture``, which do not change where a worker is leased)."""
        return (self.strategy.value, self.node_id, self.soft, self.spill, self.fail,
                self.group_id, self.bundle_index)

    def group_context(self) -> dict:
        """What a worker in the group keeps for ``get_current_placement_group()`` and for
        capturing the work it submits (``context.WorkerContext.placement``)."""
        return {"group_id": self.group_id, "bundles": [dict(b) for b in self.bundles],
                "capture": self.capture}

    def to_wire(self) -> dict:
        """The plain dict sent to the head and the worker: the fields that are not at
        their default (what :meth:`from_wire` reads back)."""
        out: dict = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = (value.value if f.name == "strategy" else
                               [dict(b) for b in value] if f.name == "bundles" else value)
        return out

    @classmethod
    def from_wire(cls, data, where: str = "scheduling") -> Scheduling | None:
        """The Scheduling a received dict describes (None for None or ``{}``);
        ``MessageError`` naming the field if it is malformed."""
        if data is None or isinstance(data, Scheduling):
            return data or None
        if not isinstance(data, dict):
            raise MessageError(f"{where} must be a dict, got {type(data).__name__}")
        unknown = set(data) - _WIRE_KEYS
        if unknown:
            raise MessageError(f"{where} has unknown key(s) {sorted(unknown)}")
        if not data:
            return None
        try:
            strategy = Strategy(data.get("strategy", Strategy.DEFAULT))
        except ValueError:
            raise MessageError(f"{where}.strategy must be one of "
                               f"{[s.value for s in Strategy]}, got {data['strategy']!r:.40}")
        node_id, group_id = data.get("node_id"), data.get("group_id")
        for key, value in (("node_id", node_id), ("group_id", group_id)):
            if value is not None and not isinstance(value, str):
                raise MessageError(f"{where}.{key} must be a str, got {type(value).__name__}")
        flags = {}
        for key in ("soft", "spill", "fail", "capture"):
            value = data.get(key, False)
            if not isinstance(value, bool):
                raise MessageError(f"{where}.{key} must be True or False, got {value!r:.40}")
            flags[key] = value
        index = data.get("bundle_index", -1)
        if isinstance(index, bool) or not isinstance(index, int):
            raise MessageError(f"{where}.bundle_index must be an int, got {index!r:.40}")
        bundles = data.get("bundles") or ()
        if not isinstance(bundles, (list, tuple)) or not all(
                isinstance(b, dict) for b in bundles):
            raise MessageError(f"{where}.bundles must be a list of resource dicts, "
                               f"got {bundles!r:.60}")
        return cls(strategy, node_id or None, flags["soft"], flags["spill"], flags["fail"],
                   group_id or None, index, flags["capture"], tuple(dict(b) for b in bundles))


_WIRE_KEYS = frozenset({"strategy", "node_id", "soft", "spill", "fail", "group_id",
                        "bundle_index", "capture", "bundles"})

def fits(demand: dict, available: dict) -> bool:
    return all(available.get(k, 0.0) + _EPS >= v for k, v in demand.items() if v > 0)


def subtract(available: dict, demand: dict) -> None:
    for k, v in demand.items():
        if v > 0:
            available[k] = available.get(k, 0.0) - v


def add(available: dict, demand: dict, total: dict) -> None:
    for k, v in demand.items():
        if v > 0:
            available[k] = min(total.get(k, 0.0), available.get(k, 0.0) + v)


def feasible_anywhere(demand: dict, totals: list[dict]) -> bool:
    return any(fits(demand, t) for t in totals)


def node_order(node, load: int = 0) -> tuple:
    """DEFAULT's order of nodes (objects with ``.available``/``.total``), smallest first:
    the largest free CPU fraction, then the least ``load``."""
    cpu_total = node.total.get("CPU", 0.0) or 1.0
    return (-(node.available.get("CPU", 0.0) / cpu_total), load)


def choose_node(demand: dict, nodes: list, load_key=None):
    """Return the node that fits ``demand`` and comes first in :func:`node_order` (the
    first one in ``nodes`` among equals); ``None`` if none fits now."""
    best = None
    best_key: tuple | None = None
    for n in nodes:
        if not fits(demand, n.available):
            continue
        key = node_order(n, load_key(n) if load_key else 0)
        if best_key is None or key < best_key:
            best, best_key = n, key
    return best
