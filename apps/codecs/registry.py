"""Codecs by name, and the spec strings users give.

A spec is ``name``, ``name:param``, or either with ``:ef`` / ``:noef`` to turn error
feedback on or off for a lossy codec: ``none``, ``lz4``, ``zstd``, ``zstd:9``, ``fp16``,
``int8``, ``int8:ef``, ``topk:0.01``, ``topk:0.01:noef``. A pair ``(down, up)`` names
the codec for weights (driver to trainer) and for deltas (trainer to driver).

To add a codec, write a :class:`~.base.Codec` subclass with a new ``name`` and decorate
it with :func:`register`; its spec strings then work everywhere.
"""

from __future__ import annotations

from .base import Codec, Encoded

__all__ = ["register", "get", "names", "forms", "resolve_pair", "decode"]

_CODECS: dict[str, type[Codec]] = {}
_FLAGS = {"ef": True, "noef": False}


def register(cls: type[Codec]) -> type[Codec]:
    """Make spec strings naming ``cls.name`` build ``cls``. Returns ``cls`` (a decorator).

    Raises ValueError for a name that is empty, holds ``:``, or is taken by another class.
    """
    name = cls.name
    if not name or ":" in name or name != name.strip().lower() or name in _FLAGS:
        raise ValueError(f"a codec name must be a non-empty lower-case word without ':' "
                         f"and not 'ef'/'noef', got {name!r}")
    other = _CODECS.get(name)
    if other is not None and other.__qualname__ != cls.__qualname__:
        raise ValueError(f"codec name {name!r} is taken by {other.__module__}."
                         f"{other.__qualname__}")
    _CODECS[name] = cls
    return cls


def names() -> list[str]:
    """The registered codec names."""
    return list(_CODECS)


def forms() -> str:
    """The valid spec forms, for error messages."""
    return (", ".join(cls.form for cls in _CODECS.values())
            + "; a lossy codec also takes ':ef' or ':noef' (error feedback on or off)"
            + "; or a pair (down, up) of these")


def get(spec=None) -> Codec:
    """The codec a spec names: a string, a :class:`Codec` (returned as it is), or None
    (``none``).

    Raises ValueError naming the valid forms for a spec that is not one of them, and
    :class:`~.base.CodecUnavailableError` (also a ValueError) with the pip command when
    the codec's library is not installed here.
    """
    if spec is None:
        spec = "none"
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a codec spec is a string such as 'zstd' or 'topk:0.01', or a Codec, "
                        f"got {type(spec).__name__}: valid forms are {forms()}")
    name, *fields = spec.strip().lower().split(":")
    cls = _CODECS.get(name)
    if cls is None:
        raise ValueError(f"unknown codec {spec!r}: valid forms are {forms()}")
    feedback = None
    params = []
    for f in fields:
        if f in _FLAGS:
            if feedback is not None:
                raise ValueError(f"codec spec {spec!r} sets error feedback twice: valid forms "
                                 f"are {forms()}")
            feedback = _FLAGS[f]
        else:
            params.append(f)
    if len(params) > 1:
        raise ValueError(f"codec spec {spec!r} has {len(params)} parameters; {name} takes at "
                         f"most one: valid forms are {forms()}")
    try:
        codec = cls.from_param(params[0] if params else None, feedback)
    except ValueError as e:
        raise ValueError(f"bad codec spec {spec!r}: {e}. Valid forms are {forms()}") from None
    cls.available()
    return codec


def resolve_pair(spec=None) -> tuple[Codec, Codec]:
    """``(down, up)``: the codecs for weights (driver to trainers) and for deltas
    (trainers to driver).

    ``spec`` is one spec for both directions (a string, a Codec or None) or a pair
    ``(down, up)`` of them. Raises like :func:`get`, and ValueError for a sequence that
    is not a pair.
    """
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ValueError(f"a codec pair is (down, up), two specs, got {len(spec)}: "
                             f"{spec!r}. Valid forms are {forms()}")
        return get(spec[0]), get(spec[1])
    codec = get(spec)
    return codec, codec


def decode(payload: Encoded) -> list:
    """Decode a payload with the codec named in it (its own parameters do not matter to
    decoding). Raises ValueError for something that is not a payload of a known codec."""
    if not isinstance(payload, Encoded):
        raise ValueError(f"decode takes an Encoded payload, got {type(payload).__name__}")
    cls = _CODECS.get(payload.codec)
    if cls is None:
        raise ValueError(f"payload of unknown codec {payload.codec!r}: known codecs are "
                         f"{names()}; import the module that registers it")
    return cls.decoder().decode(payload)
