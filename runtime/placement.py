"""Placement groups: bundles of resources reserved together, and what work draws on them.

The head keeps one :class:`Group` per placement group. A group reserves all of its
bundles at once or none of them (:func:`plan` finds nodes for every bundle against the
nodes' free resources; the head then subtracts them in one step, with no await in
between). A bundle placed on a node is a :class:`Reservation`: actors and tasks
scheduled in the group take their demand out of it instead of the node's free pool,
and give it back there. A reservation whose node dies is dropped and its bundle is
placed again (state ``RESCHEDULING``), as Ray does.

Everything here is pure bookkeeping with no I/O, so it is tested without processes.
"""

from __future__ import annotations

import asyncio

from .scheduling import add, fits, subtract

__all__ = ["STRATEGIES", "PENDING", "CREATED", "RESCHEDULING", "REMOVED", "Group", "Reservation",
           "check_bundles", "check_strategy", "check_bundle_fit", "plan", "total_of",
           "describe_bundles"]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
PENDING, CREATED, RESCHEDULING, REMOVED = "PENDING", "CREATED", "RESCHEDULING", "REMOVED"


# -- validation (the driver runs these before anything reaches the head) ---------------------
def check_bundles(bundles) -> list[dict]:
    """Bundles as a list of ``{resource: float}`` with zero amounts dropped; ``ValueError``
    naming the bad bundle otherwise."""
    example = "for example [{'CPU': 1}, {'CPU': 1, 'GPU': 1}]"
    if not isinstance(bundles, (list, tuple)):
        raise ValueError(f"placement group bundles must be a list of resource dicts ({example}), "
                         f"got {type(bundles).__name__}")
    if not bundles:
        raise ValueError(f"placement group bundles must be a non-empty list of resource dicts "
                         f"({example}), got an empty list")
    out = []
    for i, b in enumerate(bundles):
        if not isinstance(b, dict):
            raise ValueError(f"bundle {i} must be a dict of resource name -> amount, got "
                             f"{type(b).__name__}: {b!r}")
        for k, v in b.items():
            if not isinstance(k, str) or not k:
                raise ValueError(f"bundle {i} has a resource name that is not a non-empty "
                                 f"string: {k!r}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"bundle {i} gives {k!r} the amount {v!r}; amounts are numbers")
            if v < 0:
                raise ValueError(f"bundle {i} asks for {k}={v!r}; amounts must be >= 0")
        clean = {k: float(v) for k, v in b.items() if v > 0}
        if not clean:
            raise ValueError(f"bundle {i} is empty ({b!r}): every bundle must ask for some "
                             f"resource, {example}")
        out.append(clean)
    return out


def check_strategy(strategy) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement strategy {strategy!r}; use one of "
                         f"{', '.join(repr(s) for s in STRATEGIES)}")
    return strategy


def check_bundle_fit(demand: dict, bundles: list[dict], index: int, what: str) -> None:
    """``ValueError`` unless ``demand`` fits bundle ``index`` (-1: some bundle) of a group.

    A demand bigger than its bundle could never run, so it fails where it is submitted
    (as in Ray) instead of waiting forever.
    """
    if isinstance(index, bool) or not isinstance(index, int) or not -1 <= index < len(bundles):
        raise ValueError(f"{what}: placement_group_bundle_index={index!r} is out of range; the "
                         f"group has {len(bundles)} bundle(s): use -1 (any) or 0..{len(bundles) - 1}")
    targets = bundles if index == -1 else [bundles[index]]
    if not any(fits(demand, b) for b in targets):
        which = "any bundle" if index == -1 else f"bundle {index}"
        raise ValueError(
            f"{what} asks for {demand}, which does not fit in {which} of its placement group "
            f"(bundles: {describe_bundles(bundles)}); its demand comes out of the bundle's "
            "reservation. Lower "
            "its num_cpus/resources, or reserve a bigger bundle.")


def describe_bundles(bundles) -> str:
    """A short text for a list of resource dicts (bundles, or nodes' totals): each run of
    equal ones as ``count × {CPU: 1}``, in order, so 99 trainers' bundles read
    ``99 × {CPU: 1}`` instead of 99 dicts (a warning that lists them all buries the point).
    Memory is written in GiB."""
    runs: list[list] = []
    for b in bundles:
        if runs and runs[-1][1] == b:
            runs[-1][0] += 1
        else:
            runs.append([1, b])
    return ", ".join(f"{n} × {_describe_resources(b)}" for n, b in runs)


def _describe_resources(resources: dict) -> str:
    parts = []
    for k, v in resources.items():
        if k in ("memory", "object_store_memory") and v >= 1 << 20:
            parts.append(f"{k}: {v / (1 << 30):.3g} GiB")
        else:
            parts.append(f"{k}: {v:g}")
    return "{" + ", ".join(parts) + "}"


def total_of(bundles) -> dict:
    out: dict = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


