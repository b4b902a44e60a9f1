"""A training scheme as a state machine: state plus transitions, events in, orders out.

Dask's worker state machine is the model (``distributed/worker_state_machine.py``): a
:class:`Machine` holds the state of one run of one scheme (the weights, the round or the
work queue, the calls in flight) and :meth:`Machine.handle` takes one event
(``events.py``), changes that state and returns orders (``orders.py``). It never calls a
trainer, waits or reads the clock itself: the driver loop (``driver.py``) executes the
orders over a :class:`~..backends.Backend` and feeds back what happens. So every scheme
runs the same way on DDLF's actors, on Ray's, and in-process on the fake backend the unit
tests use (``backends/fake.py``), and a test can drive a machine event by event.

A scheme is one module with an options dataclass and a ``Machine`` subclass that sets
``name``, ``Options`` and ``wire_modes`` and implements :meth:`begin`, :meth:`on_done`,
:meth:`on_lost`, :meth:`on_row_done` and :meth:`total_rows` (and may implement
:meth:`on_joined` and :meth:`on_tick`, which do nothing by default) and, to resume,
:meth:`position`/:meth:`restore`; plus one ``register`` line in ``schemes/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar

from ..checkpoint import Checkpoint as CheckpointData
from ..config import TrainConfig
from ..options import SchemeOptions
from ..records import HistoryRow, TrainStats
from .events import CallDone, Event, RowDone, Tick, TrainerLost, TrainersJoined
from .orders import CONTROL, Call, Checkpoint, NeedTrainers, Order
from .plan import Plan
from .slots import Slot
from .wire import PLAIN, CallSpec, Wire

__all__ = ["Machine", "RunContext"]


@dataclasses.dataclass
class RunContext:
    """What a machine knows of its run, set up by the driver before :meth:`Machine.begin`."""

    config: TrainConfig
    options: Any                 # the scheme's options dataclass, defaults filled in
    plan: Plan
    wire: Wire
    num_test: int                # test rows (0: nothing to evaluate)
    trainer_info: dict           # the first trainer's describe(): sizes, learning rate
    t0: float                    # the clock's origin for history rows' time_s
    checkpointing: bool = False  # a checkpoint writer is open


class Machine:
    """One run of a scheme. See the module docstring for the protocol."""

    #: The name ``train(..., scheme=NAME)`` and ``ddlf-train run --scheme`` use.
    name: ClassVar[str] = ""
    #: The scheme's settings (a dataclass of ``options.option`` fields).
    Options: ClassVar[type[SchemeOptions]] = SchemeOptions
    #: How the scheme can send weights with ``compression=`` (``wire.py``): a scheme that
    #: does not encode its traffic refuses compression= rather than ignore it.
    wire_modes: ClassVar[tuple[str, ...]] = (PLAIN,)

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.config = ctx.config
        self.options = ctx.options
        self.plan = ctx.plan
        self.wire = ctx.wire
        self.num_test = ctx.num_test
        self.now = ctx.t0
        self.round_no = 0            # rounds (sync) or updates (async) applied
        self.live: dict[int, Slot] = {}
        self.optimizer_states: dict[int, list] = {}   # slot -> the latest state it reported
        self.bytes_sent = 0
        self.bytes_received = 0
        self.updates: list = []      # what result.updates reports
        self._ids = itertools.count(1)

    # -- the protocol --------------------------------------------------------------------------
    def start(self, weights: list, live: list[Slot], now: float | None = None) -> list[Order]:
        """The run begins from ``weights`` with the ``live`` trainers, at ``now`` (the
        driver's clock; the first round's time starts here, not at the trainers' start)."""
        if now is not None:
            self.now = now
        return self.admit(live) + self.begin(weights)

    def handle(self, event: Event) -> list[Order]:
        """Take one event; return the orders it leads to."""
        self.now = event.now
        if isinstance(event, CallDone):
            return self.on_done(event)
        if isinstance(event, TrainerLost):
            self.live.pop(event.slot.index, None)
            self.wire.lose(event.slot.index)   # its error-feedback residual went with it
            return self.on_lost(event)
        if isinstance(event, TrainersJoined):
            return self.admit(event.slots) + self.on_joined(event)
        if isinstance(event, Tick):
            return self.on_tick(event)
        if isinstance(event, RowDone):
            return self.on_row_done(event)
        raise TypeError(f"not an event: {event!r}")

    # -- what a scheme implements --------------------------------------------------------------
    def begin(self, weights: list) -> list[Order]:
        raise NotImplementedError

    def on_done(self, event: CallDone) -> list[Order]:
        raise NotImplementedError

    def on_lost(self, event: TrainerLost) -> list[Order]:
        """``event.slot``'s trainer is gone (already out of :attr:`live`)."""
        raise NotImplementedError

    def on_joined(self, event: TrainersJoined) -> list[Order]:
        """Trainers joined (already admitted: in :attr:`live`, with their state)."""
        return []

    def on_tick(self, event: Tick) -> list[Order]:
        return []

    def on_row_done(self, event: RowDone) -> list[Order]:
        """The callbacks took a row; with ``event.stop`` one of them stopped the run, and
        the machine ends it with a ``Stop`` order (once, or as soon as it can)."""
        raise NotImplementedError

    def total_rows(self) -> int:
        raise NotImplementedError

    def position(self) -> dict:
        """Where the scheme is, as JSON, for a checkpoint (besides ``round_no``)."""
        return {}

    def restore(self, ckpt: CheckpointData) -> None:
        """Continue from ``ckpt`` (the inverse of :meth:`position`); ``round_no`` and the
        optimizer states are restored already."""

    def event_round(self) -> int:
        """The round an event belongs to: the one in progress."""
        return self.round_no + 1

    # -- helpers for every scheme -------------------------------------------------------------
    def call(self, slot: Slot, spec: CallSpec, kind: str = CONTROL, wait: bool = True) -> Call:
        """A :class:`Call` order for ``spec = (method, args, kwargs)``, with a new id."""
        method, args, kwargs = spec
        return Call(next(self._ids), slot, method, tuple(args), dict(kwargs), kind, wait)

    def members(self) -> list[Slot]:
        """The live trainers, by slot index."""
        return [self.live[j] for j in sorted(self.live)]

    def too_few(self) -> list[Order]:
        """``[NeedTrainers]`` when fewer than ``min_workers`` are live, else ``[]``."""
        if len(self.live) < self.config.min_trainers:
            return [NeedTrainers(self.config.min_trainers)]
        return []

    def admit(self, slots) -> list[Order]:
        """Trainers join the run: each gets the optimizer state its slot last reported
        (a replacement continues its predecessor's), and after a resume its saved
        error-feedback residual."""
        orders: list[Order] = []
        for slot in slots:
            self.live[slot.index] = slot
            state = self.optimizer_states.get(slot.index)
            if state is not None:
                orders.append(self.call(slot, ("set_optimizer_state", (state,), {}),
                                        wait=False))
            sizes = self.plan.part_sizes   # a partitioned dataset's
            if sizes is not None and slot.info is not None:
                sizes[slot.index] = slot.info["num_train"]
            spec = self.wire.admit(slot)
            if spec is not None:
                orders.append(self.call(slot, spec, wait=False))
        return orders

    def keep_state(self, slot_index: int, stats: TrainStats) -> None:
        """Take a call's optimizer state and error-feedback residual out of its stats."""
        state = stats.pop("optimizer_state", None)
        if state is not None:
            self.optimizer_states[slot_index] = state
        self.bytes_received += self.wire.keep(slot_index, stats)

    def checkpoint(self, weights: list, arrays: dict | None = None) -> Checkpoint:
        """A checkpoint of the run as it is now (round ``round_no``), with the machine's
        :meth:`position`, the wire's state and the optimizer states taken at once."""
        return Checkpoint(self.round_no, weights, {**(arrays or {}), **self.wire.arrays()},
                          self.position(), self.wire.position(), dict(self.optimizer_states))

    def checkpoint_due(self, round_no: int) -> bool:
        every = self.config.checkpoint_every
        return self.ctx.checkpointing and every is not None and round_no % every == 0

    def new_row(self, round_no: int, epoch: float, stats: list[TrainStats],
                wall_s: float, work: dict | None = None) -> HistoryRow:
        """A history row from the trainers' stats of one round (or one async epoch).

        ``work``: ``{trainer: (compute_s, eval_s)}`` inside the row's window, from a
        :class:`~.ledger.WorkLedger`, where calls can straddle rows; without it each
        call's stats count whole (a sync round holds all of its calls).
        """
        samples = sum(s["samples"] for s in stats)
        loss = (sum(s["loss"] * s["samples"] for s in stats) / samples) if samples else None
        per_trainer: dict = {}
        busy: dict = {}
        evals: dict = {}
        if work is None:
            for s in stats:
                j = s["index"]
                per_trainer[j] = per_trainer.get(j, 0.0) + s["compute_s"]
                evals[j] = max(evals.get(j, 0.0), s.get("eval_s", 0.0))
                busy[j] = busy.get(j, 0.0) + s["compute_s"] + s.get("eval_s", 0.0)
        else:
            for j, (compute, ev) in work.items():
                per_trainer[j], evals[j], busy[j] = compute, ev, compute + ev
        row: HistoryRow = {
            "round": round_no, "epoch": epoch, "time_s": self.now - self.ctx.t0,
            "test_accuracy": None, "test_loss": None, "train_loss": loss,
            "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
            "compute_s": max(per_trainer.values()) if per_trainer else 0.0,
            "idle_s": sum(s["idle_s"] for s in stats),
            "eval_s": max(evals.values(), default=0.0),
            # What the framework adds: round time beyond the busiest trainer's work. The
            # ledger keeps busy time within the wall time, up to float rounding (−1e-17
            # once), so the difference is floored at 0.
            "overhead_s": max(0.0, wall_s - max(busy.values(), default=0.0)),
            "wall_s": wall_s, "samples": samples,
            "samples_per_s": samples / wall_s if wall_s > 0 else None, "updates": len(stats),
            "workers": len(per_trainer),
        }
        self.bytes_sent = self.bytes_received = 0
        return row
