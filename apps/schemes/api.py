"""``train(model_fn, dataset, scheme=...)``: one entry point for every registered scheme."""

from __future__ import annotations

from ..config import TrainConfig
from ..result import TrainResult
from . import registry

__all__ = ["train"]


def train(model_fn, dataset, scheme: str = "sync", *, trainers=None, initial_weights=None,
          resume=None, **options) -> TrainResult:
    """Train ``model_fn()`` data-parallel with the scheme registered as ``scheme``.

    ``scheme``: ``"sync"`` (the default), ``"async"``, ``"easgd"``, ``"downpour"``, or any
    name in ``registry.names()``. ``options`` are the fields of :class:`TrainConfig`; a
    scheme-level setting left out takes the scheme's default, and one the scheme does not
    read is refused. ``trainers``: actors to adopt instead of starting new ones;
    ``initial_weights``: where to start; ``resume=DIR``: continue from the newest
    checkpoint in DIR (written by the same scheme) and keep checkpointing there.

    Raises ``UnknownSchemeError`` (a ``ValueError``) naming the registered schemes,
    ``TypeError`` for an unknown option, ``ValueError`` for a bad value or a setting of
    another scheme, and whatever :func:`train_sync` raises.
    """
    cls = registry.get(scheme)
    if resume is not None and options.get("checkpoint_dir") is None:
        options["checkpoint_dir"] = resume
    caller = "train" if scheme not in ("sync", "async") else f"train_{scheme}"
    config = TrainConfig.from_options(options, caller=caller)
    return cls(model_fn, dataset, config, trainers).run(initial_weights, resume)