# -- the head's records ----------------------------------------------------------------------
class Reservation:
    """One bundle placed on one node: what the group's actors and tasks draw on.

    It is a fresh object each time its bundle is placed, so resources given back to an
    old one (whose node died, or whose group was removed) never leak into the new one.
    Like a node record, it has ``total``, ``available`` and ``alive``.
    """

    def __init__(self, group: Group, index: int, node):
        self.group = group
        self.index = index
        self.node = node
        self.total = dict(group.bundles[index])
        self.available = dict(self.total)
        self.active = True

    @property
    def alive(self) -> bool:
        return self.active and self.node.alive


class Group:
    def __init__(self, group_id: str, bundles: list[dict], strategy: str, name: str = "",
                 owner: str | None = None, detached: bool = False):
        self.group_id = group_id
        self.bundles = bundles
        self.strategy = strategy
        self.name = name
        self.owner = owner
        self.detached = detached
        self.state = PENDING
        self.reservations: list[Reservation | None] = [None] * len(bundles)
        self.changed = asyncio.Event()

    def touch(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def placed_nodes(self) -> list:
        return [r.node if r is not None else None for r in self.reservations]

    def commit(self, nodes: list) -> None:
        """Take every missing bundle out of its planned node's free pool, all at once."""
        for i, node in enumerate(nodes):
            if self.reservations[i] is None:
                subtract(node.available, self.bundles[i])
                self.reservations[i] = Reservation(self, i, node)
        self.state = CREATED
        self.touch()

    def release(self) -> None:
        """Give every reservation back to its node (the group is being removed)."""
        for i, r in enumerate(self.reservations):
            if r is not None:
                r.active = False
                if r.node.alive:
                    add(r.node.available, r.total, r.node.total)
                self.reservations[i] = None

    def drop_node(self, node) -> bool:
        """Forget the bundles placed on ``node`` (it died); True if there were any."""
        lost = False
        for i, r in enumerate(self.reservations):
            if r is not None and r.node is node:
                r.active = False
                self.reservations[i] = None
                lost = True
        if lost and self.state == CREATED:
            self.state = RESCHEDULING
            self.touch()
        return lost

    def view(self) -> dict:
        """Ray's ``placement_group_table`` entry for this group."""
        return {
            "placement_group_id": self.group_id, "name": self.name,
            "bundles": {i: dict(b) for i, b in enumerate(self.bundles)},
            "bundles_to_node_id": {i: r.node.node_id for i, r in enumerate(self.reservations)
                                   if r is not None},
            "strategy": self.strategy, "state": self.state,
            "is_detached": self.detached,
        }


# -- choosing nodes --------------------------------------------------------------------------
def plan(bundles: list[dict], strategy: str, nodes: list, fixed: list | None = None,
         use_total: bool = False) -> list | None:
    """A node for every bundle, or None if the strategy cannot be met now.

    ``nodes`` have ``.available`` and ``.total``; ``fixed[i]`` is the node bundle ``i`` is
    already on (None: to be placed). With ``use_total`` the nodes count as empty: that
    answers "could this group ever fit this cluster?".

    * ``STRICT_PACK``: every bundle on one node.
    * ``PACK``: one node if possible, else as few as a greedy fill finds.
    * ``STRICT_SPREAD``: every bundle on a different node.
    * ``SPREAD``: different nodes where possible, shared ones otherwise.

    Bundles are placed largest first; the search is greedy, so a group that only an
    exhaustive search could fit (rare mixes of bundle sizes) waits instead.
    """
    out = list(fixed) if fixed is not None else [None] * len(bundles)
    todo = [i for i, n in enumerate(out) if n is None]
    if not todo:
        return out
    free = {id(n): dict(n.total if use_total else n.available) for n in nodes}
    order = sorted(nodes, key=lambda n: -free[id(n)].get("CPU", 0.0))   # stable: ties keep order
    used = [n for n in out if n is not None]
    todo.sort(key=lambda i: -sum(bundles[i].values()))

    def room(n, i):
        return fits(bundles[i], free[id(n)])

    def take(n, i):
        subtract(free[id(n)], bundles[i])
        out[i] = n
        if n not in used:
            used.append(n)

    if strategy in ("STRICT_PACK", "PACK"):
        need = total_of(bundles[i] for i in todo)
        anchors = [n for n in order if n in used]
        candidates = anchors if strategy == "STRICT_PACK" and anchors else (
            anchors + [n for n in order if n not in used])
        for n in candidates:
            if fits(need, free[id(n)]):
                for i in todo:
                    take(n, i)
                return out
        if strategy == "STRICT_PACK":
            return None
        for i in todo:
            n = next((n for n in order if n in used and room(n, i)), None) or next(
                (n for n in order if room(n, i)), None)
            if n is None:
                return None
            take(n, i)
        return out
    for i in todo:
        fresh = [n for n in order if n not in used and room(n, i)]
        if fresh:
            n = max(fresh, key=lambda n: free[id(n)].get("CPU", 0.0))
        elif strategy == "SPREAD":
            n = next((n for n in order if room(n, i)), None)
        else:
            n = None
        if n is None:
            return None
        take(n, i)
    return out
