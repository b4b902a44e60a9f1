"""The trainers of a run: placing them, noticing losses, replacing them, growing the set.

A run has ``workers`` *slots*. Slot ``j`` holds one trainer at a time; its index is the
trainer's identity (its partition of a partitioned dataset, its row in the logs). A slot
is ``STARTING`` (its actor is being created, or waits for its reserved CPU), ``LIVE``,
``LOST`` (its process or node died) or ``FAILED`` (a replacement's ``__init__`` raised).

Placement: the first ``config.start_workers`` slots are reserved together as one
placement group (all or nothing, ``placement_strategy``), so a run never starts
half-placed. With ``workers=(lo, hi)`` the other ``hi − lo`` slots get a one-bundle group
each, which the head places whenever CPUs appear (a node joining, another run ending);
their trainers then join the run at its next round.

A trainer whose process dies while it starts (SIGKILL, the OOM killer, a preempted or
lost node: nothing raised) is a fault like a loss mid-run: a new trainer is started in
its slot, up to ``START_TRIES`` times in a row, and once the run has ``min_workers``
live it goes on without that slot, which joins when its trainer is up. A trainer that
neither reports ready nor dies within ``start_timeout_s`` (a ``model_fn`` that blocks, a
process stuck before it could run) is the same fault: it is killed and started again,
so a run never waits forever on one trainer. An ``__init__``
that raises (``model_fn`` or the dataset) is an error in the user's code: at the run's
start it fails the run at once (``TrainerStartError``, with the remote traceback); a
replacement's gives its slot up. ``result.events`` tells the two apart
(``trainer_died_starting``, ``trainer_start_failed``).

A lost trainer is replaced at once in its own bundle. If only its process died, the
bundle's CPU is free again on the same node and the replacement starts there in tens of
milliseconds. If its node died, the head places the bundle again elsewhere (as Ray
does) when some node has room, and the replacement starts then; until then the run goes
on with the trainers it has.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Callable

from ddlf_actors.errors import ActorDiedError, UnschedulableError

from .. import backends, datasets
from ..config import ConfigError, TrainConfig
from ..records import EventKind
from . import initial_weights
from .errors import TrainerStartError
from .slots import LOSS_ERRORS, Slot, SlotState

__all__ = ["TrainerPool", "Slot", "SlotState", "TrainerStartError", "check_dataset",
           "start_trainers", "stop_trainers", "describe_trainers", "LOSS_ERRORS",
           "default_trainer_cls", "START_TRIES"]

log = logging.getLogger("ddlf_actors.train")

# A slot's trainer whose process dies while starting, with nothing raised in __init__
# (killed, out of memory, its node lost), is started this many times in a row before
# the slot is given up: a model that cannot fit in a node's memory fails in bounded time,
# not forever (Ray bounds an actor's restarts with max_restarts the same way).
START_TRIES = 4


def check_dataset(dataset) -> None:
    """Fail on the driver, before any trainer starts, for a dataset that cannot work:
    ``ConfigError`` (a ``ValueError``) for a name that is not registered,
    ``FileNotFoundError`` for a partition directory that is not there, ``TypeError`` for
    anything else that is not a dataset."""
    if isinstance(dataset, str):
        if dataset not in datasets.names():
            hint = (f"; for text, datasets.corpus({dataset!r}, context=...)"
                    if dataset in datasets.corpora.CORPORA else "")
            raise ConfigError(f"dataset={dataset!r}", "is not a registered dataset: use one of "
                              f"{', '.join(sorted(datasets.names()))} "
                              "(datasets.register(name, loader) adds one), a callable "
                              "returning ((x, y), (x_test, y_test)), "
                              "datasets.partitioned(path), or a text dataset "
                              f"(datasets.text, datasets.corpus){hint}")
    elif isinstance(dataset, datasets.PartitionedDataset):
        dataset.num_partitions  # noqa: B018 - raises FileNotFoundError for a bad path
    elif isinstance(dataset, datasets.TextDataset):
        # Files found (or the corpus fetched), a BPE trained, this node's tokens cached and
        # the splits checked here, so the trainers get the trained tokenizer.
        dataset.prepare()
    elif not callable(dataset):
        raise TypeError(f"dataset must be a registered name, a callable, "
                        f"datasets.partitioned(path) or a text dataset (datasets.text, "
                        f"datasets.corpus), got {type(dataset).__name__}")


def _quietly(what: str, arg, fn, *args) -> None:
    """``fn(*args)``, whose failure only means there is nothing left to end: the actor or
    group is already gone with its node or session, which is what ending it wanted.
    Logged at debug level, never raised: cleanup must reach every other trainer."""
    try:
        fn(*args)
    except Exception as e:
        log.debug(what + " failed (already gone?): %s", arg, e)


def default_trainer_cls() -> type:
    """``TrainerActor`` (imported when needed: the trainer imports the schemes' trainer
    sides, whose package imports this module)."""
    from ..trainer import TrainerActor

    return TrainerActor


class TrainerPool:
    """The slots of one run. ``emit(kind, slot, detail)`` reports what happens to them."""

    def __init__(self, model_fn, dataset, config: TrainConfig,
                 emit: Callable[[EventKind, Slot | None, str], None],
                 adopted: list | None = None, backend: backends.Backend | None = None,
                 trainer_cls: type | None = None, build_seed: int | None = None):
        self.model_fn = model_fn
        # The trainers build from SeededBuild(model_fn, build_seed): the same initial
        # weights on each, which the start then need not send (initial_weights.py).
        self._build_fn = (model_fn if build_seed is None
                          else initial_weights.SeededBuild(model_fn, build_seed))
        self.dataset = dataset
        self.config = config
        self.emit = emit
        self.slots: list[Slot] = []
        self._groups: list = []
        self._adopted = adopted
        self.backend = backend or backends.select(config.backend)
        options = dict(config.trainer_options)
        cls = trainer_cls or config.trainer_cls or default_trainer_cls()
        self._actor_cls = self.backend.remote(cls, num_cpus=config.num_cpus, **options)
        bundle = {"CPU": float(config.num_cpus), **(options.get("resources") or {})}
        self._bundle = {k: float(v) for k, v in bundle.items() if v}
        # Nothing to reserve, or the caller placed the trainers itself.
        self._reserve = bool(self._bundle) and not (
            "scheduling_strategy" in options or "node_id" in options)

    # -- start and stop --------------------------------------------------------------------
    def start(self, need: int | None = None) -> None:
        """Place and build the first trainers; return once ``need`` of them are live
        (default ``min_workers``) and the rest are live too or being started again.

        A first trainer whose process dies while starting is started again in its slot
        (``START_TRIES`` in a row); one still starting once ``need`` are live joins later
        (:meth:`poll`). Raises ``UnschedulableError`` (naming the demand) when the first
        ``config.start_workers`` trainers cannot be reserved, ``TrainerStartError`` when
        one of them raises in ``__init__`` or too few can start, ``ValueError`` for a
        dataset that cannot work.
        """
        check_dataset(self.dataset)
        if self._adopted is not None:
            self.slots = [Slot(j, handle=t, owned=False, ready_ref=t.describe.remote())
                          for j, t in enumerate(self._adopted)]
            self._wait_started(self.slots, len(self.slots))
            return
        cfg = self.config
        if isinstance(self.dataset, datasets.PartitionedDataset) and \
                self.dataset.num_partitions < cfg.workers:
            raise ValueError(f"{self.dataset!r} has {self.dataset.num_partitions} partitions for "
                             f"{cfg.workers} workers: each trainer loads its own partition")
        first = cfg.start_workers
        try:
            main = self._reserve_group(first) if self._reserve else None
            self.slots = [Slot(j, group=main, bundle=j) for j in range(first)]
            for j in range(first, cfg.workers):   # elastic: placed when CPUs appear
                self.slots.append(Slot(j, group=self._spare_group() if self._reserve else None))
            for slot in self.slots:
                self._create(slot)
            self._wait_started(self.slots[:first],
                               min(cfg.min_trainers, first) if need is None else need)
            # Spare slots already placed start with the rest rather than a round later.
            placed = [s for s in self.slots[first:] if self._group_placed(s.group)]
            self.poll(block_for=placed, timeout=cfg.placement_timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill every trainer of the run and free its placement groups (no-op without a session)."""
        if not self.backend.is_initialized():
            return   # their cluster is gone with them; do not start a new one to kill them
        for slot in self.slots:
            if slot.owned and slot.handle is not None:
                _quietly("killing trainer %s", slot.index, self.backend.kill, slot.handle)
        for pg in self._groups:
            _quietly("freeing placement group %s", pg, self.backend.remove_placement_group, pg)
        self._groups = []

    # -- membership ------------------------------------------------------------------------
    def live(self) -> list[Slot]:
        """The trainers that take work now, by slot index."""
        return [s for s in self.slots if s.state is SlotState.LIVE]

    def starting(self) -> list[Slot]:
        return [s for s in self.slots if s.state is SlotState.STARTING]

    def lose(self, slot: Slot, error: BaseException) -> None:
        """``slot``'s trainer is gone: record it and start its replacement, if we own it."""
        if slot.state is not SlotState.LIVE:
            return
        slot.state = SlotState.LOST
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        self.emit(EventKind.TRAINER_LOST, slot, f"{type(error).__name__}: {first}"[:300])
        if slot.owned:
            self._create(slot)

    def poll(self, block_for: list | None = None, timeout: float = 0.0) -> list[Slot]:
        """Let trainers that finished starting join; return them.

        Waits up to ``timeout`` for the slots in ``block_for``, never for others.
        """
        joined = []
        deadline = time.monotonic() + timeout
        while True:
            waiting = self.starting()
            if not waiting:
                break
            ready, _ = self.backend.wait([s.ready_ref for s in waiting], num_returns=len(waiting),
                                 timeout=0)
            ready_set = set(ready)
            for slot in waiting:
                if slot.ready_ref in ready_set and self._settle(slot):
                    joined.append(slot)
            for slot in self._overdue(self.starting()):
                if slot.owned:
                    self._start_timed_out(slot)
            pending = [s for s in (block_for or ()) if s.state is SlotState.STARTING]
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                break
            self.backend.wait([s.ready_ref for s in pending], num_returns=1, timeout=min(left, 1.0))
        return joined

    def wait_for(self, n: int, timeout: float) -> list[Slot]:
        """Wait up to ``timeout`` until ``n`` trainers are live; return those that joined."""
        joined = self.poll()
        deadline = time.monotonic() + timeout
        while len(self.live()) < n and self.starting():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waiting = self.starting()
            self.backend.wait([s.ready_ref for s in waiting], num_returns=1,
                              timeout=min(left, 1.0))
            joined += self.poll()
        return joined

    # -- internals -------------------------------------------------------------------------
    def _create(self, slot: Slot) -> None:
        if slot.handle is not None and slot.owned:
            # Usually dead already; a hung one must not linger.
            _quietly("killing the trainer of slot %s", slot.index, self.backend.kill,
                     slot.handle)
        cls = self._actor_cls
        if slot.group is not None:
            cls = cls.options(scheduling_strategy=self.backend.in_bundle(slot.group, slot.bundle))
        # Framework settings only when there are some: a TrainerActor subclass written
        # before them keeps its (model_fn, dataset, index, num_cpus) signature.
        extra = self.config.framework_options()
        slot.handle = cls.remote(self._build_fn, self.dataset, slot.index, self.config.num_cpus,
                                 *([extra] if extra else []))
        slot.ready_ref = slot.handle.describe.remote()
        slot.info = None
        slot.state = SlotState.STARTING
        slot.starts += 1
        slot.started_at = time.monotonic()

    def _settle(self, slot: Slot) -> bool:
        """A STARTING slot's describe() is back: LIVE (True), started again (its process
        died while starting) or given up (False)."""
        try:
            slot.info = self.backend.get(slot.ready_ref)
        except LOSS_ERRORS as e:
            if not self._died_starting(slot, e):   # __init__ raised: the slot is given up
                slot.state = SlotState.FAILED
                self.emit(EventKind.TRAINER_START_FAILED, slot, error_brief(e))
            return False
        slot.ready_ref = None
        slot.state = SlotState.LIVE
        slot.start_failures = 0
        how = "replacement" if slot.starts > 1 else "new trainer"
        self.emit(EventKind.TRAINER_JOINED, slot, f"{how}, pid {slot.info.get('pid')}")
        return True

    def _died_starting(self, slot: Slot, error: BaseException) -> bool:
        """``slot``'s trainer is gone before it finished starting. If its process died
        (nothing raised in ``__init__``: ``error.cause`` is None) and the slot is ours, that
        is a fault: recorded, and a new trainer started in the slot, or the slot given up
        (FAILED) after ``START_TRIES`` in a row; True. False for an ``__init__`` that
        raised, or a trainer the caller passed in: the caller decides."""
        if getattr(error, "cause", None) is not None or not slot.owned:
            return False
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        self._start_fault(slot, "its process died while starting",
                          f"(nothing raised: killed, out of memory, or its node lost): {first}")
        return True

    def _start_fault(self, slot: Slot, what: str, detail: str) -> None:
        """One more start of ``slot`` failed without its code raising: recorded, and a new
        trainer started in the slot, or the slot given up (FAILED) after ``START_TRIES``
        in a row."""
        slot.start_failures += 1
        tries = slot.start_failures
        self.emit(EventKind.TRAINER_DIED_STARTING, slot,
                  f"{what}, try {tries} of {START_TRIES} {detail}"[:300])
        if tries < START_TRIES:
            self._create(slot)   # kills the one before, should it still be there
            return
        slot.state = SlotState.FAILED
        if slot.handle is not None:   # a stuck one must not keep its CPU
            _quietly("killing the trainer of slot %s", slot.index, self.backend.kill,
                     slot.handle)
        self.emit(EventKind.TRAINER_START_FAILED, slot,
                  f"{what} {tries} times in a row: slot given up")

    def _overdue(self, slots: list[Slot]) -> list[Slot]:
        """The slots among ``slots`` still starting past ``start_timeout_s``."""
        limit = self.config.start_timeout_s
        now = time.monotonic()
        late = []
        for s in slots:
            if s.state is not SlotState.STARTING:
                continue
            if not self._group_placed(s.group):
                # Waiting for a CPU (an elastic slot, a lost node's bundle) is not being
                # stuck: its clock starts once its bundle is placed again.
                s.started_at = now
            elif now - s.started_at >= limit:
                late.append(s)
        return late

    def _until_overdue(self, slots: list[Slot]) -> float:
        """Seconds until the first of ``slots`` still starting is overdue (0 when one is)."""
        limit = self.config.start_timeout_s
        starts = [s.started_at for s in slots if s.state is SlotState.STARTING]
        if not starts:
            return limit
        return max(0.0, min(starts) + limit - time.monotonic())

    def _start_timed_out(self, slot: Slot) -> None:
        """``slot``'s trainer has been starting for ``start_timeout_s``: killed and started
        again (a start fault), or ``TrainerStartError`` for a trainer the caller passed in,
        which is not ours to replace."""
        limit = self.config.start_timeout_s
        if not slot.owned:
            raise start_timeout_error(slot.index, limit, tries=1)
        self._start_fault(slot, f"it did not report ready within start_timeout_s={limit:g} s",
                          "(neither ready nor dead: a model_fn or dataset that blocks, or a "
                          "process stuck before it ran): killed")

    def _wait_started(self, slots: list[Slot], need: int) -> None:
        """Wait until ``slots`` are built, or until ``need`` of them are live and each of
        the others is being started again after its process died (it joins later).

        Raises ``TrainerStartError``: at once when an ``__init__`` raised (the remote
        traceback in its text), or when a slot is given up and fewer than ``need`` can
        still be live."""
        waiting = list(slots)
        while waiting:
            ready, _ = self.backend.wait([s.ready_ref for s in waiting], num_returns=1,
                                         timeout=self._until_overdue(waiting))
            done = set(ready)
            for slot in [s for s in waiting if s.ready_ref in done]:
                try:
                    slot.info = self.backend.get(slot.ready_ref)
                except LOSS_ERRORS as e:
                    if not self._died_starting(slot, e):
                        self.emit(EventKind.TRAINER_START_FAILED, slot, error_brief(e))
                        raise start_error(slot.index, e) from e
                    if slot.state is SlotState.FAILED:
                        waiting.remove(slot)
                        if _too_few(slots, need):
                            raise start_error(slot.index, e, tries=slot.start_failures) from e
                    continue
                slot.ready_ref = None
                slot.state = SlotState.LIVE
                slot.starts = max(slot.starts, 1)
                if slot.start_failures:   # the trainer that took the place of one that died
                    self.emit(EventKind.TRAINER_JOINED, slot,
                              f"replacement, pid {slot.info.get('pid')}")
                slot.start_failures = 0
                waiting.remove(slot)
            for slot in self._overdue(waiting):
                self._start_timed_out(slot)
                if slot.state is SlotState.FAILED:
                    waiting.remove(slot)
                    if _too_few(slots, need):
                        raise start_timeout_error(slot.index, self.config.start_timeout_s,
                                                  tries=slot.start_failures)
            if len([s for s in slots if s.state is SlotState.LIVE]) >= need:
                # Enough to train: a slot whose trainer died starting joins when it is up.
                waiting = [s for s in waiting if s.start_failures == 0]

    def _reserve_group(self, k: int):
        """A placement group of ``k`` bundles, reserved; or ``UnschedulableError``."""
        cfg = self.config
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # an infeasible group is reported below, as an error
            pg = self.backend.placement_group([self._bundle] * k, cfg.placement_strategy)
        self._groups.append(pg)
        view = self.backend.placement_group_table(pg)
        never = view.get("stats", {}).get("scheduling_state") == "INFEASIBLE"
        if not never and pg.wait(cfg.placement_timeout_s):
            return pg
        need = k * float(cfg.num_cpus)
        free = float(self.backend.available_resources().get("CPU", 0.0))
        total = float(self.backend.cluster_resources().get("CPU", 0.0))
        why = ("the cluster's nodes can never hold them" if never else
               f"they could not all be reserved within {cfg.placement_timeout_s:g} s")
        what = f"workers={k}" if not cfg.elastic else f"workers=({k}, {cfg.workers})"
        raise UnschedulableError(
            f"{what} trainers with num_cpus={cfg.num_cpus} need {need:g} CPUs ({k} "
            f"bundles of {self._bundle}, strategy {cfg.placement_strategy}) to start, but the "
            f"cluster has {free:g} free ({total:g} in all), and {why}. Use fewer workers, "
            "lower num_cpus, free resources, or add nodes with `ddlf-node start --address ...`.")

    def _spare_group(self):
        """A one-bundle group for an elastic slot: pending until some node has room."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # pending is the point: no warning about it
            pg = self.backend.placement_group([self._bundle], "PACK")
        self._groups.append(pg)
        return pg

    def _group_placed(self, pg) -> bool:
        if pg is None:
            return True
        try:
            return self.backend.placement_group_table(pg).get("state") == "CREATED"
        except Exception as e:   # a group the head no longer knows is not placed
            log.debug("placement group %s: %s", pg, e)
            return False


# -- trainers outside a run (the App API keeps its own between runs) ----------------------------
class _Group(list):
    """Trainer handles, with the pool that placed them (``stop_trainers`` frees it)."""

    pool: TrainerPool | None = None

    @property
    def placement_group(self):
        groups = self.pool._groups if self.pool is not None else []
        return groups[0] if groups else None


def start_trainers(model_fn, dataset, config: TrainConfig) -> _Group:
    """Create ``config.workers`` trainer actors, reserved as one placement group, and wait
    until they are built. Raises as :meth:`TrainerPool.start`. Stop them with
    :func:`stop_trainers`."""
    pool = TrainerPool(model_fn, dataset, config, emit=lambda *a: None)
    pool.start()
    group = _Group(s.handle for s in pool.slots)
    group.pool = pool
    return group


def stop_trainers(trainers) -> None:
    """Kill trainers from :func:`start_trainers` and free their placement group."""
    pool = getattr(trainers, "pool", None)
    if pool is not None:
        pool.stop()
        return
    backend = backends.select()
    if not backend.is_initialized():
        return
    for t in trainers or ():
        _quietly("killing trainer %s", t, backend.kill, t)


def describe_trainers(trainers, backend=None) -> list[dict]:
    """Wait until every trainer is built; turn a failed start into a clear error."""
    backend = backend or backends.select()
    infos = []
    for j, t in enumerate(trainers):
        try:
            infos.append(backend.get(t.describe.remote()))
        except ActorDiedError as e:
            raise start_error(j, e) from e
    return infos


def _too_few(slots: list[Slot], need: int) -> bool:
    """Fewer than ``need`` of ``slots`` are not given up: the run cannot start."""
    return len([s for s in slots if s.state is not SlotState.FAILED]) < need


def error_brief(error: BaseException, limit: int = 500) -> str:
    """An event's text for a trainer that could not start: the remote error's type and
    message first, then as much of the traceback as fits. The message must survive the
    cut: a traceback's length varies with the paths and the Python version (a 3.12 run in
    a deeper directory once cut the message off)."""
    text = str(error).strip()
    cause = getattr(error, "cause", None)
    if cause is not None:
        text = f"{type(cause).__name__}: {str(cause).strip()}\n{text}"
    return text[:limit]


def start_timeout_error(slot: int, limit: float, tries: int) -> TrainerStartError:
    """The error for slot ``slot``'s trainer that did not report ready within ``limit``
    seconds, ``tries`` times in a row."""
    return TrainerStartError(
        f"trainer {slot} did not report ready within start_timeout_s={limit:g} s ({tries} "
        "tries in a row), and too few trainers could start without it. Its process neither "
        "finished building the model and loading its data nor died: look for a model_fn or "
        "dataset that blocks (a lock, a network read) in its node's worker log (ddlf logs), "
        "or raise start_timeout_s if building the model really takes longer.",
        slot=slot, tries=tries, died=True)


def start_error(slot: int, error: BaseException, tries: int = 1) -> TrainerStartError:
    """The error for slot ``slot``'s trainer that did not start: ``error`` (an
    ``ActorDiedError``) has a ``cause`` when its ``__init__`` raised; without one its
    process died, ``tries`` times in a row."""
    cause = getattr(error, "cause", None)
    if cause is not None:
        return TrainerStartError(
            f"trainer {slot} failed to start: building the model with model_fn or loading "
            f"the dataset raised (an error in that code, so the run stops rather than try "
            f"again):\n{error}", slot=slot, tries=1, died=False, cause=cause)
    return TrainerStartError(
        f"trainer {slot}'s process died while starting ({tries} tries in a row), and nothing "
        "raised: it was killed (SIGKILL, the OOM killer: are the model and the dataset too "
        "large for the node's memory?) or its node was lost, and too few trainers could "
        f"start without it. The last try: {error}", slot=slot, tries=tries, died=True)
