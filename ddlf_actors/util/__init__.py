"""Utilities built on actors and the scheduler: :class:`ActorPool`,
:mod:`ddlf_actors.util.queue`, :mod:`ddlf_actors.util.progress`, placement groups and scheduling strategies,
and :mod:`ddlf_actors.util.dashboard` (publishing runs to the head's web dashboard)."""

from ddlf_actors.util import dashboard, progress, queue, scheduling_strategies
from ddlf_actors.util.actor_pool import ActorPool
from ddlf_actors.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ddlf_actors.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

__all__ = ["ActorPool", "dashboard", "progress", "queue", "scheduling_strategies", "PlacementGroup", "placement_group",
           "remove_placement_group", "get_placement_group", "placement_group_table",
           "get_current_placement_group", "PlacementGroupSchedulingStrategy",
           "NodeAffinitySchedulingStrategy"]
