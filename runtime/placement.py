"""Placement groups, the caller's side: what a group and the work scheduled in it may
ask for, checked before anything reaches the head.

The head's bookkeeping of groups (which nodes hold which bundles, what work draws on
them) is ``head/placement_groups.py``.
"""

from __future__ import annotations

from enum import Enum

from .scheduling import fits

__all__ = ["PlacementStrategy", "STRATEGIES", "check_bundles", "check_strategy",
           "check_bundle_fit", "total_of", "describe_bundles"]


class PlacementStrategy(str, Enum):
    """How a group's bundles are spread over nodes (Ray's names)."""

    PACK = "PACK"                     # as few nodes as possible, one if it fits
    SPREAD = "SPREAD"                 # different nodes where possible
    STRICT_PACK = "STRICT_PACK"       # all on one node
    STRICT_SPREAD = "STRICT_SPREAD"   # each on a different node

    def __str__(self) -> str:
        return self.value


STRATEGIES = tuple(s.value for s in PlacementStrategy)


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


def check_strategy(strategy) -> PlacementStrategy:
    """``strategy`` as a :class:`PlacementStrategy`; ``ValueError`` naming the valid ones."""
    if isinstance(strategy, str) and strategy in STRATEGIES:
        return PlacementStrategy(strategy)
    raise ValueError(f"unknown placement strategy {strategy!r}; use one of "
                     f"{', '.join(repr(s) for s in STRATEGIES)}")


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
