"""The one driver loop: runs any scheme's state machine over a ``Backend``.

:class:`Driver` owns everything a run does outside the scheme's arithmetic: the session
and the trainer pool, the plan of indices, checkpoint restore and the writer, callbacks,
events and the result. Its loop is

    orders = machine.start(weights, live trainers)
    while no Stop order:
        execute orders          # calls on trainers, rows to callbacks, checkpoints, timers
        event = next event      # a call returned, a trainer lost or joined, a timer
        orders = machine.handle(event)

Faults: a call that fails because its trainer's process or node died (``ActorDiedError``)
is a *loss*, not an error of the run: the pool starts a replacement (``pool.py``), every
other call in flight on that trainer fails with it, and the machine gets one
:class:`~.events.TrainerLost`. Anything a trainer's own code raises still fails the run,
with the remote traceback.
"""

from __future__ import annotations

import collections
import logging
import secrets
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

from ddlf_actors.errors import DDLFError

from .. import backends, checkpoint, datasets, tf_startup
from ..arrays import nbytes
from ..callbacks import DashboardPublisher, EarlyStopping, EventLog, History, ProgressBar
from ..config import TrainConfig
from ..options import ConfigError, SchemeOptions
from ..records import EventKind, RunEvent
from ..result import TrainResult
from .errors import TooFewTrainersError
from .events import CallDone, Event, RowDone, Tick, TrainerLost, TrainersJoined
from .machine import Machine, RunContext
from .orders import Call, Checkpoint, EmitRow, Lose, NeedTrainers, Order, SetTimer, Stop
from .plan import Plan
from .pool import TrainerPool, default_trainer_cls
from .rates import check_trainers_rate
from .slots import LOSS_ERRORS, Slot, SlotState
from .wire import Wire

__all__ = ["Driver", "Run", "TooFewTrainersError", "describe_callable", "check_framework"]

log = logging.getLogger("ddlf_actors.train")


def describe_callable(obj) -> str:
    """A stable name for a model function or dataset: what a checkpoint compares and the
    dashboard shows. A function or class is ``module.qualname``; an object that names
    itself with a ``__name__`` (``ddlf-train``'s model: ``paper_cnn``) is that name; any
    other object is its class's, with its ``name`` in brackets if it has one."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, datasets.PartitionedDataset):
        return f"partitioned:{obj.path}"
    own = getattr(obj, "__name__", None)
    if isinstance(own, str) and not hasattr(obj, "__qualname__"):
        return own
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    label = f"{module}.{name}"
    extra = getattr(obj, "name", None)
    return f"{label}({extra})" if isinstance(extra, str) else label


def check_framework(config: TrainConfig, info: dict) -> None:
    """Refuse, by name, a framework setting the model's framework does not read
    (``info``: a trainer's ``describe()``, whose ``framework`` the model's type chose).

    ``optimizer=`` and ``loss=`` build a PyTorch module's training; a Keras model compiles
    its own. ``keras_backend=`` runs Keras on another backend, which a PyTorch module
    does not use. Raises :class:`ConfigError`."""
    framework = info.get("framework")
    if framework == "keras":
        for name in ("optimizer", "loss"):
            if getattr(config, name) is not None:
                raise ConfigError(f"{name}=", "applies to PyTorch models; model_fn returned a "
                                  "Keras model, which compiles its own (model.compile("
                                  f"{name}=...)): leave {name}= out")
    elif framework == "torch" and config.keras_backend is not None:
        raise ConfigError(f"keras_backend={config.keras_backend!r}", "applies to Keras "
                          "models; model_fn returned a torch.nn.Module: leave it out")


def _say_gpu_note(config: TrainConfig, infos: list) -> None:
    """Once for the run: what the trainers' hidden CUDA start-up lines said
    (``tf_startup.gpu_note``). GPUs asked for and not started: a warning."""
    gpus = float(config.trainer_options.get("num_gpus") or 0)
    note = tf_startup.gpu_note(gpus, [i.get("cuda_failure") for i in infos])
    if note is None:
        return
    if gpus:
        log.warning(note)
    elif config.progress:
        print(f"ddlf: {note}", file=sys.stderr)
    else:
        log.info(note)


def run_settings(scheme: str, config: TrainConfig, machine: Machine, choice) -> dict:
    """What ``result.settings`` records: the scheme and every setting it ran with, and what
    ``auto`` chose and why (``choice``, or None)."""
    return {"scheme": scheme, "compression": config.compression,
            "options": machine.options.to_json(),
            "auto": None if choice is None else {**choice.to_json(),
                                                 "line": choice.line(config.workers)}}


def resume_detail(ckpt: checkpoint.Checkpoint, config: TrainConfig, options) -> str:
    """The ``resumed`` event's text: from where, and what changed since."""
    saved = {**ckpt.meta.get("config", {}), **ckpt.meta.get("options", {})}
    now = {**config.to_json(), **options.to_json()}
    changed = [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(now)
               if k in saved and saved.get(k) != now.get(k)
               and k not in ("callbacks", "progress", "checkpoint_dir")]
    text = f"from {ckpt.path} (round {ckpt.round})"
    if not ckpt.optimizer_states:
        # Said once, here: a model without optimizer state (plain SGD, a TrainerActor
        # subclass without get_optimizer_state) resumes bit-equal all the same.
        text += ("; it holds no optimizer state (the trainers reported none), so each "
                 "trainer goes on with the optimizer its model was built with")
    return text + (f"; settings changed: {', '.join(changed)}" if changed else "")


