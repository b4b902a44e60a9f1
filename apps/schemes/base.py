"""What every scheme shares: the trainers, history rows, events, checkpoints and resume.

The schemes differ only in how they hand out work and apply deltas; everything that
watches a run (history, progress bar, early stop, CSV) is a callback.

Evaluation never runs on the driver while trainers wait: see ``evaluation.py``. A row is
complete once its shards are back (during the next round in ``train_sync``); the last
weights get one sharded evaluation at the end. The cost is the trainers' time on a 1/K
test shard per evaluation, reported per row as ``eval_s``.

Faults: a call that fails because its trainer's process or node died (``ActorDiedError``)
is a *loss*, not an error of the run: the scheme goes on with the other trainers and the
pool starts a replacement (``pool.py``). Anything a trainer's own code raises still fails
the run, with the remote traceback.
"""

from __future__ import annotations

import dataclasses
import secrets
import time

import numpy as np

from ddlf_actors.errors import DDLFError

from .. import backends, checkpoint, datasets
from ..callbacks import DashboardPublisher, EarlyStopping, EventLog, History, ProgressBar
from ..config import SCHEME_OPTIONS, TrainConfig
from ..records import EventKind, HistoryRow, RunEvent, TrainStats
from ..result import TrainResult
from ..trainer import TrainerActor, nbytes
from .evaluation import ShardedEvaluation
from .plan import Plan
from .pool import LOSS_ERRORS, Slot, TrainerPool
from .wire import PLAIN, Broadcast, Wire

__all__ = ["Scheme", "Run", "TooFewTrainersError"]


class TooFewTrainersError(DDLFError):
    """Fewer than ``min_workers`` trainers were left and none came back in time."""


