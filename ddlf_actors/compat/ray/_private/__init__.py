"""``ray._private``: only ``internal_api`` (``free``, ``memory_summary``) is provided."""

from .._missing import module_getattr

__all__ = ["internal_api"]

__getattr__ = module_getattr(__name__, "_private.", ("internal_api",))
