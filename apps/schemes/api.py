"""``train(model_fn, dataset, scheme=...)``: one entry point for every registered scheme."""

from __future__ import annotations

import difflib

from ..config import TrainConfig
from ..options import ConfigError, SchemeOptions
from ..result import TrainResult
from . import auto, registry
from .driver import Driver

__all__ = ["train", "train_sync", "train_async", "train_allreduce", "split_options",
           "resolve_options"]


def split_options(scheme: str, options: dict, *,
                  caller: str = "train") -> tuple[TrainConfig, SchemeOptions]:
    """``options`` (keywords of ``train``) as the run's ``TrainConfig`` and the scheme's
    options dataclass, each checked (the scheme's defaults are not filled in yet).

    Raises ``UnknownSchemeError``, ``TypeError`` naming an unknown option (with the
    closest known one), ``ConfigError`` for a bad value or for a setting of another scheme
    (naming the schemes that read it).
    """
    cls = registry.get(scheme)
    shared = TrainConfig.names()
    own = cls.Options.names()
    for name in options:
        if name in shared or name in own:
            continue
        readers = registry.accepting(name)
        if readers:
            raise ConfigError(f"{name}=", f"does not apply to the {scheme!r} scheme; it is read "
                              "by " + ", ".join(repr(n) for n in readers)
                              + " (train(..., scheme=...), ddlf-train run --scheme ...)")
        known = shared + registry.option_names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(f"{caller}() got an unknown option {name!r}{hint} Options are the "
                        f"fields of TrainConfig ({', '.join(shared)}) and of "
                        f"{cls.Options.__name__} ({', '.join(own)})")
    kw = {k: v for k, v in options.items() if k in shared}
    kw["callbacks"] = list(kw.get("callbacks") or ())
    kw["trainer_options"] = dict(kw.get("trainer_options") or {})
    config = TrainConfig(**kw)
    return config, cls.Options(**{k: v for k, v in options.items() if k in own})


def resolve_options(scheme: str, **options) -> tuple[TrainConfig, SchemeOptions]:
    """What a run of ``scheme`` with ``options`` would use, checked, with the scheme's
    defaults filled in (those that depend on the data's size, like sync's
    ``rounds_per_epoch``, stay None): ``(TrainConfig, the scheme's options)``. Raises as
    :func:`train` does for bad options, without starting anything."""
    config, opts = split_options(scheme, options)
    return config, opts.resolve(config)


def train(model_fn, dataset, scheme: str = "auto", *, trainers=None, initial_weights=None,
          resume=None, **options) -> TrainResult:
    """Train ``model_fn()`` data-parallel with the scheme registered as ``scheme``.

    ``scheme``: ``"auto"`` (the default: ``allreduce`` with its steps per round and codec
    chosen from K, the model's size and a start-up probe of the trainers; ``auto.py``),
    ``"sync"``, ``"async"``, ``"allreduce"``, ``"easgd"``,
    ``"downpour"``, or any name in ``registry.names()``. ``options`` are the fields of
    :class:`TrainConfig` and of the scheme's options dataclass (``SyncOptions`` ...); a
    scheme setting left out takes the scheme's default, and one the scheme does not read
    is refused. ``trainers``: actors to adopt instead of starting new ones;
    ``initial_weights``: where to start; ``resume=DIR``: continue from the newest
    checkpoint in DIR (written by the same scheme) and keep checkpointing there.

    Raises ``UnknownSchemeError`` (a ``ValueError``) naming the registered schemes,
    ``TypeError`` for an unknown option, ``ConfigError`` (a ``ValueError``) for a bad value
    or a setting of another scheme, and whatever :func:`train_sync` raises.
    """
    if resume is not None and options.get("checkpoint_dir") is None:
        options["checkpoint_dir"] = resume
    if scheme == "auto":   # an explicit setting of another scheme wins over auto's choice
        scheme = auto.named_by(options) or scheme
    caller = f"train_{scheme}" if scheme in ("sync", "async", "allreduce") else "train"
    config, scheme_options = split_options(scheme, options, caller=caller)
    driver = Driver(registry.get(scheme), model_fn, dataset, config, scheme_options, trainers)
    return driver.run(initial_weights, resume)


