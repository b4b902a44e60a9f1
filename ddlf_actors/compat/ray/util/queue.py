"""``ray.util.queue``: DDLF's actor-backed queue."""

from ddlf_actors.util.queue import Empty, Full, Queue

__all__ = ["Queue", "Empty", "Full"]
