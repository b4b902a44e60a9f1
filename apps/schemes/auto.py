"""``scheme="auto"``, the default of ``train()`` and ``ddlf-train run``: DDLF picks the
scheme, the steps per round and the codec from K, the model's size and a probe of the
trainers' step time and links, then runs that scheme.

The rules (each measured; ``docs/training.md``, "The defaults, by K and by link"):

- **The ring, never the star.** With K ≥ 2 trainers the run is ``allreduce``: the
  trainers average among themselves, every trainer sends ``2(K−1)/K`` of the model a
  round whatever K is, and nothing goes through the driver's one link (the star, ``sync``,
  sends K copies down it every round). With one trainer it is ``allreduce`` too: a ring
  of one sends nothing, and the outer step is off (``rounds.py``'s K rule), so a lone
  trainer trains exactly as one process would.
- **A round's communication costs at most a tenth of its compute.** The probe gives the
  step time ``t``, the slowest ring link's bandwidth and latency, and what each codec costs
  to encode the model; a round of H steps with codec c takes ``ring(c) = 2(K−1)/K · M ·
  ratio(c) / bandwidth + 2(K−1) · latency + encode(c)`` on top of ``H·t``. ``auto`` takes
  the first rung of :data:`LADDER` (fewest steps per round, then the least lossy codec)
  with ``ring(c) ≤ 0.1 · H·t``, so a trainer computes at least ~90 % of the time; before
  going to 64 steps, whose rounds cost more epochs, it takes a 32-step round whose ring
  is up to 0.15 of its compute (:data:`LONG_ROUND_BUDGET`). When no
  rung fits (a link far too slow for the model), the last rung runs with ``overlap=True``,
  which hides a round's ring behind the next round's steps.
- **The batch: each trainer's, or split between them** (:func:`batch_rule`). K trainers
  that average every round learn per sample about as one process with K times the batch
  does. That costs nothing on a model whose gradient noise scale (``noise.py``) is well
  above K times the batch, and a great deal on one far below it, whose progress follows
  its steps (a small GPT: ``docs/language-models.md``). The probe measures the noise scale
  ``B`` and a step's time on the batch ``b`` and on ``b/K``; by McCandlish et al.'s model
  the samples to a target grow as ``1 + batch/B``, so the time to it goes as ``(1 +
  global batch/B) · (a step's seconds / its samples)``. ``auto`` splits the batch (each
  trainer steps on ``b/K``, K of them on ``b`` together, as one process would) when that
  is predicted to reach the target at least :data:`SPLIT_GAIN` sooner; else each trainer
  steps on ``b``. A model whose rate schedule counts steps and cannot count samples keeps
  its batch (a split would run it twice as fast through its schedule).
- **From K = 4 the trainers' rate is ×√K** (``lr_scaling="sqrt"``, the square-root rule
  for Adam-like optimizers): K trainers that average every round move about as far per
  sample as one process with K times the batch, for which Adam's rate scales with √K.
  Only where the trainers report a rate the run can set, and neither ``lr_scaling`` nor
  ``lr_schedule`` is given (:data:`SQRT_FROM_K`), and not with a split batch (K trainers
  then step on one process's batch together).
- **With a split batch the outer step is the rounds' plain average** (``outer_momentum=0``:
  rate 1, no Nesterov), unless an outer setting is given. The outer momentum makes up for
  K trainers moving about 1/K as far per sample as one process; with the batch split they
  already take one process's steps, and the momentum only adds a larger rate: a 6.1 M-
  parameter GPT on 2 trainers ended a quarter epoch at 2.786 nats with it and 2.699
  without, where one process reached 2.685 (``docs/language-models.md``).
- **An explicit option always wins.** A ``compression=``, ``rounds_per_epoch=`` or
  ``split_batch=`` given is kept, and what is left is chosen around it; with all three
  given there is no probe.
- **A setting only another scheme reads names that scheme.** ``backup_workers=1`` (or
  a ``(down, up)`` codec pair, which only the star sends) runs ``sync``, as asked, instead
  of refusing the setting: :func:`named_by`.
- **A probe that fails** (it did not finish within ``probe_timeout_s``, a link dropped)
  falls back to :data:`SAFE` and says so; it never hangs the run.

What was chosen and why is one line (:meth:`Choice.line`): ``ddlf-train run`` prints it, the
run's events hold it, and ``result.settings`` records it. A resumed run takes the choice
its checkpoint recorded instead of probing again, so it continues bit-equal.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..options import SchemeOptions, boolean, number_in, option
from . import probe
from .allreduce import AllreduceMachine, AllreduceOptions
from .machine import Machine
from .probe import Probe
from .rounds import STEPS_PER_ROUND

__all__ = ["AutoOptions", "AutoMachine", "Choice", "choose", "LADDER", "SAFE", "BUDGET",
           "LONG_ROUND_BUDGET", "SQRT_FROM_K", "SPLIT_GAIN", "batch_rule", "split_of",
           "CODEC_RATIO", "ring_seconds", "codec_ratio", "probe_codecs", "resolve",
           "named_by"]

# What a codec leaves of the bytes (its payload over float32's, to the first digit).
CODEC_RATIO: dict[str | None, float] = {None: 1.0, "fp16": 0.5, "int8:ef": 0.26,
                                        "int4:ef": 0.14}
# (steps per round, codec), in order of preference: the least lossy codec first, then
# more steps per round. A codec costs little (int4 with error feedback: 0.04 points after
# 3 epochs), where 32 steps a round instead of 16 took 25 % more epochs to the target at
# K = 4 (docs/training.md, "The defaults, by K and by link").
LADDER: tuple[tuple[int, str | None], ...] = (
    (16, None), (16, "fp16"), (16, "int8:ef"), (16, "int4:ef"), (32, "int8:ef"),
    (32, "int4:ef"), (64, "int4:ef"))
# The share of a round's compute its ring may take.
BUDGET = 0.10
# ... and a round of 32 steps, before auto goes to 64: with the trainers' rate rule, 32
# steps a round took about the epochs 16 did and 64 took 1.37x (K = 4 at 100 Mbit/s, 3
# seeds: 0.53, 0.52 and 0.71 epochs to the target), so a 32-step ring of 11-13 % of the
# compute (int4:ef there) is cheaper than 64 steps' epochs (0.63 against 0.55 efficiency).
LONG_ROUND_BUDGET = 0.15
# Without a probe: what is never far off on an ordinary LAN or a slow link.
SAFE = (STEPS_PER_ROUND, "int8:ef")
# The first K whose trainers' rate auto multiplies by sqrt(K). On validation (wide_cnn,
# Adam 1e-3 compiled, docs/training.md "The rules by K"): K = 4 reached 0.875 in 0.46
# epochs with twice the rate against 0.54, K = 8 in 0.83 against 0.92; K = 2 with 1.41x
# took 0.43 against 0.37, so K = 2 (and 3, not measured) keep the model's own rate.
SQRT_FROM_K = 4
# How much sooner a split batch must be predicted to reach the target before auto splits:
# the probe's noise scale comes from a few batches at the start (it grows as a model
# trains: gpt-tiny 1 at the start, 43 after 0.6 epochs; benchmarks/training/
# noise_scale.py), so a split must win by a margin that survives that, and a model near
# the line keeps the batch the CNN tables were measured with.
SPLIT_GAIN = 0.2


def _in_order(rungs: list) -> list:
    """``(steps, codec, budget)`` in the order auto tries them: the rungs of up to 32 steps
    within :data:`BUDGET`, then the 32-step ones again within :data:`LONG_ROUND_BUDGET`
    (instead of 64 steps, not instead of a shorter round or a lighter codec), then the
    longer rungs within :data:`BUDGET`."""
    short = [(h, c) for h, c in rungs if h <= 32]
    return ([(h, c, BUDGET) for h, c in short]
            + [(h, c, LONG_ROUND_BUDGET) for h, c in short if h == 32]
            + [(h, c, BUDGET) for h, c in rungs if h > 32])


@dataclasses.dataclass
class AutoOptions(AllreduceOptions):
    """``allreduce``'s settings, each kept when given, and the probe's."""

    scheme: ClassVar[str] = "auto"

    probe: bool | None = option(
        None, check=boolean,
        help="measure the trainers' step time and links at the start (default on); off: "
             "choose from K alone (16 steps a round, int8:ef between trainers)")
    split_batch: bool | None = option(
        None, check=boolean,
        help="split batch_size between the trainers (each steps on batch_size/K) instead "
             "of giving each all of it (default: by the probe's noise scale and step times)")
    probe_timeout_s: float | None = option(
        None, check=number_in(0.0, float("inf"), low_open=True, high_open=True),
        help="give the start-up probe at most this long, then fall back (default: 20 s, "
             "and 24 of the trainers' measured steps more once their steps are measured)")

    DEFAULTS: ClassVar[dict] = {**AllreduceOptions.DEFAULTS, "probe": True,
                                "probe_timeout_s": 20.0}


class AutoMachine(Machine):
    """Stands for ``auto`` in the registry: the driver replaces it, before the run starts,
    with the machine of the scheme :func:`choose` picked."""

    name = "auto"
    Options = AutoOptions
    wire_modes = AllreduceMachine.wire_modes

    def __init__(self, ctx):   # pragma: no cover - the driver never builds it
        raise RuntimeError("scheme='auto' is resolved by the driver before a machine is made "
                           "(a bug in DDLF, please report it)")


@dataclasses.dataclass
class Choice:
    """What ``auto`` runs: ``scheme``, the scheme's ``options`` to set (the given ones
    included), ``compression``, and ``reason``, the figures behind it."""

    scheme: str
    steps: int
    compression: Any
    overlap: bool
    reason: str
    probe: dict | None = None
    explicit: tuple = ()
    # "sqrt": the trainers' rate times sqrt(K) (SQRT_FROM_K); None: theirs as compiled.
    lr_scaling: str | None = None
    # Each trainer's batch when auto split the run's between them (None: the run's), and
    # the batch rule's figures.
    batch_size: int | None = None
    batch_reason: str = ""
    # "average": the round's average applied as it is (no outer momentum), chosen with a
    # split batch (the module's docstring); None: the outer step's defaults or the given.
    outer: str | None = None

    def line(self, k: int) -> str:
        codec = "no codec" if self.compression is None else f"{self.compression} per hop"
        what = (f"allreduce ring of {k}" if k > 1 else "one trainer, no traffic")
        extra = ", overlapped" if self.overlap else ""
        if self.lr_scaling == "sqrt":
            extra += f", the trainers' rate x{k ** 0.5:.3g} (sqrt K)"
        if self.batch_size is not None:
            extra += f", {self.batch_size} samples a step per trainer (the batch split {k} ways)"
        if self.outer == "average":
            extra += ", the rounds' average as it is (no outer momentum)"
        given = f" ({', '.join(self.explicit)} as given)" if self.explicit else ""
        why = self.reason + (f"; {self.batch_reason}" if self.batch_reason else "")
        return f"auto: {what}, {self.steps} local steps a round, {codec}{extra}{given}: {why}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Choice:
        data = dict(data)
        data["explicit"] = tuple(data.get("explicit") or ())
        return cls(**data)


def codec_ratio(codec: Any) -> float | None:
    """What ``codec`` leaves of float32's bytes; None for one this table does not know (a
    given codec, whose cost is then not predicted)."""
    if codec is None:
        return 1.0
    name = str(codec).split(":")[0]
    base = {"none": 1.0, "lz4": 1.0, "zstd": 1.0, "fp16": CODEC_RATIO["fp16"],
            "int8": CODEC_RATIO["int8:ef"], "int4": CODEC_RATIO["int4:ef"]}
    return base.get(name)


def ring_seconds(k: int, model_bytes: float, codec: str | None, bandwidth: float,
                 latency: float, encode_s: dict) -> float:
    """One ring collective's seconds for a model of ``model_bytes`` (float32) with ``codec``:
    the bytes every member sends, the ``2(K−1)`` hops' latency, and (lossy codecs) the
    encoding and decoding of the ``2(K−1)/K`` of the vector that passes through it."""
    share = 2 * (k - 1) / k
    ratio = codec_ratio(codec)
    wire = share * model_bytes * (1.0 if ratio is None else ratio) / bandwidth
    work = 0.0 if codec is None else share * float(encode_s.get(codec, 0.0))
    return wire + 2 * (k - 1) * latency + work


def choose(k: int, model_bytes: float, probe: Probe | None, *, compression: Any = None,
           steps: int | None = None, rate_settable: bool = False, batch_size: int = 32,
           split: bool | None = None, schedule: str = "none",
           outer_settable: bool = False) -> Choice:
    """The settings for K trainers of a model of ``model_bytes``, from ``probe`` (None or
    failed: :data:`SAFE`), keeping a given ``compression`` or ``steps`` (per round) or
    ``split`` (the batch); ``rate_settable``: the trainers report a rate and the run was
    given no rate setting, so from :data:`SQRT_FROM_K` their rate is scaled by sqrt(K)
    (unless the batch is split); ``batch_size``: the run's; ``schedule``: how the trainers'
    rate schedule counts (``TrainerActor.step_schedule``); ``outer_settable``: no outer
    step setting was given, so a split batch takes the rounds' plain average."""
    per_trainer, batch_why = batch_rule(k, batch_size, probe, split=split, schedule=schedule)
    if per_trainer != batch_size and probe is not None and probe.split_step_s is not None:
        # The ring's budget is a share of the rounds' compute on the batch they will run.
        probe = dataclasses.replace(probe, step_s=probe.split_step_s)
    choice = _rounds(k, model_bytes, probe, compression=compression, steps=steps)
    if split is not None:
        choice.explicit += ("split_batch",)
    if per_trainer != batch_size:
        choice.batch_size = per_trainer
    choice.batch_reason = batch_why
    if rate_settable and k >= SQRT_FROM_K and choice.batch_size is None:
        choice.lr_scaling = "sqrt"
    if outer_settable and choice.batch_size is not None:
        choice.outer = "average"
    return choice