def train_sync(model_fn, dataset, *, trainers=None, initial_weights=None, resume=None,
               **options):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers, synchronously.

    ``dataset``: a registered name, a callable returning ``((x, y), (x_test, y_test))``
    (shipped once, run on each trainer), or ``datasets.partitioned(path)``. ``options``
    are the fields of :class:`TrainConfig` (``workers``, ``master_epochs``,
    ``worker_epochs``, ``batch_size``, ``min_workers``, ``rejoin_timeout_s``,
    ``checkpoint_dir``, ``checkpoint_every``, ``target_accuracy``, ``patience``, ``seed``,
    ``callbacks``, ...) and of :class:`SyncOptions` (``rounds_per_epoch``, the outer
    optimizer, ``lr_schedule``; slow nodes: ``backup_workers=b`` closes each round once
    all but ``b`` deltas are in and folds the late ones into a later round, scaled by
    ``1/(1 + staleness)``; ``balance=True`` sizes each trainer's partition by its measured
    samples/s; see ``docs/training.md``). Stops after ``master_epochs``, or when
    ``target_accuracy`` is reached, or after ``patience`` evaluations without a better
    test loss. Returns a ``TrainResult`` (``history``, ``weights``, ``model``,
    ``events``). Starts an embedded cluster if ``ddlf.init()`` was not called.

    The trainers' CPUs are reserved first, together, as a placement group
    (``placement_strategy``, one bundle per trainer), so a run never starts half-placed.
    A trainer lost mid-run is replaced; see ``docs/training.md``. ``resume=DIR``
    continues from the newest checkpoint in DIR (and keeps checkpointing there).

    Raises ``TypeError`` for an unknown option, ``ConfigError`` (a ``ValueError``) for a bad
    value, a setting of another scheme or an unknown dataset, ``UnschedulableError``
    (naming the demand) when the cluster can never hold the first trainers or has not
    freed them within ``placement_timeout_s``, ``TrainerStartError`` when ``model_fn`` or
    the dataset fails on a trainer, ``TooFewTrainersError`` when fewer than
    ``min_workers`` are left for longer than ``rejoin_timeout_s``,
    ``FileNotFoundError``/``CheckpointMismatchError`` for a ``resume`` directory without
    a checkpoint or of another model or dataset.
    """
    return train(model_fn, dataset, "sync", trainers=trainers, initial_weights=initial_weights,
                 resume=resume, **options)


def train_async(model_fn, dataset, *, trainers=None, initial_weights=None, resume=None,
                **options):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers, asynchronously.

    Same arguments and errors as :func:`train_sync`, with :class:`AsyncOptions`
    (``staleness_bound``: SSP, no trainer runs more than that many updates ahead of the
    slowest live one; ``staleness_scaling``: divide a delta by its staleness + 1) in place
    of sync's. ``result.updates`` records, per applied update, the trainer, the versions,
    its staleness and how far ahead of the slowest trainer it started (``lead``); after a
    resume it holds the resumed part only. ``checkpoint_every`` counts rounds of
    ``workers`` updates.
    """
    return train(model_fn, dataset, "async", trainers=trainers, initial_weights=initial_weights,
                 resume=resume, **options)


def train_allreduce(model_fn, dataset, *, trainers=None, initial_weights=None, resume=None,
                    **options):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers that average their deltas
    among themselves (ring allreduce), synchronously.

    Same arguments, options and errors as :func:`train_sync` (without its slow-node
    settings, with ``chunk_timeout_s``); the history rows are rounds, with
    ``collective_s`` (the allreduce's time) and ``ring_bytes`` (what the trainers sent
    each other) besides the usual keys. The driver sends indices and control only; the
    weights reach it at checkpoints and at the end. Raises :class:`WeightsLostError` (a
    ``TooFewTrainersError``) when every trainer holding the weights is lost at once, and
    :class:`CollectiveError` when a collective keeps failing with no trainer lost.
    """
    return train(model_fn, dataset, "allreduce", trainers=trainers,
                 initial_weights=initial_weights, resume=resume, **options)
