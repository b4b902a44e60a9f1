"""``ray.actor``: actor classes and handles."""

from ddlf_actors.actor import ActorClass, ActorHandle, ActorMethod

from ._missing import missing
from ._remote import RayActorClass

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "RayActorClass", "exit_actor"]


def exit_actor():
    """``ray.actor.exit_actor``: DDLF's, once DDLF has it."""
    import ddlf_actors.actor as _actor

    fn = getattr(_actor, "exit_actor", None)
    if fn is None:
        raise missing("actor.exit_actor")
    return fn()


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"actor.{name}")
