"""Framework adapters, by name: what a trainer uses to hold and train its model.

    adapter_cls = frameworks.for_model(model)     # picked by the model's type
    adapter = adapter_cls(model, options)

Each adapter is one module implementing :class:`~.base.FrameworkAdapter`; a new framework
is that module plus one :func:`register` call here.
"""

from __future__ import annotations

from typing import Any

from .base import FrameworkAdapter

__all__ = ["FrameworkAdapter", "register", "get", "names", "for_model",
           "UnknownFrameworkError"]

_ADAPTERS: dict[str, type[FrameworkAdapter]] = {}


class UnknownFrameworkError(TypeError):
    """No registered adapter holds this model, or none has that name."""


def register(cls: type[FrameworkAdapter]) -> type[FrameworkAdapter]:
    """Make ``cls`` the adapter called ``cls.name``; return it (usable as a decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    held = _ADAPTERS.get(cls.name)
    if held is not None and held is not cls:
        raise ValueError(f"framework {cls.name!r} is already registered to {held.__qualname__}")
    _ADAPTERS[cls.name] = cls
    return cls


def get(name: str) -> type[FrameworkAdapter]:
    """The adapter registered as ``name``; ``UnknownFrameworkError`` naming the others."""
    try:
        return _ADAPTERS[name]
    except KeyError:
        raise UnknownFrameworkError(f"unknown framework {name!r}: the registered ones are "
                                    f"{', '.join(names())}") from None


def names() -> list[str]:
    return list(_ADAPTERS)


def for_model(model: Any) -> type[FrameworkAdapter]:
    """The adapter whose framework ``model`` belongs to.

    Raises ``UnknownFrameworkError`` naming what is supported, and how to train another
    framework (an adapter, or ``trainer_cls=`` with the TrainerActor hooks)."""
    for cls in _ADAPTERS.values():
        if cls.owns(model):
            return cls
    raise UnknownFrameworkError(
        f"model_fn returned a {type(model).__module__}.{type(model).__qualname__}, which no "
        f"framework adapter holds (registered: {', '.join(names())}). Return a Keras model "
        "or a torch.nn.Module, or register an adapter (apps/frameworks/base.py), or subclass "
        "TrainerActor and pass trainer_cls=")


def _register_builtin() -> None:
    # Keras first: on Keras' torch backend a keras.Model is a torch.nn.Module too.
    from .keras import KerasAdapter
    from .torch import TorchAdapter  # imports no torch: only its methods do

    register(KerasAdapter)
    register(TorchAdapter)


_register_builtin()
