"""``ray._private``: only ``internal_api`` (``free``, ``memory_summary``) is provided."""

from .._missing import missing

__all__ = ["internal_api"]


def __getattr__(name: str):
    if name == "internal_api":
        import importlib

        return importlib.import_module(f"{__name__}.internal_api")
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing(f"_private.{name}")