def describe_callable(obj) -> str:
    """A stable name for a model function or dataset: what a checkpoint compares."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, datasets.PartitionedDataset):
        return f"partitioned:{obj.path}"
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    label = f"{module}.{name}"
    extra = getattr(obj, "name", None)
    return f"{label}({extra})" if isinstance(extra, str) else label


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


class Scheme:
    """One training run: start or adopt trainers, run the loop, return a ``TrainResult``.

    A subclass sets ``name``, lists in ``options`` the scheme-level settings it reads
    (``config.SCHEME_OPTIONS``) with their ``defaults``, and implements ``loop``,
    ``total_rows`` and, to resume, ``position``/``restore_position``.
    """

    name = "scheme"
    # How this scheme can send weights with compression= (schemes/wire.py): a scheme that
    # does not encode its traffic refuses compression= rather than ignore it.
    wire_modes: tuple = (PLAIN,)
    # The scheme-level settings this scheme reads; the others must be left at None.
    options: tuple[str, ...] = ()
    # Values for the settings in ``options`` that a run leaves at None.
    defaults: dict = {}

    def __init__(self, model_fn, dataset, config: TrainConfig, trainers=None):
        self.model_fn = model_fn
        self.dataset = dataset
        config = self.resolve(config)
        self.config = config
        self.trainer_cls = config.trainer_cls or TrainerActor
        self._adopted = list(trainers) if trainers is not None else None
        self.pool: TrainerPool | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.round_no = 0                  # rounds (sync) or updates (async) completed
        self.events: list[RunEvent] = []
        self.history = History()
        self.early = EarlyStopping(config.target_accuracy, config.patience)
        callbacks = [self.history, self.early, *config.callbacks]
        callbacks.append(ProgressBar() if config.progress else EventLog())
        self.callbacks = callbacks
        self.run_state: Run | None = None
        self.t0 = time.perf_counter()
        self.optimizer_states: dict[int, list] = {}   # slot -> the latest state it reported
        self.writer: checkpoint.CheckpointWriter | None = None
        self.last_checkpoint: str | None = None
        self.seed = config.seed if config.seed is not None else secrets.randbits(63)
        # DDLF's actors or Ray's (config.backend, or what ddlf.init chose): backends/.
        self.backend = backends.select(config.backend)
        self.wire = Wire(config.compression, self.name, self.wire_modes,
                         put=self.backend.put)
        # The run is published to the cluster's dashboard where the runtime has one.
        if self.backend.publishes_runs:
            callbacks.append(DashboardPublisher())

    # -- the run -----------------------------------------------------------------------------
    def run(self, initial_weights=None, resume: str | None = None) -> TrainResult:
        """Train; continue from the newest checkpoint in ``resume`` if given."""
        ckpt = checkpoint.load(resume) if resume is not None else None
        # A local cluster of the backend if none is connected; stopped at the end if so.
        started_session = self.backend.ensure_session()
        t_start = time.perf_counter()
        try:
            self.pool = TrainerPool(self.model_fn, self.dataset, self.config, self.emit,
                                    adopted=self._adopted, backend=self.backend)
            self.pool.start()
            infos = [s.info for s in self.pool.live()]
            self.num_test = infos[0]["num_test"]
            self.plan = self._make_plan(infos)
            if ckpt is not None:
                weights = self._restore(ckpt, initial_weights)
            else:
                weights = initial_weights
                if weights is None:
                    weights = self.backend.get(self.pool.live()[0].handle.get_weights.remote())
                    self.bytes_received += nbytes(weights)
                weights = [np.array(w, copy=True) for w in weights]
            self.fingerprint = self._fingerprint()
            if ckpt is not None:
                self._check_fingerprint(ckpt)
            if self.config.checkpoint_dir is not None:
                self.writer = checkpoint.CheckpointWriter(
                    self.config.checkpoint_dir, self.config.keep_checkpoints,
                    on_done=self._checkpoint_done, on_error=self._checkpoint_failed)
            startup = time.perf_counter() - t_start
            self.run_state = Run(self.name, self.config, self.total_rows(),
                                 rows_done=len(self.history.rows))
            self.run_state.events = self.events
            self.run_state.model = describe_callable(self.model_fn)
            self.run_state.dataset = describe_callable(self.dataset)
            for cb in self.callbacks:
                cb.on_train_begin(self.run_state)
            if ckpt is not None:
                self.emit(EventKind.RESUMED, None, self._resume_detail(ckpt))
            self.admit(self.pool.live())
            result = None
            try:
                weights = self.loop(weights)
                if self.writer is not None:
                    self.writer.close()
                result = TrainResult(
                    scheme=self.name, history=self.history.rows, weights=weights,
                    config=self.config, model_fn=self.model_fn, trainer_cls=self.trainer_cls,
                    updates=getattr(self, "updates", []), stopped_early=self.early.reason,
                    startup_s=startup, events=self.events, checkpoint=self.last_checkpoint,
                    checkpoint_s=self.writer.blocked_s if self.writer else 0.0,
                    checkpoint_write_s=self.writer.write_s if self.writer else 0.0,
                    checkpoint_cpu_s=self.writer.write_cpu_s if self.writer else 0.0)
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

    @classmethod
    def resolve(cls, config: TrainConfig) -> TrainConfig:
        """``config`` with this scheme's defaults filled in for the settings left at None.

        Raises ``ValueError`` for a scheme-level setting this scheme does not read, naming
        the schemes that do.
        """
        from .registry import accepting

        filled = {}
        defaults = cls.scheme_defaults(config)
        for option in SCHEME_OPTIONS:
            value = getattr(config, option)
            if option not in cls.options:
                if value is not None:
                    readers = accepting(option)
                    raise ValueError(
                        f"{option}= does not apply to the {cls.name!r} scheme; it is read by "
                        + (", ".join(repr(n) for n in readers) if readers else "no scheme")
                        + " (train(..., scheme=...), ddlf-train run --scheme ...)")
            elif value is None and defaults.get(option) is not None:
                filled[option] = defaults[option]
        config = dataclasses.replace(config, **filled) if filled else config
        cls.validate(config)
        return config

    @classmethod
    def validate(cls, config: TrainConfig) -> None:
        """Raise ``ValueError`` for settings that do not fit together (``config`` has the
        defaults filled in); called before any trainer starts."""

    @classmethod
    def scheme_defaults(cls, config: TrainConfig) -> dict:
        """The defaults for a run of ``config`` (override when one depends on it, e.g. on K)."""
        return dict(cls.defaults)

    def loop(self, weights: list) -> list:
        raise NotImplementedError

    def total_rows(self) -> int:
        raise NotImplementedError

    def position(self) -> dict:
        """Where the scheme is, as JSON, for a checkpoint (besides round_no)."""
        return {}

    def restore_position(self, ckpt: checkpoint.Checkpoint) -> None:
        """Continue from ``ckpt`` (the inverse of :meth:`position`)."""

    # -- membership --------------------------------------------------------------------------
    def members(self) -> list[Slot]:
        """The live trainers for the next piece of work, after letting new ones join.

        Below ``min_workers`` this waits up to ``rejoin_timeout_s`` for replacements, then
        raises :class:`TooFewTrainersError`.
        """
        cfg = self.config
        joined = self.pool.poll()
        live = self.pool.live()
        if len(live) < cfg.min_workers:
            self.emit(EventKind.WAITING, None,
                      f"{len(live)} of min_workers={cfg.min_workers} trainers live; waiting up "
                      f"to {cfg.rejoin_timeout_s:g} s for replacements")
            joined += self.pool.wait_for(cfg.min_workers, cfg.rejoin_timeout_s)
            live = self.pool.live()
            if len(live) < cfg.min_workers:
                raise TooFewTrainersError(self._too_few_message(len(live)))
        self.admit(joined)
        return live

    def admit(self, slots) -> None:
        """Trainers joining the run get the optimizer state their slot last reported."""
        for slot in slots:
            state = self.optimizer_states.get(slot.index)
            if state is not None:
                slot.handle.set_optimizer_state.remote(state)
            if self.plan.partitioned:
                self.plan.part_sizes[slot.index] = slot.info["num_train"]
            self.wire.admit(slot)

    def lose(self, slot: Slot, error: BaseException) -> None:
        self.wire.lose(slot.index)   # its error-feedback residual is lost with it
        self.pool.lose(slot, error)

    def _too_few_message(self, live: int) -> str:
        cfg = self.config
        lost = [e for e in self.events if e["kind"] == EventKind.TRAINER_LOST.value]
        where = ", ".join(f"trainer {e['trainer']} on node {e['node']}" for e in lost[-4:])
        saved = (f"The last checkpoint, {self.last_checkpoint}, is valid: continue with "
                 f"resume={cfg.checkpoint_dir!r} (ddlf-train run --resume DIR)."
                 if self.last_checkpoint else
                 "No checkpoint was written (set checkpoint_dir= to be able to resume).")
        return (f"training stopped at round {self.round_no}: {live} trainer(s) left, fewer than "
                f"min_workers={cfg.min_workers}, and no replacement started within "
                f"rejoin_timeout_s={cfg.rejoin_timeout_s:g} s ({len(lost)} lost: {where}). "
                "No node had a free CPU for one: add nodes with `ddlf-node start --address "
                f"...`, free CPUs, or lower min_workers. {saved}")

    # -- events and rows ---------------------------------------------------------------------
    def emit(self, kind: EventKind, slot: Slot | None, detail: str,
             when: float | None = None) -> None:
        event: RunEvent = {
            "time_s": round((when if when is not None else time.perf_counter()) - self.t0, 4),
            "round": self.event_round(), "kind": kind.value,
            "trainer": None if slot is None else slot.index,
            "node": None if slot is None else slot.node, "detail": detail}
        self.events.append(event)
        if self.run_state is not None:
            for cb in self.callbacks:
                cb.on_event(event, self.run_state)

    def event_round(self) -> int:
        """The round an event belongs to: the one in progress."""
        return self.round_no + 1

    def put_weights(self, weights: list):
        """One ``put`` per version: each trainer's connection carries it once."""
        return self.backend.put(weights)

    def broadcast(self, weights: list) -> Broadcast:
        """A version of the weights for the trainers, encoded as ``compression=`` says
        (one ``put`` per version, as :meth:`put_weights`); see ``wire.py``."""
        return self.wire.broadcast(weights)

    def finish_row(self, row: HistoryRow) -> None:
        for cb in self.callbacks:
            cb.on_row(row, self.run_state)

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
            "round": round_no, "epoch": epoch, "time_s": time.perf_counter() - self.t0,
            "test_accuracy": None, "test_loss": None, "train_loss": loss,
            "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
            "compute_s": max(per_trainer.values()) if per_trainer else 0.0,
            "idle_s": sum(s["idle_s"] for s in stats),
            "eval_s": max(evals.values(), default=0.0),
            # What the framework adds: round time beyond the busiest trainer's work.
            "overhead_s": wall_s - max(busy.values(), default=0.0),
            "wall_s": wall_s, "samples": samples,
            "samples_per_s": samples / wall_s if wall_s > 0 else None, "updates": len(stats),
            "workers": len(per_trainer),
        }
        self.bytes_sent = self.bytes_received = 0
        return row

    def evaluation(self, row: HistoryRow, weights_ref) -> ShardedEvaluation | None:
        """A sharded evaluation of ``row`` (None without a test set: the row is done).
        ``weights_ref``: a ref of the weights, or a :class:`Broadcast` of them."""
        if not self.num_test:
            self.finish_row(row)
            return None
        return ShardedEvaluation(row, weights_ref, self.num_test)

    def next_done(self, refs: list):
        """Wait for one of ``refs``: ``(ref, value, None)``, or ``(ref, None, error)`` when
        its trainer was lost."""
        ready, _ = self.backend.wait(refs, num_returns=1)
        ref = ready[0]
        try:
            return ref, self.backend.get(ref), None
        except LOSS_ERRORS as e:
            return ref, None, e

    def keep_state(self, slot_index: int, stats: TrainStats) -> None:
        state = stats.pop("optimizer_state", None)
        if state is not None:
            self.optimizer_states[slot_index] = state
        self.bytes_received += self.wire.keep(slot_index, stats)

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint_due(self, round_no: int) -> bool:
        every = self.config.checkpoint_every
        return self.writer is not None and every is not None and round_no % every == 0

    def save_checkpoint(self, weights: list, arrays: dict | None = None) -> None:
        """Queue a checkpoint of the run as it is now (written on a background thread).

        The weights lists are never changed in place (each update makes new arrays), so
        the writer can read them while training goes on.
        """
        meta = {
            "scheme": self.name, "history": [dict(r) for r in self.history.rows],
            "events": [dict(e) for e in self.events], "elapsed_s": time.perf_counter() - self.t0,
            "rng": {"seed": self.seed, "kind": "numpy PCG64 per epoch, seeded by (seed, epoch)"},
            "config": self.config.to_json(), "fingerprint": self.fingerprint,
            "position": self.position(), "wire": self.wire.position(),
        }
        self.writer.submit(checkpoint.Checkpoint(
            round=self.round_no, weights=weights, meta=meta,
            optimizer_states=dict(self.optimizer_states),
            arrays={**(arrays or {}), **self.wire.arrays()}))

    def _checkpoint_done(self, ckpt, path: str, done: float) -> None:
        self.last_checkpoint = path
        self.events.append({"time_s": round(done - self.t0, 4), "round": ckpt.round,
                            "kind": EventKind.CHECKPOINT.value, "trainer": None, "node": None,
                            "detail": path})

    def _checkpoint_failed(self, error: BaseException) -> None:
        import warnings

        warnings.warn(f"writing a checkpoint to {self.config.checkpoint_dir} failed ({error}); "
                      "training goes on and the previous checkpoint is still valid",
                      RuntimeWarning, stacklevel=2)

    def _fingerprint(self) -> dict:
        """What this run's model and dataset are (from a trainer, not from the weights a
        resume would load): a checkpoint of another model or dataset is refused."""
        info = self.pool.live()[0].info
        return {
            "model": {"fn": describe_callable(self.model_fn), "weights": info["weights"]},
            "dataset": {"what": describe_callable(self.dataset),
                        "num_train": None if self.plan.partitioned else info["num_train"],
                        "num_test": info["num_test"], "partitioned": self.plan.partitioned},
        }

    def _check_fingerprint(self, ckpt: checkpoint.Checkpoint) -> None:
        diffs = checkpoint.compare_fingerprints(ckpt.meta.get("fingerprint", {}), self.fingerprint)
        if diffs:
            raise checkpoint.CheckpointMismatchError(
                f"cannot resume from {ckpt.path}: it is a run of another model or dataset. "
                + "; ".join(diffs) + ". Resume with the same model_fn and dataset, or start a "
                "new run from its weights: initial_weights=ddlf_actors.apps.checkpoint.load("
                f"{self.config.checkpoint_dir or ckpt.path!r}).weights")

    def _restore(self, ckpt: checkpoint.Checkpoint, initial_weights) -> list:
        if initial_weights is not None:
            raise ValueError("pass resume= or initial_weights=, not both: a resumed run starts "
                             "from its checkpoint's weights")
        meta = ckpt.meta
        if meta.get("scheme") != self.name:
            raise checkpoint.CheckpointMismatchError(
                f"cannot resume from {ckpt.path}: it was written by a {meta.get('scheme')} run, "
                f"this is a {self.name} run; resume it with train_{meta.get('scheme')}")
        self.round_no = ckpt.round
        self.seed = int(meta["rng"]["seed"])
        self.plan.seed = self.seed
        self.history.rows.extend(meta.get("history", []))
        self.events.extend(meta.get("events", []))
        self.optimizer_states = {int(k): v for k, v in ckpt.optimizer_states.items()}
        self.t0 = time.perf_counter() - float(meta.get("elapsed_s", 0.0))
        self.last_checkpoint = ckpt.path
        self.resumed_from = ckpt
        self.wire.restore(meta.get("wire"), ckpt.arrays)
        self.restore_position(ckpt)
        return [np.array(w, copy=True) for w in ckpt.weights]

    def _resume_detail(self, ckpt: checkpoint.Checkpoint) -> str:
        saved = ckpt.meta.get("config", {})
        now = self.config.to_json()
        changed = [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(now)
                   if k in saved and saved.get(k) != now.get(k)
                   and k not in ("callbacks", "progress", "checkpoint_dir")]
        text = f"from {ckpt.path} (round {ckpt.round})"
        return text + (f"; settings changed: {', '.join(changed)}" if changed else "")

    def _make_plan(self, infos: list) -> Plan:
        cfg = self.config
        if infos[0].get("partitioned"):
            sizes = {s.index: s.info["num_train"] for s in self.pool.live()}
            return Plan(self.seed, cfg.rounds_per_epoch or 1, sum(sizes.values()),
                        part_sizes=sizes)
        return Plan(self.seed, cfg.rounds_per_epoch or 1, infos[0]["num_train"])
