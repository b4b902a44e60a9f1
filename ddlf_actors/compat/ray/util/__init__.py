"""``ray.util`` over DDLF: ``ActorPool``, ``queue``, ``list_named_actors``, placement groups,
scheduling strategies.

Other ``ray.util`` names (collective, state, ...) raise an error that names them and says
why DDLF lacks them.
"""

from __future__ import annotations

from ddlf_actors.runtime.states import ActorState
from ddlf_actors.util import ActorPool

from .._missing import module_getattr
from . import placement_group as _placement_group_module  # noqa: F401 - before the names below
from . import queue, scheduling_strategies
from .placement_group import (
    PlacementGroup,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = ["ActorPool", "queue", "scheduling_strategies", "list_named_actors", "PlacementGroup",
           "placement_group", "remove_placement_group", "get_placement_group",
           "placement_group_table", "get_current_placement_group"]


def list_named_actors(all_namespaces: bool = False) -> list:
    """Names of the live named actors (dicts with ``name``/``namespace`` if ``all_namespaces``)."""
    from ddlf_actors import autoinit

    names = sorted({a["name"] for a in autoinit.core().head_call("list_actors")
                    if a.get("name") and a.get("state") != ActorState.DEAD})
    if all_namespaces:
        return [{"name": n, "namespace": ""} for n in names]
    return names


__getattr__ = module_getattr(__name__, "util.", ("actor_pool",))
