"""What every training run shares, whatever its scheme: ``TrainConfig``.

``train(model_fn, dataset, scheme=..., **options)`` takes these fields and the scheme's
own settings (``SyncOptions``, ``AsyncOptions`` ..., each in its scheme's module) as
keyword options; ``api.py`` splits them. Every field is an :func:`~.options.option`: its
check raises :class:`ConfigError` naming it, and ``ddlf-train``'s flags for the scheme
settings and for these fields (those whose ``cli`` is not None) are generated from the
same fields, defaults included.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .options import (
    ConfigError,
    check_fields,
    describe_schedule,
    int_at_least,
    one_of,
    option,
    seconds,
)

__all__ = ["TrainConfig", "ConfigError", "LR_SCALINGS", "PLACEMENT_STRATEGIES", "BACKENDS",
           "KERAS_BACKENDS", "FRAMEWORK_OPTIONS", "framework_settings"]

# Where a rule for K trainers applies: nowhere, to the trainers' learning rate (the linear
# rule of Goyal et al. 2017, times K), to the driver's outer learning rate (times K), or to
# the trainers' rate times sqrt(K) (the square-root rule for adaptive optimizers such as
# Adam, Malladi et al. 2022; what auto uses from K = 4, docs/training.md).
LR_SCALINGS = ("none", "inner", "outer", "sqrt")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
BACKENDS = ("ddlf", "ray")
KERAS_BACKENDS = ("tensorflow", "jax", "torch")
# The settings a run hands to its trainers' framework adapter (and, for keras_backend,
# to the trainer itself before Keras is imported); each applies to one kind of model.
FRAMEWORK_OPTIONS = ("optimizer", "loss", "keras_backend")


def framework_settings(obj: Any) -> dict:
    """The framework settings set on ``obj`` (a :class:`TrainConfig`, or an ``App``, which
    takes them once for its kept trainers), as keywords: the one place that lists them."""
    return {k: getattr(obj, k) for k in FRAMEWORK_OPTIONS if getattr(obj, k) is not None}


def _cpus(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise ConfigError(name, f"must be a number >= 0, got {v!r}")


def _compression(name: str, v: Any) -> None:
    from .codecs import CodecUnavailableError
    from .schemes.wire import resolve

    try:
        resolve(v)
    except CodecUnavailableError as e:   # keeps its type: it names the pip command
        raise CodecUnavailableError(f"{name}={v!r}: {e}") from None
    except ValueError as e:
        raise ConfigError(f"{name}={v!r}:", str(e)) from None


def _positive(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise ConfigError(name, f"must be a number > 0, got {v!r}")


def _fraction(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ConfigError(name, f"must be in (0, 1], got {v!r}")


def _factory(name: str, v: Any) -> None:
    if type(v).__module__.startswith("torch.optim"):
        raise ConfigError(name, "takes a callable that builds the optimizer from the "
                          "parameters (each trainer builds its own, for its own model), not "
                          "an optimizer: optimizer=lambda params: torch.optim.SGD(params, "
                          "lr=0.03, momentum=0.9)")
    if not callable(v):
        what = ("a callable taking the parameters and returning a torch.optim.Optimizer, "
                "e.g. optimizer=lambda params: torch.optim.SGD(params, lr=0.03, momentum=0.9)"
                if name == "optimizer" else
                "a callable (output, target) -> scalar tensor, e.g. "
                "torch.nn.functional.cross_entropy")
        raise ConfigError(name, f"must be {what}; got {v!r}")


def _backend(name: str, v: Any) -> None:
    from .backends import Backend

    if not isinstance(v, Backend):
        one_of(*BACKENDS)(name, v)


@dataclasses.dataclass
class TrainConfig:
    """What a run needs besides the model, the dataset and the scheme's own settings.

    ``workers`` trainers take ``num_cpus`` CPUs each. A master epoch is one pass of the
    training set split over the trainers; ``worker_epochs`` is how many local epochs a
    trainer runs on its share before reporting a delta (the paper's N).

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

    workers: Any = option(2, help="trainers: K, or (lo, hi) for an elastic run", cli=None)
    master_epochs: int = option(1, help="passes over the training set", check=int_at_least(1))
    worker_epochs: int = option(1, help="local epochs per piece of work (the paper's N)",
                                check=int_at_least(1))
    batch_size: int = option(32, help="per trainer (scheme auto may split it between the "
                             "trainers: split_batch)", check=int_at_least(1))
    num_cpus: float = option(1, help="CPUs (the framework's threads) per trainer", check=_cpus,
                             cli="float")
    # The fewest trainers a run goes on with; default 1, or the low end of workers=(lo, hi).
    min_workers: int | None = option(None, help="fewest trainers to go on with after losses "
                                     "(default 1)", cli="int")
    # Set by workers=(lo, hi): start with lo placed, grow toward hi.
    elastic: bool = option(False, help="set by workers=(lo, hi)", cli=None)
    # Below min_workers: how long to wait for replacements before failing.
    rejoin_timeout_s: float = option(60.0, help="seconds to wait for replacements below "
                                     "min_workers, then fail", check=seconds)
    checkpoint_dir: str | None = option(None, help="where checkpoints go", cli=None)
    checkpoint_every: int | None = option(None, help="rounds between checkpoints", cli="int")
    keep_checkpoints: int = option(2, help="newest checkpoints kept", check=int_at_least(1))
    # Early stop: at this test accuracy (or test loss, below), or after this many
    # evaluations without a new best test loss.
    target_accuracy: float | None = option(None, help="stop at the first evaluation with "
                                           "this test accuracy", check=_fraction, cli="float")
    patience: int | None = option(None, help="stop after this many evaluations without a "
                                  "better test loss", check=int_at_least(1))
    # Early stop at this test loss or lower (a language model's validation loss).
    target_loss: float | None = option(None, help="stop at the first evaluation with this "
                                       "test loss or lower (a text run's validation loss)",
                                       check=_positive, cli="float")
    # What crosses the wire: a codec spec, or a pair (down, up); see apps/codecs.
    compression: Any = option(None, help="codec spec, or (down, up)", check=_compression,
                              cli=None)
    seed: int | None = option(0, help="data order and the trainers' seeds",
                              check=int_at_least(0))
    progress: bool = option(True, help="a progress bar on stderr", cli=None)
    trainer_cls: Any = option(None, help="a TrainerActor subclass", cli=None)
    trainer_options: dict = dataclasses.field(default_factory=dict)
    # The trainers are placed as one placement group (one bundle each) so that a run
    # never starts half-placed; it fails if the group is not reserved within the timeout.
    placement_strategy: str = option("SPREAD", help="how the trainers' bundles are placed",
                                     check=one_of(*PLACEMENT_STRATEGIES),
                                     choices=PLACEMENT_STRATEGIES)
    placement_timeout_s: float = option(60.0, help="seconds to reserve the trainers' CPUs",
                                        check=seconds)
    # A trainer that neither reports ready nor dies (a model_fn that deadlocks, a process
    # stuck before it could run) must not hang the run: past this it is killed and started
    # again in its slot, a start fault like a process that died (START_TRIES in a row).
    start_timeout_s: float = option(300.0, help="seconds a trainer may take to start (build "
                                    "its model, load its data) before it is killed and "
                                    "started again", check=seconds)
    callbacks: list = dataclasses.field(default_factory=list)
    # PyTorch models only (a Keras model compiles its own and refuses these by name): how
    # each trainer builds its optimizer from its module's parameters, and the loss.
    optimizer: Any = option(None, help="PyTorch: a callable params -> torch.optim.Optimizer "
                            "(default Adam, lr 1e-3, as paper_cnn compiles)", check=_factory, cli=None)
    loss: Any = option(None, help="PyTorch: a callable (output, target) -> scalar tensor "
                       "(default cross-entropy on the module's logits)", check=_factory, cli=None)
    # Keras models only: the backend Keras 3 runs on in the trainers (KERAS_BACKEND,
    # set before Keras is first imported there); None: Keras' own choice.
    keras_backend: str | None = option(
        None, help="with a Keras model: the backend Keras 3 runs on in the trainers (default: "
        "Keras' own choice, tensorflow); jax needs pip install 'ddlf-actors[jax]'",
        check=one_of(*KERAS_BACKENDS), choices=KERAS_BACKENDS)
    # Where the trainers run: "ddlf" or "ray" (apps/backends); None: what ddlf.init chose;
    # or a Backend instance (the tests' in-process FakeBackend).
    backend: Any = option(None, help="ddlf or ray", check=_backend, cli=None)

    def __post_init__(self):
        if isinstance(self.workers, (tuple, list)):
            self._take_range(self.workers)
        int_at_least(1)("workers", self.workers)
        check_fields(self)
        if self.min_workers is None:
            self.min_workers = 1
        int_at_least(1)("min_workers", self.min_workers)
        if self.min_workers > self.workers:
            raise ConfigError(f"min_workers={self.min_workers}", f"is more than workers="
                              f"{self.workers}; use workers=({self.min_workers}, N) with N >= "
                              f"{self.min_workers}")
        if self.checkpoint_dir is not None:
            self.checkpoint_dir = os.path.abspath(os.path.expanduser(os.fspath(self.checkpoint_dir)))
            if self.checkpoint_every is None:
                self.checkpoint_every = 1
        if self.checkpoint_every is not None:
            int_at_least(1)("checkpoint_every", self.checkpoint_every)
            if self.checkpoint_dir is None:
                raise ConfigError("checkpoint_every",
                                  "needs checkpoint_dir= (where to write them)")

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
    def min_trainers(self) -> int:
        """``min_workers`` as a number (``__post_init__`` fills it in: 1 unless given)."""
        return self.min_workers if self.min_workers is not None else 1

    @property
    def start_workers(self) -> int:
        """How many trainers must be placed before training starts."""
        return self.min_trainers if self.elastic else self.workers

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def framework_options(self) -> dict:
        """What each trainer is given as ``framework_options``: the framework settings
        that are set (``optimizer``, ``loss``, ``keras_backend``) and the trainers'
        ``num_gpus`` where ``trainer_options`` asks for GPUs. Empty when none is."""
        out = framework_settings(self)
        gpus = self.trainer_options.get("num_gpus")
        if gpus:
            out["num_gpus"] = gpus
        return out

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
            elif f.name in ("optimizer", "loss") and v is not None:
                v = describe_schedule(v)   # by name: a lambda's repr changes every run
            elif f.name == "backend" and v is not None and not isinstance(v, str):
                v = type(v).__name__
            elif f.name == "compression" and v is not None:
                from .codecs import resolve_pair

                v = [c.spec for c in resolve_pair(v)]
            out[f.name] = v
        return out
