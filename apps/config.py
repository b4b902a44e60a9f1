"""One configuration for a training run, shared by the keyword API, ``App`` and the CLI.

``train_sync(model_fn, dataset, **options)`` takes the fields of :class:`TrainConfig` as
keyword options; this module is the one place that knows their defaults and checks them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

__all__ = ["TrainConfig", "ConfigError", "SCHEME_OPTIONS", "ASYNC_ONLY",
           "LR_SCALINGS", "describe_schedule"]

# Settings that belong to a scheme: None means "the scheme's own default", and a scheme
# refuses one it does not read (each Scheme class lists the ones it reads in ``options``).
SCHEME_OPTIONS = ("rounds_per_epoch", "eval_every", "staleness_bound", "staleness_scaling", "outer_lr",
                  "outer_momentum", "nesterov", "lr_scaling", "warmup_rounds", "lr_schedule",
                  "alpha", "tau", "n_fetch", "n_push", "backup_workers", "balance")
# Kept for callers of the first version: the options only asynchronous schemes read.
ASYNC_ONLY = ("staleness_bound", "staleness_scaling")


class ConfigError(ValueError):
    """An option of a run is wrong: ``option`` names it as the message does (``"workers"``,
    ``"min_workers=3"``), ``problem`` says what is wrong and how to fix it. A ``ValueError``,
    so callers that catch that keep working; the CLI names the flag from ``option``."""

    def __init__(self, option: str, problem: str):
        super().__init__(f"{option} {problem}")
        self.option = option
        self.problem = problem

# Where the linear scaling rule for K trainers applies (Goyal et al. 2017): nowhere, to the
# trainers' learning rate, or to the driver's outer learning rate.
LR_SCALINGS = ("none", "inner", "outer")


def _int_at_least(name: str, v, low: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(name, f"must be an int >= {low}, got {v!r}")


def _number(name: str, v, low: float, high: float, *, low_open=False, high_open=False) -> None:
    ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and v == v
          and (v > low if low_open else v >= low) and (v < high if high_open else v <= high))
    if not ok:
        span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in {span}, got {v!r}")


def _rate(name: str, v) -> None:
    """A learning rate: a number > 0, or a schedule (a Keras one, or any f(step) -> rate)."""
    if callable(v):
        return
    _number(name, v, 0.0, float("inf"), low_open=True, high_open=True)


def _seconds(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise ConfigError(name, f"must be a number of seconds >= 0, got {v!r}")


@dataclasses.dataclass
class TrainConfig:
    """What a run needs besides the model and the dataset.

    ``workers`` trainers take ``num_cpus`` CPUs each. A master epoch is one pass of the
    training set split over the trainers; ``worker_epochs`` is how many local epochs a
    trainer runs on its share before reporting a delta (the paper's N).
    ``rounds_per_epoch`` splits each epoch into that many rounds, averaging after each
    (local SGD: more rounds, more communication, usually better accuracy per epoch).

    Scheme-level settings (``rounds_per_epoch``, ``eval_every``, the outer optimizer ``outer_lr``,
    ``outer_momentum`` and ``nesterov``, the K-scaling rule ``lr_scaling`` with its
    ``warmup_rounds``, the trainers' ``lr_schedule``, EASGD's ``alpha`` and ``tau``,
    Downpour's ``n_fetch`` and ``n_push``, SSP's ``staleness_bound`` and
    ``staleness_scaling``) default to None: the scheme's own default. A scheme refuses a
    setting it does not read; see ``docs/training.md`` for which reads what.

    Fault tolerance: a lost trainer is replaced in its reserved slot when it can be, and
    the run goes on without it meanwhile, down to ``min_workers``; below that it waits up
    to ``rejoin_timeout_s`` for capacity, then fails. ``workers=(lo, hi)`` is elastic:
    training starts once ``lo`` trainers are placed and grows toward ``hi`` as CPUs appear.
    ``checkpoint_dir`` keeps a checkpoint every ``checkpoint_every`` rounds (1 by default);
    ``train_sync(..., resume=DIR)`` continues from the last one.

    ``compression`` encodes what crosses the wire: a codec spec for both directions
    (``"fp16"``, ``"topk:0.01"``, ...) or a pair ``(down, up)`` for the weights the driver
    sends and the deltas the trainers return; None or ``"none"`` sends arrays as they are.
    See ``docs/training.md``.
    """

    workers: int = 2
    master_epochs: int = 1
    worker_epochs: int = 1
    batch_size: int = 32
    rounds_per_epoch: int | None = None
    # Sync: evaluate every this many rounds (and the last one); the others' rows have no
    # test accuracy. Default: once per epoch.
    eval_every: int | None = None
    num_cpus: float = 1
    # The fewest trainers a run goes on with; default 1, or the low end of workers=(lo, hi).
    min_workers: int | None = None
    # Set by workers=(lo, hi): start with lo placed, grow toward hi.
    elastic: bool = False
    # Below min_workers: how long to wait for replacements before failing.
    rejoin_timeout_s: float = 60.0
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = 2
    # Early stop: at this test accuracy, or after this many evaluations without a new
    # best test loss.
    target_accuracy: float | None = None
    patience: int | None = None
    # Asynchronous schemes (async, downpour, easgd): SSP's bound, and dividing a delta by
    # its staleness + 1.
    staleness_bound: int | None = None
    staleness_scaling: bool | None = None
    # The driver's outer optimizer on the averaged delta, treated as a gradient (SlowMo,
    # DiLoCo): w <- w - outer_lr * (momentum or Nesterov update). outer_lr may be a schedule
    # of the round (a Keras schedule or f(round) -> rate).
    outer_lr: Any = None
    outer_momentum: float | None = None
    nesterov: bool | None = None
    # The linear scaling rule for K trainers: "outer" multiplies the outer rate by K,
    # "inner" the trainers' rate; either ramps up linearly from 1x over warmup_rounds.
    lr_scaling: str | None = None
    warmup_rounds: int | None = None
    # The trainers' learning rate per round: a Keras schedule or f(step) -> rate, step
    # being the optimizer steps a trainer has taken in the run so far.
    lr_schedule: Any = None
    # EASGD: the elastic coefficient and the communication period in local steps.
    alpha: float | None = None
    tau: int | None = None
    # Downpour: fetch the weights every n_fetch local steps, push every n_push.
    n_fetch: int | None = None
    n_push: int | None = None
    # What crosses the wire: a codec spec, or a pair (down, up); see apps/codecs.
    compression: Any = None
    # Scheme-level settings of sync (None: its default, 0 and False): close a round once all
    # but this many trainers' deltas are in (the late ones are folded into a later round,
    # scaled by staleness) ...
    backup_workers: int | None = None
    # ... and size each round's partitions by each trainer's measured samples/s.
    balance: bool | None = None
    seed: int | None = 0
    progress: bool = True
    trainer_cls: Any = None
    trainer_options: dict = dataclasses.field(default_factory=dict)
    # The trainers are placed as one placement group (one bundle each) so that a run
    # never starts half-placed; it fails if the group is not reserved within the timeout.
    placement_strategy: str = "SPREAD"
    placement_timeout_s: float = 60.0
    callbacks: list = dataclasses.field(default_factory=list)
    # Where the trainers run: "ddlf" or "ray" (apps/backends); None: what ddlf.init chose.
    backend: str | None = None

    def __post_init__(self):
        if isinstance(self.workers, (tuple, list)):
            self._take_range(self.workers)
        _int_at_least("workers", self.workers)
        for name in ("master_epochs", "worker_epochs", "batch_size", "keep_checkpoints"):
            _int_at_least(name, getattr(self, name))
        self._check_scheme_options()
        if self.min_workers is None:
            self.min_workers = 1
        _int_at_least("min_workers", self.min_workers)
        if self.min_workers > self.workers:
            raise ConfigError(f"min_workers={self.min_workers}", f"is more than workers="
                              f"{self.workers}; use workers=({self.min_workers}, N) with N >= "
                             f"{self.min_workers}")
        if not isinstance(self.num_cpus, (int, float)) or self.num_cpus < 0:
            raise ConfigError("num_cpus", f"must be a number >= 0, got {self.num_cpus!r}")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ConfigError("placement_strategy", "must be 'PACK', 'SPREAD', 'STRICT_PACK' "
                              f"or 'STRICT_SPREAD', got {self.placement_strategy!r}")
        _seconds("placement_timeout_s", self.placement_timeout_s)
        _seconds("rejoin_timeout_s", self.rejoin_timeout_s)
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ConfigError("target_accuracy",
                              f"must be in (0, 1], got {self.target_accuracy!r}")
        if self.patience is not None:
            _int_at_least("patience", self.patience)
        if self.staleness_bound is not None:
            _int_at_least("staleness_bound", self.staleness_bound, 0)
        if self.backup_workers is not None:
            _int_at_least("backup_workers", self.backup_workers, 0)
            if self.backup_workers >= self.workers:
                raise ConfigError("backup_workers", f"must be less than workers ({self.workers}): "
                                  f"a round needs at least one delta, got {self.backup_workers}")
        if self.balance is not None and not isinstance(self.balance, bool):
            raise ConfigError("balance", f"must be True or False, got {self.balance!r}")
        if self.checkpoint_dir is not None:
            self.checkpoint_dir = os.path.abspath(os.path.expanduser(os.fspath(self.checkpoint_dir)))
            if self.checkpoint_every is None:
                self.checkpoint_every = 1
        if self.checkpoint_every is not None:
            _int_at_least("checkpoint_every", self.checkpoint_every)
            if self.checkpoint_dir is None:
                raise ConfigError("checkpoint_every",
                                  "needs checkpoint_dir= (where to write them)")
        if self.seed is not None:
            _int_at_least("seed", self.seed, 0)
        if self.compression is not None:
            from .schemes.wire import resolve

            try:
                resolve(self.compression)
            except ValueError as e:   # CodecUnavailableError too: it keeps its type
                raise type(e)(f"compression={self.compression!r}: {e}") from None
        if self.backend not in (None, "ddlf", "ray"):
            raise ValueError(f"backend must be 'ddlf' or 'ray', got {self.backend!r}")

    def _check_scheme_options(self) -> None:
        """Values of the scheme-level settings that are given (None: the scheme's default)."""
        for name in ("rounds_per_epoch", "eval_every", "tau", "n_fetch", "n_push"):
            if getattr(self, name) is not None:
                _int_at_least(name, getattr(self, name))
        if self.warmup_rounds is not None:
            _int_at_least("warmup_rounds", self.warmup_rounds, 0)
        if self.outer_lr is not None:
            _rate("outer_lr", self.outer_lr)
        if self.outer_momentum is not None:
            _number("outer_momentum", self.outer_momentum, 0.0, 1.0, high_open=True)
        if self.alpha is not None:
            _number("alpha", self.alpha, 0.0, 1.0, low_open=True)
        for name in ("nesterov", "staleness_scaling"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise ValueError(f"{name} must be True or False, got {v!r}")
        if self.lr_scaling is not None and self.lr_scaling not in LR_SCALINGS:
            raise ValueError(f"lr_scaling must be one of {', '.join(map(repr, LR_SCALINGS))}, "
                             f"got {self.lr_scaling!r}")
        if self.lr_schedule is not None and not callable(self.lr_schedule):
            raise ValueError("lr_schedule must be a Keras LearningRateSchedule or a function "
                             f"of the step returning a rate, got {self.lr_schedule!r}")

    def _take_range(self, pair) -> None:
        if (len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in pair)
                or not 1 <= pair[0] <= pair[1]):
            raise ConfigError("workers=(lo, hi)",
                              f"needs two ints with 1 <= lo <= hi, got {pair!r}")
        lo, hi = pair
        if self.min_workers is not None and self.min_workers != lo:
            raise ConfigError(f"workers={tuple(pair)!r}", f"already sets min_workers={lo}; "
                              f"min_workers={self.min_workers} contradicts it")
        self.workers, self.min_workers, self.elastic = hi, lo, True

    @property
    def start_workers(self) -> int:
        """How many trainers must be placed before training starts."""
        return self.min_workers if self.elastic else self.workers

    @classmethod
    def from_options(cls, options: dict, *, caller: str) -> TrainConfig:
        """A config from ``train_sync``/``train_async`` keyword options.

        Raises ``TypeError`` naming an unknown option (with the closest known one), and
        ``ValueError`` for a bad value.
        """
        known = [f.name for f in dataclasses.fields(cls)]
        for name in options:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"{caller}() got an unknown option {name!r}{hint} Options are "
                                f"the fields of TrainConfig: {', '.join(known)}")
        kw = dict(options)
        kw["callbacks"] = list(kw.get("callbacks") or ())
        kw["trainer_options"] = dict(kw.get("trainer_options") or {})
        return cls(**kw)

    def to_json(self) -> dict:
        """The settings a checkpoint records: plain values only (classes by name)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "callbacks":
                v = [type(c).__name__ for c in v]
            elif f.name == "trainer_cls":
                v = None if v is None else f"{v.__module__}.{v.__qualname__}"
            elif f.name == "trainer_options":
                v = {k: repr(x) for k, x in v.items()}
            elif f.name == "compression" and v is not None:
                from .codecs import resolve_pair

                v = [c.spec for c in resolve_pair(v)]
            elif callable(v) and f.name in SCHEME_OPTIONS:
                v = describe_schedule(v)
            out[f.name] = v
        return out


def describe_schedule(schedule) -> str:
    """A schedule as a checkpoint records it: its class and, for a Keras one, its config."""
    name = getattr(schedule, "__qualname__", None) or type(schedule).__qualname__
    get_config = getattr(schedule, "get_config", None)
    if callable(get_config):
        try:
            return f"{name}({get_config()})"
        except Exception:   # a schedule whose config is not serialisable
            pass
    return name
