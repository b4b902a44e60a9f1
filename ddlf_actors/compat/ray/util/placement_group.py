"""``ray.util.placement_group``: DDLF's placement groups.

In Ray, ``ray.util.placement_group`` is both this module and the function that creates a
group. Importing the module as ``ray.util.placement_group`` binds the module over the
function on ``ray.util``, so the module is callable and creates a group, and
``ray.util.placement_group([...])`` works whichever import ran first.
"""

import sys
import types

from ddlf_actors.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = ["PlacementGroup", "placement_group", "remove_placement_group", "get_placement_group",
           "placement_group_table", "get_current_placement_group"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return placement_group(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
