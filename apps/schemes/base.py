"""What both schemes share: placing trainers, evaluation, history rows, byte counts.

The schemes differ only in how they hand out work and apply deltas; everything that
watches a run (history, progress bar, early stop, CSV) is a callback.

Evaluation never runs on the driver while trainers wait. The test set is split into K
shards and trainer j evaluates shard j of the weights being reported, queued on the
trainer right before its next ``train`` call (which uses the same ``put`` of the
weights, so nothing extra is shipped). A row is therefore complete once the next
round's evaluation is back; the last weights get one sharded evaluation at the end.
The cost is the trainers' time on a 1/K test shard per evaluation, reported per row
as ``eval_s``.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

import ddlf_actors as ddlf
from ddlf_actors.errors import DDLFError, UnschedulableError
from ddlf_actors.util import (
    PlacementGroupSchedulingStrategy,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from .. import datasets
from ..callbacks import EarlyStopping, History, ProgressBar
from ..config import TrainConfig
from ..result import TrainResult
from ..trainer import TrainerActor, combine_shards, nbytes

__all__ = ["Scheme", "TrainerStartError", "check_dataset", "start_trainers", "stop_trainers",
           "describe_trainers", "config_from_call", "TrainerGroup"]


class TrainerStartError(DDLFError):
    """A trainer could not build its model or load its dataset."""


def check_dataset(dataset) -> None:
    """Fail on the driver, before any trainer starts, for a dataset that cannot work."""
    if isinstance(dataset, str):
        if dataset not in datasets.names():
            raise ValueError(f"unknown dataset {dataset!r}: known names are "
                             f"{sorted(datasets.names())}; or pass a callable returning "
                             "((x, y), (x_test, y_test)), or datasets.partitioned(path)")
    elif isinstance(dataset, datasets.PartitionedDataset):
        dataset.num_partitions  # noqa: B018 - raises FileNotFoundError for a bad path
    elif not callable(dataset):
        raise TypeError(f"dataset must be a registered name, a callable or "
                        f"datasets.partitioned(path), got {type(dataset).__name__}")


def config_from_call(arguments: dict) -> TrainConfig:
    """The ``TrainConfig`` of a ``train_sync``/``train_async`` call, from its ``locals()``."""
    kw = {k: v for k, v in arguments.items()
          if k not in ("model_fn", "dataset", "trainers", "initial_weights")}
    if arguments.get("trainers"):
        kw["workers"] = len(arguments["trainers"])
    kw["callbacks"] = list(kw.get("callbacks") or ())
    kw["trainer_options"] = dict(kw.get("trainer_options") or {})
    return TrainConfig(**kw)


def _ensure_session() -> bool:
    """``ddlf.init()`` an embedded cluster if none is connected; True if we started it."""
    if ddlf.is_initialized():
        return False
    ddlf.init()
    return True


class TrainerGroup(list):
    """The trainers of a run, and the placement group that reserved their resources."""

    placement_group = None


def start_trainers(model_fn, dataset, config: TrainConfig) -> TrainerGroup:
    """Create ``config.workers`` trainer actors with ``num_cpus`` each.

    Their resources are reserved first, all together, as a placement group of one bundle
    per trainer (``config.placement_strategy``), so a run never starts half-placed. Raises
    ``UnschedulableError`` naming the demand at once when the cluster can never hold the
    group, and after ``config.placement_timeout_s`` when it could but has no room.
    Stop them with :func:`stop_trainers`, which also frees the group.
    """
    check_dataset(dataset)
    cls = config.trainer_cls or TrainerActor
    if isinstance(dataset, datasets.PartitionedDataset) and dataset.num_partitions < config.workers:
        raise ValueError(f"{dataset!r} has {dataset.num_partitions} partitions for "
                         f"{config.workers} workers: each trainer loads its own partition")
    options = dict(config.trainer_options)
    actor_cls = ddlf.remote(num_cpus=config.num_cpus, **options)(cls)
    bundle = {"CPU": float(config.num_cpus), **(options.get("resources") or {})}
    bundle = {k: float(v) for k, v in bundle.items() if v}
    trainers = TrainerGroup()
    if not bundle or "scheduling_strategy" in options or "node_id" in options:
        # Nothing to reserve, or the caller placed the trainers itself.
        trainers.extend(actor_cls.remote(model_fn, dataset, j, config.num_cpus)
                        for j in range(config.workers))
        return trainers
    pg = _reserve(bundle, config)
    trainers.placement_group = pg
    try:
        for j in range(config.workers):
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=j)
            trainers.append(actor_cls.options(scheduling_strategy=strategy).remote(
                model_fn, dataset, j, config.num_cpus))
    except BaseException:
        stop_trainers(trainers)
        raise
    return trainers


def _reserve(bundle: dict, config: TrainConfig):
    """A placement group of ``config.workers`` bundles, reserved; or UnschedulableError."""
    K = config.workers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # an infeasible group is reported below, as an error
        pg = placement_group([bundle] * K, strategy=config.placement_strategy)
    try:
        view = placement_group_table(pg)
        never = view.get("stats", {}).get("scheduling_state") == "INFEASIBLE"
        if not never and pg.wait(config.placement_timeout_s):
            return pg
    except BaseException:
        remove_placement_group(pg)
        raise
    remove_placement_group(pg)
    need = K * float(config.num_cpus)
    free = float(ddlf.available_resources().get("CPU", 0.0))
    total = float(ddlf.cluster_resources().get("CPU", 0.0))
    why = ("the cluster's nodes can never hold them" if never else
           f"they could not all be reserved within {config.placement_timeout_s:g} s")
    raise UnschedulableError(
        f"workers={K} trainers with num_cpus={config.num_cpus} need {need:g} CPUs ({K} "
        f"bundles of {bundle}, strategy {config.placement_strategy}), but the cluster has "
        f"{free:g} free ({total:g} in all), and {why}. Use fewer workers, lower num_cpus, "
        "free resources, or add nodes with `ddlf-node start --address ...`.")


def stop_trainers(trainers) -> None:
    """Kill the trainers and free their placement group (a no-op once the session is gone)."""
    if not ddlf.is_initialized():
        return   # their cluster is gone with them; do not start a new one to kill them
    for t in trainers or ():
        try:
            ddlf.kill(t)
        except Exception:  # the session may already be gone
            pass
    pg = getattr(trainers, "placement_group", None)
    if pg is not None:
        try:
            remove_placement_group(pg)
        except Exception:
            pass


def describe_trainers(trainers) -> list[dict]:
    """Wait until every trainer is built; turn a failed ``__init__`` into a clear error."""
    infos = []
    for j, t in enumerate(trainers):
        try:
            infos.append(ddlf.get(t.describe.remote()))
        except ddlf.errors.ActorDiedError as e:
            raise TrainerStartError(
                f"trainer {j} failed to start (building the model with model_fn or loading "
                f"the dataset raised):\n{e}") from e
    return infos


class Run:
    """The state callbacks see."""

    def __init__(self, scheme: str, config: TrainConfig, total_rows: int):
        self.scheme = scheme
        self.config = config
        self.total_rows = total_rows
        self.stop = False


class Scheme:
    """One training run: start or adopt trainers, run the loop, return a ``TrainResult``."""

    name = "scheme"

    def __init__(self, model_fn, dataset, config: TrainConfig, trainers=None):
        self.model_fn = model_fn
        self.dataset = dataset
        self.config = config
        self.trainer_cls = config.trainer_cls or TrainerActor
        self._own_trainers = trainers is None
        self.trainers = trainers
        self.K = config.workers if trainers is None else len(trainers)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.history = History()
        self.early = EarlyStopping(config.target_accuracy, config.patience)
        callbacks = [self.history, self.early, *config.callbacks]
        if config.progress:
            callbacks.append(ProgressBar())
        self.callbacks = callbacks
        self.run_state: Run | None = None
        self.t0 = 0.0

    # -- the run -----------------------------------------------------------------------------
    def run(self, initial_weights=None) -> TrainResult:
        started_session = _ensure_session()
        t_start = time.perf_counter()
        try:
            if self.trainers is None:
                self.trainers = start_trainers(self.model_fn, self.dataset, self.config)
            self.infos = describe_trainers(self.trainers)
            self.num_test = self.infos[0]["num_test"]
            weights = initial_weights
            if weights is None:
                weights = ddlf.get(self.trainers[0].get_weights.remote())
                self.bytes_received += nbytes(weights)
            startup = time.perf_counter() - t_start
            self.run_state = Run(self.name, self.config, self.total_rows())
            for cb in self.callbacks:
                cb.on_train_begin(self.run_state)
            self.t0 = time.perf_counter()
            result = None
            try:
                weights = self.loop([np.array(w, copy=True) for w in weights])
                result = TrainResult(
                    scheme=self.name, history=self.history.rows, weights=weights,
                    config=self.config, model_fn=self.model_fn, trainer_cls=self.trainer_cls,
                    updates=getattr(self, "updates", []), stopped_early=self.early.reason,
                    startup_s=startup)
            finally:
                for cb in self.callbacks:
                    cb.on_train_end(result)
            return result
        finally:
            if self._own_trainers and self.trainers:
                stop_trainers(self.trainers)
            if started_session:
                ddlf.shutdown()

    def loop(self, weights: list) -> list:
        raise NotImplementedError

    def total_rows(self) -> int:
        raise NotImplementedError

    # -- pieces the loops share --------------------------------------------------------------
    def put_weights(self, weights: list):
        """One ``put`` per version: each trainer's connection carries it once."""
        return ddlf.put(weights)

    def submit_eval(self, trainer_index: int, weights_ref):
        """Queue trainer j's shard of the evaluation of ``weights_ref``; None without a test set."""
        if not self.num_test:
            return None
        return self.trainers[trainer_index].evaluate.remote(weights_ref, (trainer_index, self.K))

    def finish_row(self, row: dict, evals: list) -> None:
        """Combine the shard results into test loss/accuracy and hand the row to callbacks."""
        if evals and all(e is not None for e in evals):
            row["test_loss"], row["test_accuracy"] = combine_shards(self.num_test, evals)
        for cb in self.callbacks:
            cb.on_row(row, self.run_state)

    def new_row(self, round_no: int, epoch: float, stats: list, wall_s: float) -> dict:
        """A history row from the trainers' stats of one round (or one async epoch)."""
        samples = sum(s["samples"] for s in stats)
        loss = (sum(s["loss"] * s["samples"] for s in stats) / samples) if samples else None
        per_trainer: dict = {}
        busy: dict = {}
        for s in stats:
            per_trainer[s["index"]] = per_trainer.get(s["index"], 0.0) + s["compute_s"]
            busy[s["index"]] = busy.get(s["index"], 0.0) + s["compute_s"] + s.get("eval_s", 0.0)
        row = {
            "round": round_no, "epoch": epoch, "time_s": time.perf_counter() - self.t0,
            "test_accuracy": None, "test_loss": None, "train_loss": loss,
            "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
            "compute_s": max(per_trainer.values()) if per_trainer else 0.0,
            "idle_s": sum(s["idle_s"] for s in stats),
            "eval_s": max((s.get("eval_s", 0.0) for s in stats), default=0.0),
            # What the framework adds: round time beyond the busiest trainer's work.
            "overhead_s": wall_s - max(busy.values(), default=0.0),
            "wall_s": wall_s, "samples": samples,
            "samples_per_s": samples / wall_s if wall_s > 0 else None, "updates": len(stats),
        }
        self.bytes_sent = self.bytes_received = 0
        return row


def partition_indices(rng, infos: list, K: int, pieces: int) -> list[list[np.ndarray]]:
    """Shuffle and split indices for one epoch: ``out[j][r]`` is trainer j's r-th piece.

    With one shared dataset, the driver shuffles all N indices and gives each trainer a
    1/K share (the paper's Algorithm 6). With a partitioned dataset, each trainer's
    indices point into its own partition.
    """
    out = []
    if not infos[0].get("partitioned"):
        n = infos[0]["num_train"]
        perm = rng.permutation(n).astype(np.int32)
        for share in np.array_split(perm, K):
            out.append(np.array_split(share, pieces))
    else:
        for info in infos:
            perm = rng.permutation(info["num_train"]).astype(np.int32)
            out.append(np.array_split(perm, pieces))
    return out
