"""``ray.actor``: actor classes and handles."""

from ddlf_actors.actor import ActorClass, ActorHandle, ActorMethod, exit_actor

from ._missing import missing
from ._remote import RayActorClass

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "RayActorClass", "exit_actor"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"actor.{name}")