def split_of(batch_size: int, k: int) -> int:
    """Each of ``k`` trainers' batch when they split ``batch_size`` (rounded up: never a
    smaller batch in all than the run's)."""
    return max(1, -(-int(batch_size) // int(k)))


def batch_rule(k: int, batch_size: int, probe: Probe | None, *, split: bool | None = None,
               schedule: str = "none") -> tuple[int, str]:
    """``(each trainer's batch, why)``: ``batch_size``, or :func:`split_of` it when
    ``split`` says so or, with ``split`` None, when the probe's noise scale and step times
    predict the split batch reaches a target at least :data:`SPLIT_GAIN` sooner (the
    module's docstring). ``why`` is "" where there was nothing to decide (one trainer)."""
    b = int(batch_size)
    small = split_of(b, k)
    if k == 1 or small == b:
        return b, ""
    if split is not None:
        return (small, "the batch split, as given") if split else (b, "")
    if schedule == "steps":
        return b, (f"each trainer steps on the batch of {b}: the trainers' rate schedule "
                   "counts steps, and a split batch would run through it sooner")
    if probe is None or probe.failed:
        return b, ""
    if probe.noise is None or probe.split_step_s is None or not probe.step_s:
        why = probe.noise_failed or "the probe did not measure it"
        return b, f"each trainer steps on the batch of {b} (no noise scale: {why})"
    noise_scale = probe.noise.get("b_simple")
    if noise_scale is None:   # |G|² not measurable over the noise: far below the scale
        return b, (f"each trainer steps on the batch of {b}: the gradients' noise swamps "
                   "their mean, so K times the batch is still below the noise scale")
    whole = (1 + k * b / noise_scale) * probe.step_s / b
    shared = (1 + k * small / noise_scale) * probe.split_step_s / small
    figures = (f"gradient noise scale {noise_scale:.0f} against {k} x {b}, a step of "
               f"{small} takes {probe.split_step_s / probe.step_s:.2f} of one of {b}: "
               f"{shared / whole:.2f} of the time to a target")
    if shared <= (1 - SPLIT_GAIN) * whole:
        return small, f"batch split ({figures})"
    return b, f"batch kept ({figures})"


def _rounds(k: int, model_bytes: float, probe: Probe | None, *, compression: Any,
            steps: int | None) -> Choice:
    """:func:`choose`'s scheme, steps per round, codec and overlap."""
    explicit = tuple(n for n, v in (("compression", compression), ("steps", steps))
                     if v is not None)
    if k == 1:
        return Choice("allreduce", steps or STEPS_PER_ROUND, compression, False,
                      "K = 1 sends nothing, and the outer step is off", None, explicit)
    if compression is not None and steps is not None:   # nothing left for the link to decide
        return Choice("allreduce", steps, compression, False,
                      "the codec and the steps per round as given",
                      None if probe is None else probe.to_json(), explicit)
    if probe is None or probe.failed or probe.step_s is None or not probe.bandwidth_Bps:
        why = ("the probe is off (probe=False)" if probe is None else
               f"the start-up probe failed: {probe.failed}; these need no measurement")
        return Choice("allreduce", steps or SAFE[0],
                      SAFE[1] if compression is None else compression, False, why,
                      None if probe is None else probe.to_json(), explicit)
    t = probe.step_s
    bw, lat = probe.bandwidth_Bps, probe.latency_s or 0.0
    rungs = [(h, c) for h, c in LADDER if (steps is None or h == steps)
             and (compression is None or c == compression)]
    if not rungs:   # a given setting the ladder does not hold: fill in the other one
        rungs = [(steps or h, compression if compression is not None else c)
                 for h, c in LADDER]
    figures = (f"K = {k}, a {model_bytes / 1e6:.1f} MB model, a step of {1000 * t:.1f} ms, "
               f"the slowest link {bw / 1e6:.0f} MB/s")
    for h, c, share_of in _in_order(rungs):
        ring = ring_seconds(k, model_bytes, c, bw, lat, probe.encode_s)
        if ring <= share_of * h * t:
            return Choice("allreduce", h, c, False,
                          f"{figures}: its ring takes {ring:.3f} s a round, "
                          f"{100 * ring / (h * t):.0f} % of the round's compute",
                          probe.to_json(), explicit)
    # Nothing within budget: the rung that computes the largest share of the time; its
    # ring overlaps the next round's steps when even that share is under a half.
    def share(rung):
        h, c = rung
        return h * t / (h * t + ring_seconds(k, model_bytes, c, bw, lat, probe.encode_s))

    h, c = max(rungs, key=share)
    ring = ring_seconds(k, model_bytes, c, bw, lat, probe.encode_s)
    overlap = share((h, c)) < 0.5
    return Choice("allreduce", h, c, overlap,
                  f"{figures}: no setting keeps its ring under {100 * BUDGET:.0f} % of a "
                  f"round's compute; the best takes {ring:.3f} s a round, "
                  f"{100 * ring / (h * t):.0f} % of it"
                  + (", so rounds overlap (the ring runs while the next round trains)"
                     if overlap else ""), probe.to_json(), explicit)


def resolve(given: SchemeOptions, config, options: SchemeOptions, backend, live: list,
            recorded: dict | None):
    """What an ``auto`` run becomes: ``(choice, machine class, its options resolved, the
    config with the chosen codec)``. ``given``: the options as the caller gave them (what
    is explicit); ``options``: resolved; ``live``: the started trainers' slots;
    ``recorded``: the choice a checkpoint holds (a resumed run takes it, no probe)."""
    from . import registry

    assert isinstance(given, AutoOptions) and isinstance(options, AutoOptions)
    info = live[0].about
    k = config.workers
    steps = given.steps_per_round
    if given.rounds_per_epoch is not None:   # rounds given: their steps, for the line
        steps = max(1, round(info["num_train"] / k / config.batch_size
                             / given.rounds_per_epoch))
    if recorded:
        choice = Choice.from_json(recorded)
    else:
        found = None
        schedule = info.get("step_schedule", "none")
        # The batch rule measures only where it may split: not a given split_batch, not a
        # schedule that counts steps, not a batch of one.
        weigh_batch = (given.split_batch is None and schedule != "steps"
                       and split_of(config.batch_size, k) != config.batch_size)
        explicit = (config.compression is not None and steps is not None
                    and not weigh_batch)
        if k > 1 and options.probe and not explicit:
            found = probe.measure(backend, [s.handle for s in live], config.batch_size,
                                  probe_codecs(config.compression),
                                  timeout_s=float(options.probe_timeout_s or 20.0),
                                  # a timeout given is kept to; the default one also
                                  # allows a model whose steps are slow their time
                                  steps_allowed=0.0 if given.probe_timeout_s is not None
                                  else probe.STEPS_ALLOWED,
                                  # the links only matter to a ladder still to choose
                                  link=config.compression is None or steps is None,
                                  split_batch=split_of(config.batch_size, k)
                                  if weigh_batch else None)
        settable = (info.get("learning_rate") is not None and given.lr_scaling is None
                    and given.lr_schedule is None)
        choice = choose(k, float(info["weights_bytes"]), found,
                        compression=config.compression, steps=steps, rate_settable=settable,
                        batch_size=config.batch_size, split=given.split_batch,
                        schedule=schedule,
                        outer_settable=(given.outer_lr is None and given.outer_momentum is None
                                        and given.nesterov is None))
    machine_cls = registry.get(choice.scheme)
    target = machine_cls.Options
    fields = {n: getattr(given, n) for n in target.names() if hasattr(given, n)}
    if fields.get("rounds_per_epoch") is None and fields.get("steps_per_round") is None:
        fields["steps_per_round"] = choice.steps
    if choice.overlap and fields.get("overlap") is None:
        fields["overlap"] = True
    if choice.lr_scaling and fields.get("lr_scaling") is None:
        fields["lr_scaling"] = choice.lr_scaling
    if choice.outer == "average" and fields.get("outer_momentum") is None:
        fields["outer_momentum"] = 0.0   # which also makes the outer rate 1, Nesterov off
    if config.compression is None and choice.compression is not None:
        config = dataclasses.replace(config, compression=choice.compression)
    if choice.batch_size is not None:   # the rounds, the plan and every train call take it
        config = dataclasses.replace(config, batch_size=choice.batch_size)
    return choice, machine_cls, target(**fields).resolve(config), config


def probe_codecs(compression: Any) -> list:
    """The codecs whose cost the probe measures: the ladder's, or the one given."""
    if compression is not None:
        return [] if codec_ratio(compression) == 1.0 else [str(compression)]
    return [c for c in dict.fromkeys(c for _, c in LADDER) if c is not None]


def named_by(options: dict) -> str | None:
    """The scheme an ``auto`` run's ``options`` name, or None when ``auto`` reads them all:
    the first registered scheme that reads every setting ``auto`` does not (so
    ``backup_workers=`` names ``sync``), and ``sync`` for a ``(down, up)`` codec pair, which
    only the star sends. None too when no scheme reads them all: the usual refusal follows,
    naming who reads what."""
    from ..config import TrainConfig
    from . import registry

    compression = options.get("compression")
    pair = isinstance(compression, (tuple, list)) and len(compression) == 2
    others = [n for n in options
              if n not in TrainConfig.names() and n not in AutoOptions.names()]
    if not others:
        return "sync" if pair else None
    for name in registry.names():
        if name != "auto" and all(n in registry.get(name).Options.names() for n in others):
            if pair and name != "sync":
                continue
            return name
    return None
