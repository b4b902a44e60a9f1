"""Training schemes by name: what ``train(..., scheme=NAME)`` and ``ddlf-train --scheme`` take.

A scheme is one module under ``apps/schemes/`` holding its options dataclass and its
:class:`~.machine.Machine` subclass; ``apps/schemes/__init__.py`` registers each one under
its name. Adding a scheme is that file plus one ``register`` line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .machine import Machine

__all__ = ["register", "get", "names", "accepting", "option_names", "UnknownSchemeError"]

_SCHEMES: dict[str, type[Machine]] = {}


class UnknownSchemeError(ValueError):
    """No scheme is registered under that name."""


def register(name: str, cls: type) -> type:
    """Make ``cls`` (a ``Machine`` subclass) the scheme called ``name``; return it.

    Raises ``ValueError`` if another class already holds the name.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a scheme's name must be a non-empty string, got {name!r}")
    held = _SCHEMES.get(name)
    if held is not None and held is not cls:
        raise ValueError(f"scheme {name!r} is already registered to {held.__qualname__}")
    _SCHEMES[name] = cls
    return cls


def get(name: str) -> type[Machine]:
    """The scheme registered as ``name``; ``UnknownSchemeError`` naming the others."""
    try:
        return _SCHEMES[name]
    except (KeyError, TypeError):
        raise UnknownSchemeError(f"unknown scheme {name!r}: the registered schemes are "
                                 f"{', '.join(names())}") from None


def names() -> list[str]:
    """The registered names, in registration order."""
    return list(_SCHEMES)


def accepting(option: str) -> list[str]:
    """The names of the schemes whose options include ``option``."""
    return [n for n, cls in _SCHEMES.items() if option in cls.Options.names()]


def option_names() -> list[str]:
    """Every scheme-level setting of every registered scheme, each once, in order."""
    return list(dict.fromkeys(n for cls in _SCHEMES.values() for n in cls.Options.names()))
