"""Utilities built on actors: :class:`ActorPool` and :mod:`ddlf_actors.util.queue`."""

from ddlf_actors.util import queue
from ddlf_actors.util.actor_pool import ActorPool

__all__ = ["ActorPool", "queue"]
