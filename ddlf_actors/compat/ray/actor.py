"""``ray.actor``: actor classes and handles."""

from ddlf_actors.actor import ActorClass, ActorHandle, ActorMethod

from ._missing import NotProvidedError, not_provided
from ._remote import RayActorClass

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "RayActorClass", "exit_actor"]


def exit_actor():
    """``ray.actor.exit_actor``: DDLF's, once DDLF has it."""
    import ddlf_actors.actor as _actor

    fn = getattr(_actor, "exit_actor", None)
    if fn is None:
        raise NotProvidedError(not_provided("actor.exit_actor"))
    return fn()


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotProvidedError(not_provided(f"actor.{name}"))