class Run:
    """The state callbacks see: ``scheme``, ``config``, ``total_rows``, ``rows_done`` (rows
    already in the history when training began, as after a resume), ``events`` and a
    writable ``stop``."""

    def __init__(self, scheme: str, config: TrainConfig, total_rows: int, rows_done: int = 0):
        self.scheme = scheme
        self.config = config
        self.total_rows = total_rows
        self.rows_done = rows_done
        self.events: list[RunEvent] = []
        self.stop = False
        self.model: str | None = None     # what model_fn and dataset are, for the dashboard
        self.dataset: str | None = None


class Driver:
    """One training run of the scheme ``machine_cls`` with the settings ``config`` and
    ``options`` (the scheme's, as given: defaults are filled in here)."""

    def __init__(self, machine_cls: type[Machine], model_fn, dataset, config: TrainConfig,
                 options: SchemeOptions, trainers=None,
                 clock: Callable[[], float] = time.perf_counter):
        self.machine_cls = machine_cls
        self.name = machine_cls.name
        self.model_fn = model_fn
        self.dataset = dataset
        self.config = config
        self.given = options            # as the caller gave them (auto keeps these)
        self.options = options.resolve(config)
        self.choice = None              # what scheme="auto" chose (auto.Choice)
        self.trainer_cls = config.trainer_cls or default_trainer_cls()
        self._adopted = list(trainers) if trainers is not None else None
        self.clock = clock
        self.t0 = clock()
        self.seed = config.seed if config.seed is not None else secrets.randbits(63)
        # DDLF's actors, Ray's, or the in-process fake (config.backend, or ddlf.init's).
        self.backend = backends.select(config.backend)
        # Refuse a compression= this scheme cannot send before anything starts.
        Wire(config.compression, self.name, machine_cls.wire_modes)
        self.events: list[RunEvent] = []
        self.history = History()
        self.early = EarlyStopping(config.target_accuracy, config.patience, config.target_loss)
        self.callbacks = [self.history, self.early, *config.callbacks,
                          ProgressBar() if config.progress else EventLog()]
        if isinstance(dataset, datasets.TextDataset):   # tokens and bits per byte, first
            from ..lm.metrics import TextMetrics

            self.callbacks.insert(0, TextMetrics(dataset, self.history))
        if self.backend.publishes_runs:   # the cluster's dashboard, where it has one
            self.callbacks.append(DashboardPublisher())
        self.pool: TrainerPool | None = None
        self.machine: Machine | None = None
        self.writer: checkpoint.CheckpointWriter | None = None
        self.last_checkpoint: str | None = None
        self.run_state: Run | None = None
        self.fingerprint: dict = {}
        # The loop's state: calls in flight (ref -> (call id, slot, the trainer called)).
        self.pending: dict[Any, tuple[int, Slot, Any]] = {}
        self.timer: float | None = None
        self.inbox: collections.deque[Event] = collections.deque()
        self.stop_order: Stop | None = None
        self._written: list = []                  # checkpoints done, from the writer's thread
        self._written_lock = threading.Lock()

    # -- the run -------------------------------------------------------------------------------
    def run(self, initial_weights=None, resume: str | None = None) -> TrainResult:
        """Train; continue from the newest checkpoint in ``resume`` if given."""
        ckpt = checkpoint.load(resume) if resume is not None else None
        if ckpt is not None and initial_weights is not None:
            raise ValueError("pass resume= or initial_weights=, not both: a resumed run starts "
                             "from its checkpoint's weights")
        # A local cluster of the backend if none is connected; stopped at the end if so.
        started_session = self.backend.ensure_session()
        t_start = self.clock()
        try:
            self.pool = TrainerPool(self.model_fn, self.dataset, self.config, self.emit,
                                    adopted=self._adopted, backend=self.backend,
                                    trainer_cls=self.trainer_cls, build_seed=self.seed)
            self.pool.start()
            check_framework(self.config, self.pool.live()[0].about)
            check_trainers_rate(self.options, self.pool.live()[0].about)
            if isinstance(self.dataset, datasets.TextDataset):   # its ids fit the model
                self.dataset.check_model(self.pool.live()[0].about)
            _say_gpu_note(self.config, [s.info for s in self.pool.live()])
            if self.name == "auto":
                self._resolve_auto(ckpt)
            machine = self.machine = self._make_machine(self.pool.live())
            if ckpt is not None:
                weights = self._restore(ckpt)
            else:
                weights = initial_weights
                if weights is None:
                    weights = self.backend.get(self.pool.live()[0].handle.get_weights.remote())
                    machine.bytes_received += nbytes(weights)
                weights = [np.array(w, copy=True) for w in weights]
            self.fingerprint = self._fingerprint()
            if ckpt is not None:
                self._check_fingerprint(ckpt)
            if self.config.checkpoint_dir is not None:
                self.writer = checkpoint.CheckpointWriter(
                    self.config.checkpoint_dir, self.config.keep_checkpoints,
                    on_done=self._checkpoint_done, on_error=self._checkpoint_failed)
                machine.ctx.checkpointing = True
            startup = self.clock() - t_start
            run = self.run_state = Run(self.name, self.config, machine.total_rows(),
                                       rows_done=len(self.history.rows))
            run.events = self.events
            run.model = describe_callable(self.model_fn)
            run.dataset = describe_callable(self.dataset)
            for cb in self.callbacks:
                cb.on_train_begin(run)
            if ckpt is not None:
                self.emit(EventKind.RESUMED, None, resume_detail(ckpt, self.config, machine.options))
            if self.choice is not None:
                self.emit(EventKind.SETTINGS, None, self.choice.line(self.config.workers))
            result = None
            try:
                weights = self._loop(machine.start(weights, self.pool.live(), self.clock()))
                if self.writer is not None:
                    self.writer.close()
                self._flush_checkpoint_events()
                result = TrainResult(
                    scheme=self.name, history=self.history.rows, weights=weights,
                    config=self.config, options=machine.options, model_fn=self.model_fn,
                    framework=self.pool.live()[0].about.get("framework")
                    if self.pool.live() else None,
                    trainer_cls=self.trainer_cls, updates=machine.updates, dataset=self.dataset,
                    stopped_early=self.early.reason, startup_s=startup, events=self.events,
                    checkpoint=self.last_checkpoint,
                    checkpoint_s=self.writer.blocked_s if self.writer else 0.0,
                    checkpoint_write_s=self.writer.write_s if self.writer else 0.0,
                    checkpoint_cpu_s=self.writer.write_cpu_s if self.writer else 0.0,
                    settings=run_settings(self.name, self.config, machine, self.choice))
            except DDLFError as e:
                if getattr(e, "resume_hint", False):
                    raise type(e)(f"{e} {self._resume_hint()}") from e
                raise
            finally:
                for cb in self.callbacks:
                    cb.on_train_end(result)
            return result
        finally:
            if self.writer is not None:
                self.writer.close()
            if self.pool is not None:
                self.pool.stop()
            if started_session:
                self.backend.shutdown()

    def _resolve_auto(self, ckpt) -> None:
        """``scheme="auto"``: become a run of the scheme ``auto.resolve`` chose."""
        from . import auto

        choice, self.machine_cls, self.options, self.config = auto.resolve(
            self.given, self.config, self.options, self.backend, self._the_pool().live(),
            ckpt.meta.get("auto") if ckpt is not None else None)
        self.choice, self.name = choice, choice.scheme
        (print if self.config.progress else log.info)(f"ddlf: {choice.line(self.config.workers)}")

    # -- what exists while run() runs --------------------------------------------------------
    def _the_pool(self) -> TrainerPool:
        if self.pool is None:
            raise RuntimeError("the driver's pool exists only while run() runs")
        return self.pool

    def _the_machine(self) -> Machine:
        if self.machine is None:
            raise RuntimeError("the driver's machine exists only while run() runs")
        return self.machine

    def _the_run(self) -> Run:
        if self.run_state is None:
            raise RuntimeError("the run's state exists only while run() trains")
        return self.run_state

    def _make_machine(self, live: list[Slot]) -> Machine:
        infos = [s.about for s in live]
        options = self.options.for_data(self.config, infos)
        plan = self._make_plan(infos, options.plan_rounds())
        wire = Wire(self.config.compression, self.name, self.machine_cls.wire_modes,
                    put=self.backend.put)
        ctx = RunContext(self.config, options, plan, wire, infos[0]["num_test"], infos[0],
                         self.t0)
        return self.machine_cls(ctx)

    def _make_plan(self, infos: list, rounds: int) -> Plan:
        if infos[0].get("partitioned"):
            sizes = {s.index: s.about["num_train"] for s in self._the_pool().live()}
            return Plan(self.seed, rounds, sum(sizes.values()), part_sizes=sizes,
                        batch_size=self.config.batch_size)
        return Plan(self.seed, rounds, infos[0]["num_train"], batch_size=self.config.batch_size)

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self, orders: list[Order]) -> list:
        machine = self._the_machine()
        while True:
            self._execute(orders)
            if self.stop_order is not None:
                return self.stop_order.weights
            orders = machine.handle(self._next_event())

    def _execute(self, orders: list[Order]) -> None:
        for order in orders:
            if isinstance(order, Call):
                self._call(order)
            elif isinstance(order, EmitRow):
                for cb in self.callbacks:
                    cb.on_row(order.row, self.run_state)
                self.inbox.append(RowDone(order.row["round"], bool(self._the_run().stop),
                                          self.clock()))
            elif isinstance(order, Checkpoint):
                self._save_checkpoint(order)
            elif isinstance(order, SetTimer):
                self.timer = order.at
            elif isinstance(order, NeedTrainers):
                self._wait_for_trainers(order.count, order.why)
            elif isinstance(order, Lose):
                self.inbox.append(self._lost(order.slot, order.slot.handle, order.error, []))
            elif isinstance(order, Stop):
                self.stop_order = order
                return
            else:
                raise TypeError(f"the {self.name} scheme gave an order the driver does not "
                                f"know: {order!r}")

    def _call(self, order: Call) -> None:
        handle = order.slot.handle
        try:
            ref = getattr(handle, order.method).remote(*order.args, **order.kwargs)
        except LOSS_ERRORS as e:   # a runtime that refuses calls to a dead actor at once
            if order.wait:
                self.inbox.append(self._lost(order.slot, handle, e, [order.id]))
            return
        if order.wait:
            self.pending[ref] = (order.id, order.slot, handle)

    def _next_event(self) -> Event:
        if self.inbox:
            return self.inbox.popleft()
        self._flush_checkpoint_events()
        joined = self._the_pool().poll()
        if joined:
            return TrainersJoined(tuple(joined), self.clock())
        if not self.pending:
            return self._idle_event()
        timeout = None if self.timer is None else max(0.0, self.timer - self.clock())
        ready, _ = self.backend.wait(list(self.pending), num_returns=1, timeout=timeout)
        if not ready:
            self.timer = None
            return Tick(self.clock())
        ref = ready[0]
        call_id, slot, handle = self.pending.pop(ref)
        try:
            value = self.backend.get(ref)
        except LOSS_ERRORS as e:
            return self._lost(slot, handle, e, [call_id])
        return CallDone(call_id, slot, value, self.clock())

    def _idle_event(self) -> Event:
        """Nothing in flight: the machine waits for a timer or for trainers to start."""
        if self.timer is not None:
            time.sleep(max(0.0, self.timer - self.clock()))
            self.timer = None
            return Tick(self.clock())
        while self._the_pool().starting():
            waiting = self._the_pool().starting()
            self.backend.wait([s.ready_ref for s in waiting], num_returns=1, timeout=1.0)
            joined = self._the_pool().poll()
            if joined:
                return TrainersJoined(tuple(joined), self.clock())
        raise RuntimeError(f"the {self.name} scheme waits with no call in flight, no timer "
                           "and no trainer starting: a bug in DDLF, please report it")

    def _lost(self, slot: Slot, handle, error: BaseException, call_ids: list) -> TrainerLost:
        """``handle``'s trainer died: the pool replaces it, and every call in flight on it
        fails with it."""
        if slot.handle is handle and slot.state is SlotState.LIVE:
            self._the_pool().lose(slot, error)
        for ref, (call_id, _slot, h) in list(self.pending.items()):
            if h is handle:
                del self.pending[ref]
                call_ids.append(call_id)
        return TrainerLost(slot, error, tuple(call_ids), self.clock())

    def _wait_for_trainers(self, count: int, why: str | None) -> None:
        cfg = self.config
        live = len(self._the_pool().live())
        self.emit(EventKind.WAITING, None,
                  f"{live} of min_workers={cfg.min_workers} trainers live; waiting up "
                  f"to {cfg.rejoin_timeout_s:g} s for replacements" if why is None else
                  f"{live} trainers live; waiting up to {cfg.rejoin_timeout_s:g} s for a "
                  "replacement")
        joined = self._the_pool().wait_for(count, cfg.rejoin_timeout_s)
        if len(self._the_pool().live()) < count:
            raise TooFewTrainersError(why or self._too_few_message(len(self._the_pool().live())))
        self.inbox.append(TrainersJoined(tuple(joined), self.clock()))

    # -- events --------------------------------------------------------------------------------
    def emit(self, kind: EventKind, slot: Slot | None, detail: str,
             when: float | None = None, round_no: int | None = None) -> None:
        if round_no is None:
            round_no = self.machine.event_round() if self.machine is not None else 1
        event: RunEvent = {
            "time_s": round((when if when is not None else self.clock()) - self.t0, 4),
            "round": round_no, "kind": kind.value,
            "trainer": None if slot is None else slot.index,
            "node": None if slot is None else slot.node, "detail": detail}
        self.events.append(event)
        if self.run_state is not None:
            for cb in self.callbacks:
                cb.on_event(event, self.run_state)

    def _too_few_message(self, live: int) -> str:
        cfg = self.config
        lost = [e for e in self.events if e["kind"] == EventKind.TRAINER_LOST.value]
        where = ", ".join(f"trainer {e['trainer']} on node {e['node']}" for e in lost[-4:])
        return (f"training stopped at round {self._the_machine().round_no}: {live} trainer(s) left, "
                f"fewer than min_workers={cfg.min_workers}, and no replacement started within "
                f"rejoin_timeout_s={cfg.rejoin_timeout_s:g} s ({len(lost)} lost: {where}). "
                "No node had a free CPU for one: add nodes with `ddlf-node start --address "
                f"...`, free CPUs, or lower min_workers. {self._resume_hint()}")

    def _resume_hint(self) -> str:
        if self.writer is not None:
            self.writer.close()   # the run ends here: name the checkpoint being written
        self._flush_checkpoint_events()
        if self.last_checkpoint:
            return (f"The last checkpoint, {self.last_checkpoint}, is valid: continue with "
                    f"resume={self.config.checkpoint_dir!r} (ddlf-train run --resume DIR).")
        return "No checkpoint was written (set checkpoint_dir= to be able to resume)."

    # -- checkpoints ---------------------------------------------------------------------------
    def _save_checkpoint(self, order: Checkpoint) -> None:
        """Queue a checkpoint of the run as it is now (written on a background thread).
        The weights lists are never changed in place (each update makes new arrays), so
        the writer can read them while training goes on."""
        machine = self._the_machine()
        meta = {
            "scheme": self.name, "history": [dict(r) for r in self.history.rows],
            "events": [dict(e) for e in self.events], "elapsed_s": self.clock() - self.t0,
            "rng": {"seed": self.seed, "kind": "numpy PCG64 per epoch, seeded by (seed, epoch)"},
            "config": self.config.to_json(), "options": machine.options.to_json(),
            "fingerprint": self.fingerprint, "position": order.position, "wire": order.wire,
        }
        if self.choice is not None:   # a resumed auto run takes this, not a new probe
            meta["auto"] = self.choice.to_json()
        if self.writer is None:
            raise RuntimeError("a Checkpoint order in a run without checkpoint_dir: a bug in "
                               "the scheme's machine (checkpoint_due is False there)")
        self.writer.submit(checkpoint.Checkpoint(
            round=order.round, weights=order.weights, meta=meta,
            optimizer_states=order.optimizer_states, arrays=order.arrays))

    def _checkpoint_done(self, ckpt, path: str, done: float) -> None:
        # The writer's thread: the event is emitted on the loop's (callbacks see it).
        with self._written_lock:
            self._written.append((ckpt.round, path, done))

    def _flush_checkpoint_events(self) -> None:
        with self._written_lock:
            written, self._written = self._written, []
        for round_no, path, done in written:
            self.last_checkpoint = path
            self.emit(EventKind.CHECKPOINT, None, path, when=done, round_no=round_no)

    def _checkpoint_failed(self, error: BaseException) -> None:
        import warnings

        warnings.warn(f"writing a checkpoint to {self.config.checkpoint_dir} failed ({error}); "
                      "training goes on and the previous checkpoint is still valid",
                      RuntimeWarning, stacklevel=2)

    def _fingerprint(self) -> dict:
        """What this run's model and dataset are (from a trainer, not from the weights a
        resume would load): a checkpoint of another model or dataset is refused."""
        info = self._the_pool().live()[0].about
        partitioned = self._the_machine().plan.partitioned
        return {
            "model": {"fn": describe_callable(self.model_fn), "weights": info["weights"]},
            "dataset": {"what": describe_callable(self.dataset),
                        "num_train": None if partitioned else info["num_train"],
                        "num_test": info["num_test"], "partitioned": partitioned},
        }

    def _check_fingerprint(self, ckpt: checkpoint.Checkpoint) -> None:
        diffs = checkpoint.compare_fingerprints(ckpt.meta.get("fingerprint", {}), self.fingerprint)
        if diffs:
            raise checkpoint.CheckpointMismatchError(
                f"cannot resume from {ckpt.path}: it is a run of another model or dataset. "
                + "; ".join(diffs) + ". Resume with the same model_fn and dataset, or start a "
                "new run from its weights: initial_weights=ddlf_actors.apps.checkpoint.load("
                f"{self.config.checkpoint_dir or ckpt.path!r}).weights")

    def _restore(self, ckpt: checkpoint.Checkpoint) -> list:
        meta = ckpt.meta
        if meta.get("scheme") != self.name:
            raise checkpoint.CheckpointMismatchError(
                f"cannot resume from {ckpt.path}: it was written by a {meta.get('scheme')} run, "
                f"this is a {self.name} run; resume it with train(..., scheme="
                f"{meta.get('scheme')!r})")
        machine = self._the_machine()
        machine.round_no = ckpt.round
        self.seed = int(meta["rng"]["seed"])
        machine.plan.seed = self.seed
        self.history.rows.extend(meta.get("history", []))
        self.events.extend(meta.get("events", []))
        machine.optimizer_states = {int(k): v for k, v in ckpt.optimizer_states.items()}
        self.t0 = machine.ctx.t0 = self.clock() - float(meta.get("elapsed_s", 0.0))
        self.last_checkpoint = ckpt.path
        machine.wire.restore(meta.get("wire"), ckpt.arrays)
        machine.restore(ckpt)
        return [np.array(w, copy=True) for w in ckpt.weights]
