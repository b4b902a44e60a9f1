"""``ray.experimental``: only ``tqdm_ray`` (compiled graphs are ``ray.dag``'s
``experimental_compile()``). Other names fail with the layer's error naming them."""

from __future__ import annotations

from .._missing import NotProvidedError, not_provided

__all__ = ["tqdm_ray"]


def __getattr__(name: str):
    if name == "tqdm_ray":
        import importlib

        return importlib.import_module(f"{__name__}.tqdm_ray")
    raise NotProvidedError(not_provided(f"experimental.{name}"))
