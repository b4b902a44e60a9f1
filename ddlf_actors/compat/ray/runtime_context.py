"""``ray.runtime_context``."""

from . import RuntimeContext, get_runtime_context

__all__ = ["RuntimeContext", "get_runtime_context"]
