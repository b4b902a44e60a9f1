"""``ray._raylet``: only the public types Ray's docs import from it."""

from ddlf_actors.ids import (
    ActorID,
    BaseID,
    JobID,
    NodeID,
    PlacementGroupID,
    TaskID,
    WorkerID,
)
from ddlf_actors.runtime.client.generators import DynamicObjectRefGenerator, ObjectRefGenerator
from ddlf_actors.runtime.client.object_ref import ObjectRef

from ._missing import missing

__all__ = ["ObjectRef", "ObjectRefGenerator", "DynamicObjectRefGenerator", "BaseID", "JobID",
           "NodeID", "WorkerID", "TaskID", "ActorID", "PlacementGroupID"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"_raylet.{name}")
