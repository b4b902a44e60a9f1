"""``ray.util.scheduling_strategies``: node affinity only (DDLF has no placement groups)."""

from .._missing import missing
from .._remote import NodeAffinitySchedulingStrategy

__all__ = ["NodeAffinitySchedulingStrategy"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"util.scheduling_strategies.{name}")
