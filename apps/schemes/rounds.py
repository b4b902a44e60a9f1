"""What schemes that average in rounds share (``sync`` and ``allreduce``): their settings,
the outer optimizer and the trainers' rate per round, and how a round ends.

A round's end is the same in both: the trainers' rate and the outer rate go into its row;
the row is evaluated during the next round every ``eval_every`` rounds (and the last),
or handed over at once; the last row's weights get one evaluation after the last round.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..config import LR_SCALINGS
from ..options import (
    ConfigError,
    SchemeOptions,
    boolean,
    filled,
    int_at_least,
    number_in,
    one_of,
    option,
    rate,
    schedule,
)
from ..records import HistoryRow
from .orders import EmitRow, Order
from .outer import OuterOptimizer
from .rates import INNER_POWERS, InnerRate, steps_in
from .streaming import FragmentOuter

__all__ = ["RoundOptions", "Rounds", "default_rounds", "STEPS_PER_ROUND", "outer_for_k"]

# Local steps per trainer per round that rounds_per_epoch aims at when left out.
STEPS_PER_ROUND = 16


def default_rounds(per_trainer: float, batch_size: int, steps: int = STEPS_PER_ROUND) -> int:
    """Rounds per epoch that give a trainer with ``per_trainer`` samples an epoch about
    ``steps`` local steps per round (at least one round)."""
    return max(1, round(per_trainer / (batch_size * steps)))


def outer_for_k(k: int) -> dict:
    """The outer step's defaults that depend on the run's ``k`` trainers (``docs/
    training.md``, "The defaults, by K and by link"): with one trainer there is nothing to
    average, so no outer step (the lone trainer's own trajectory, not a momentum on it,
    which made accuracy jump between rounds); with K >= 2, ``RoundOptions.DEFAULTS``'."""
    if k <= 1:
        return {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
    return {}


@dataclasses.dataclass
class RoundOptions(SchemeOptions):
    """Averaging in rounds, with an outer optimizer (sync, allreduce)."""

    rounds_per_epoch: int | None = option(
        None, check=int_at_least(1),
        help="average this many times per epoch (default: about steps_per_round local "
             "steps per round)")
    steps_per_round: int | None = option(
        None, check=int_at_least(1),
        help="local steps per trainer per round, which sizes rounds_per_epoch when that is "
             "left out (default 16)")
    eval_every: int | None = option(
        None, check=int_at_least(1),
        help="evaluate every N rounds and the last (default: once per epoch)")
    evals_per_epoch: int | None = option(
        None, check=int_at_least(1),
        help="evaluate at least N times per epoch (every round when an epoch has fewer), "
             "however many rounds the epoch turns out to have (scheme='auto' chooses them "
             "after its start-up probe); instead of eval_every")
    outer_lr: Any = option(
        None, check=rate,
        help="the outer step's rate on the averaged delta (default 0.7; times K with "
             "lr_scaling='outer'); a number or a schedule of the round")
    outer_momentum: float | None = option(
        None, check=number_in(0.0, 1.0, high_open=True),
        help="momentum of the outer step (default 0.8; none with one trainer)")
    nesterov: bool | None = option(None, check=boolean, help="Nesterov outer momentum "
                                   "(default on)")
    lr_scaling: str | None = option(
        None, check=one_of(*LR_SCALINGS), choices=LR_SCALINGS,
        help="a rule for K trainers: the outer rate times K ('outer'), the trainers' rate "
             "times K ('inner') or times sqrt(K) ('sqrt', for Adam-like optimizers), or "
             "none (default)")
    warmup_rounds: int | None = option(
        None, check=int_at_least(0),
        help="ramp the K scaling up linearly over this many rounds (default: half an "
             "epoch's rounds with lr_scaling 'outer' or 'inner', none with 'sqrt' or "
             "without)")
    lr_schedule: Any = option(
        None, check=schedule, cli=None,
        help="the trainers' rate per round: a Keras schedule or f(step) -> rate")
    overlap: bool | None = option(
        None, check=boolean,
        help="trainers start each round from their own weights as soon as they have sent "
             "their delta; a round's outer step reaches them one round later, as a "
             "correction (default off)")
    fragments: int | None = option(
        None, check=int_at_least(1),
        help="sync 1/F of the parameters per round, in turn: F times the rounds, each "
             "carrying 1/F of the model (default 1)")

    # Chosen on a validation split (benchmarks/training/explore_defaults.py; docs/training.md, "the
    # defaults"): rounds of about STEPS_PER_ROUND local steps (rounds_per_epoch, from the
    # data's size) and DiLoCo's outer step, Nesterov at rate 0.7 with no K rule (so no
    # warm-up), one evaluation per epoch (eval_every). With paper_cnn's Adam they reached
    # 0.85 validation accuracy in the fewest epochs tried; the outer momentum also speeds
    # up a user's Adam at 1e-3 and plain SGD (and slows SGD with momentum: see the docs).
    # Its 0.8 (DiLoCo's 0.9 before) was chosen with wide_cnn at K = 2, 4 and 8 (issue 30):
    # fewer epochs to the target at every K. One trainer takes no outer step
    # (outer_for_k). The rounds are filled in once the data's size is known. Rounds are
    # not streamed (overlap, fragments: streaming.py) unless asked.
    DEFAULTS: ClassVar[dict] = {"outer_lr": 0.7, "outer_momentum": 0.8, "nesterov": True,
                                "lr_scaling": "none", "overlap": False, "fragments": 1}

    def defaults(self, config) -> dict:
        """The defaults, adjusted to what the run set itself: with ``outer_momentum=0``
        Nesterov is off and the outer rate is 1 (a plain average, unless ``outer_lr`` says
        otherwise); with ``lr_scaling='inner'`` the outer rate is 1 (the K rule acts on the
        trainers); with ``lr_scaling='none'`` there is nothing to warm up."""
        out = dict(self.DEFAULTS)
        out.update(outer_for_k(config.workers))
        if self.outer_momentum == 0:
            out["nesterov"] = False
            if self.outer_lr is None:
                out["outer_lr"] = 1.0
        if self.lr_scaling == "inner" and self.outer_lr is None:
            out["outer_lr"] = 1.0
        # The square-root rule's factor is small (2 at K = 4) and its gain is early: on
        # validation, K = 4 with twice Adam's rate from the first step reached the target in
        # 0.46 epochs, less than the half epoch a warm-up would take (docs/training.md).
        if self.lr_scaling in ("none", "sqrt"):
            out["warmup_rounds"] = 0
        return out

    def validate(self, config) -> None:
        if self.eval_every is not None and self.evals_per_epoch is not None:
            raise ConfigError(f"evals_per_epoch={self.evals_per_epoch}",
                              f"and eval_every={self.eval_every} both set when to evaluate: "
                              "give one of them")
        if self.rounds_per_epoch is not None and self.steps_per_round is not None:
            raise ConfigError(f"steps_per_round={self.steps_per_round}",
                              f"and rounds_per_epoch={self.rounds_per_epoch} both size the "
                              "rounds: give one of them")
        if self.warmup_rounds and self.lr_scaling == "none":
            raise ConfigError(f"warmup_rounds={self.warmup_rounds}",
                              "ramps up a scaling rule for K: set lr_scaling='outer', "
                              "'inner' or 'sqrt' too, or leave it out")
        if self.nesterov and not self.outer_momentum:
            raise ConfigError("nesterov=True", "needs outer_momentum > 0")

    def for_data(self, config, infos: list) -> RoundOptions:
        """The settings that depend on the data's size, where left out:
        ``rounds_per_epoch`` (:func:`default_rounds`), ``eval_every`` (once per epoch, or
        from ``evals_per_epoch``) and
        ``warmup_rounds`` (half an epoch's rounds when a K rule is on)."""
        if infos[0].get("partitioned"):
            per_trainer = max(info["num_train"] for info in infos)
        else:
            per_trainer = infos[0]["num_train"] / config.workers
        fill: dict[str, Any] = {}
        rounds = self.rounds_per_epoch
        if rounds is None:
            rounds = fill["rounds_per_epoch"] = default_rounds(
                per_trainer, config.batch_size, self.steps_per_round or STEPS_PER_ROUND)
        # With fragments a round syncs 1/F of the model: F times the rounds, each a 1/F of
        # the steps (eval_every and warmup_rounds count these rounds).
        rounds *= self.fragments or 1
        if per_trainer < rounds and (self.fragments or 1) > 1:
            raise ConfigError(f"fragments={self.fragments}",
                              f"makes {rounds} rounds per epoch, more than the {per_trainer:g} "
                              "samples per trainer per epoch (a round of no samples): use "
                              "fewer fragments or rounds_per_epoch")
        if self.eval_every is None:
            # In rounds only now that they are known: auto picks its steps per round at
            # start-up, so a count of rounds given beforehand could be half as often.
            per = self.evals_per_epoch
            fill["eval_every"] = rounds if per is None else max(1, rounds // per)
        if self.warmup_rounds is None:
            fill["warmup_rounds"] = max(1, rounds // 2) if self.lr_scaling != "none" else 0
        return dataclasses.replace(self, **fill) if fill else self

    def plan_rounds(self) -> int:
        return (self.rounds_per_epoch or 1) * (self.fragments or 1)

    @property
    def streaming(self) -> bool:
        """Rounds are streamed (``fragments.py``): overlapped, or one fragment at a time."""
        return bool(self.overlap) or (self.fragments or 1) > 1


class Rounds:
    """The round-by-round arithmetic of a run: the outer optimizer, the trainers' rate
    (and their optimizer steps so far, a schedule's step), and the row waiting for its
    evaluation."""

    def __init__(self, options: RoundOptions, master_epochs: int, base_rate: float | None):
        self.options = options
        self.per_epoch = options.plan_rounds()
        self.total = master_epochs * self.per_epoch
        self.outer: Any
        momentum = filled(options.outer_momentum, "outer_momentum")
        nesterov = filled(options.nesterov, "nesterov")
        warmup = filled(options.warmup_rounds, "warmup_rounds")
        if options.streaming:   # one optimizer per fragment (streaming.py)
            self.outer = FragmentOuter(filled(options.fragments, "fragments"), options.outer_lr,
                                       momentum, nesterov, options.lr_scaling == "outer", warmup)
        else:
            self.outer = OuterOptimizer(options.outer_lr, momentum, nesterov,
                                        scale_with_k=options.lr_scaling == "outer",
                                        warmup_rounds=warmup)
        power = INNER_POWERS.get(options.lr_scaling or "none")
        self.inner = InnerRate(options.lr_schedule, scale_with_k=power is not None,
                               warmup_rounds=warmup, base=base_rate, power=power or 1.0)
        self.eval_every = filled(options.eval_every, "eval_every")
        self.inner_steps = 0      # a trainer's optimizer steps so far (lr_schedule's step)
        self.pending_row: HistoryRow | None = None   # evaluated during the next round

    def where(self, round_no: int) -> tuple[int, int]:
        """``(epoch, r)`` of the round after ``round_no`` rounds: 1-based epoch, 0-based r."""
        epoch, r = divmod(round_no, self.per_epoch)
        return epoch + 1, r

    def epoch_at(self, epoch: int, r: int) -> float:
        """The fractional epoch a row reports once round ``r`` of ``epoch`` is done."""
        return epoch - 1 + (r + 1) / self.per_epoch

    def inner_rate(self, round_no: int, k: int) -> dict:
        """``{"learning_rate": rate}`` for the trainers' next round, or ``{}``."""
        value = self.inner.at(round_no, self.inner_steps, k)
        return {} if value is None else {"learning_rate": value}

    def count_steps(self, largest_piece: int, batch_size: int, worker_epochs: int) -> None:
        self.inner_steps += steps_in(largest_piece, batch_size, worker_epochs)

    def end(self, row: HistoryRow, round_no: int, rate: dict) -> list[Order]:
        """Round ``round_no``'s row is made: its rates go in, and it is evaluated with the
        next round (every ``eval_every`` rounds and the last) or handed over now."""
        if rate:
            row["learning_rate"] = rate["learning_rate"]
        if not self.outer.plain:
            row["outer_lr"] = self.outer.last_rate
        if round_no % self.eval_every == 0 or round_no == self.total:
            self.pending_row = row
            return []
        return [EmitRow(row)]

    def take_pending(self) -> HistoryRow | None:
        row, self.pending_row = self.pending_row, None
        return row

    def position(self) -> dict:
        # A copy: the row gets its test accuracy while the checkpoint is being written.
        row = dict(self.pending_row) if self.pending_row is not None else None
        return {"pending_row": row, "outer_steps": self.outer.steps,
                "inner_steps": self.inner_steps}

    def arrays(self) -> dict:
        """The outer optimizer's state for a checkpoint (its velocity, per fragment when
        streamed)."""
        if isinstance(self.outer, FragmentOuter):
            return self.outer.arrays()
        state = self.outer.state()
        return {"outer": state} if state else {}

    def restore(self, position: dict, arrays: dict, round_no: int) -> None:
        self.pending_row = position.get("pending_row")
        if isinstance(self.outer, FragmentOuter):
            self.outer.load(arrays, position.get("outer_steps"))
        else:
            self.outer.load_state(arrays.get("outer", []), position.get("outer_steps", round_no))
        self.inner_steps = int(position.get("inner_steps", 0))
