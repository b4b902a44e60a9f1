"""``ray.util.actor_pool``."""

from ddlf_actors.util.actor_pool import ActorPool

__all__ = ["ActorPool"]
