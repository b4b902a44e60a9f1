"""``ray.experimental``: only ``tqdm_ray`` (compiled graphs are ``ray.dag``'s
``experimental_compile()``). Other names fail with the layer's error naming them."""

from __future__ import annotations

from .._missing import module_getattr

__all__ = ["tqdm_ray"]

__getattr__ = module_getattr(__name__, "experimental.", ("tqdm_ray",))
