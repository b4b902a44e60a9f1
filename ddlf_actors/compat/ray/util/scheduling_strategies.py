"""``ray.util.scheduling_strategies``: DDLF's node affinity and placement group strategies."""

from ddlf_actors.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from .._missing import missing

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"util.scheduling_strategies.{name}")
