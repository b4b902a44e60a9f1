"""Where an actor or task runs: ``.options(scheduling_strategy=...)``, as in Ray.

* ``"DEFAULT"``: the least loaded node with room (the default).
* ``"SPREAD"``: round-robin over the nodes with room.
* :class:`NodeAffinitySchedulingStrategy`: one node, hard or soft.
* :class:`PlacementGroupSchedulingStrategy`: a bundle of a placement group; the demand
  comes out of the bundle's reservation.

With no ``scheduling_strategy``, work submitted from inside a placement group that
captures child tasks runs in that group too.
"""

from __future__ import annotations

from ddlf_actors.ids import NodeID
from ddlf_actors.runtime import context
from ddlf_actors.runtime.scheduling import Scheduling, Strategy

__all__ = ["PlacementGroupSchedulingStrategy", "NodeAffinitySchedulingStrategy"]


class PlacementGroupSchedulingStrategy:
    """Run in bundle ``placement_group_bundle_index`` (-1: any bundle with room) of
    ``placement_group``; its actors and tasks take their demand out of that bundle.

    ``placement_group_capture_child_tasks=True`` makes tasks and actors that it submits
    without a ``scheduling_strategy`` run in the same group; None (the default) keeps
    the current task's setting, as in Ray. ``placement_group=None`` means no group.
    """

    def __init__(self, placement_group, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: bool | None = None):
        if placement_group is not None and not hasattr(placement_group, "bundle_specs"):
            raise ValueError(f"placement_group must be a PlacementGroup (from "
                             f"ddlf.util.placement_group(...)) or None, got {placement_group!r}")
        index = placement_group_bundle_index
        if isinstance(index, bool) or not isinstance(index, int) or index < -1:
            raise ValueError(f"placement_group_bundle_index must be -1 (any bundle) or a bundle "
                             f"index >= 0, got {index!r}")
        if placement_group is not None and index >= len(placement_group.bundle_specs):
            raise ValueError(f"placement_group_bundle_index={index} is out of range: the group "
                             f"has {len(placement_group.bundle_specs)} bundle(s)")
        capture = placement_group_capture_child_tasks
        if capture is not None and not isinstance(capture, bool):
            raise ValueError(f"placement_group_capture_child_tasks must be True, False or None, "
                             f"got {capture!r}")
        self.placement_group = placement_group
        self.placement_group_bundle_index = index
        self.placement_group_capture_child_tasks = capture

    def __repr__(self):
        return (f"PlacementGroupSchedulingStrategy({self.placement_group!r}, "
                f"bundle_index={self.placement_group_bundle_index}, "
                f"capture_child_tasks={self.placement_group_capture_child_tasks})")


class NodeAffinitySchedulingStrategy:
    """Run on the node ``node_id`` (see ``ddlf.nodes()``; a ``NodeID`` is taken too).

    ``soft=False``: only there; it fails if that node is dead, unknown or too small, and
    waits while it is busy. ``soft=True``: there if that node is alive and can ever fit
    the demand (waiting while it is busy, as in Ray), anywhere else otherwise.
    ``_spill_on_unavailable=True`` (soft) goes elsewhere rather than wait for a busy node;
    ``_fail_on_unavailable=True`` (hard) fails rather than wait.
    """

    def __init__(self, node_id: str, soft: bool, _spill_on_unavailable: bool = False,
                 _fail_on_unavailable: bool = False):
        if isinstance(node_id, NodeID):   # get_runtime_context().node_id, as Ray takes it
            node_id = node_id.hex()
        if not isinstance(node_id, str) or not node_id:
            raise ValueError(f"node_id must be a node id string (see ddlf.nodes()), got "
                             f"{node_id!r}")
        if not isinstance(soft, bool):
            raise ValueError(f"soft must be True or False, got {soft!r}")
        self.node_id = node_id
        self.soft = soft
        self._spill_on_unavailable = bool(_spill_on_unavailable)
        self._fail_on_unavailable = bool(_fail_on_unavailable)

    def __repr__(self):
        return f"NodeAffinitySchedulingStrategy(node_id={self.node_id!r}, soft={self.soft})"


_NAMED = tuple(s.value for s in Strategy)


def check(strategy) -> None:
    """``ValueError`` unless ``strategy`` is a valid ``scheduling_strategy`` value."""
    if strategy is None or strategy in _NAMED or isinstance(
            strategy, (PlacementGroupSchedulingStrategy, NodeAffinitySchedulingStrategy)):
        return
    raise ValueError(f"scheduling_strategy must be 'DEFAULT', 'SPREAD', a "
                     f"NodeAffinitySchedulingStrategy or a PlacementGroupSchedulingStrategy, "
                     f"got {strategy!r}")


def resolve(options: dict) -> dict:
    """The options the core takes: ``scheduling_strategy`` becomes a ``Scheduling`` under
    ``"scheduling"`` (or none: DEFAULT), with capture by the current group applied."""
    options = dict(options)
    strategy = options.pop("scheduling_strategy", None)
    current = context.current.placement if context.current is not None else None
    sched = None
    if strategy is None:
        if current and current.get("capture") and not options.get("node_id"):
            sched = Scheduling(group_id=current["group_id"], capture=True,
                               bundles=tuple(current["bundles"]))
    elif strategy == "SPREAD":
        sched = Scheduling(strategy=Strategy.SPREAD)
    elif isinstance(strategy, NodeAffinitySchedulingStrategy):
        sched = Scheduling(node_id=strategy.node_id, soft=strategy.soft,
                           spill=strategy._spill_on_unavailable,
                           fail=strategy._fail_on_unavailable)
    elif isinstance(strategy, PlacementGroupSchedulingStrategy) and \
            strategy.placement_group is not None:
        capture = strategy.placement_group_capture_child_tasks
        if capture is None:
            capture = bool(current and current.get("capture"))
        pg = strategy.placement_group
        sched = Scheduling(group_id=pg.id, bundle_index=strategy.placement_group_bundle_index,
                           capture=capture, bundles=tuple(dict(b) for b in pg.bundle_specs))
    if sched is not None:
        options["scheduling"] = sched
    return options
