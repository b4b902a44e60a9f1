"""``TrainerActor``: the paper's worker with training state.

A trainer is a long-lived actor. It builds its model and maps its dataset once, in
``__init__``; after that, each call only carries weights (one shared ``put`` per round)
and a partition of *indices* into the trainer's own copy of the data (the paper's
Algorithm 6: the master shuffles and partitions indices, never the data).

The schemes need only lists of numpy arrays and the methods below. To train with
another framework, subclass and override the hooks (``configure_threads``,
``build_model``, ``get_weights``, ``set_weights``, ``fit``, ``evaluate_arrays``; for
checkpoints of optimizer state ``get_optimizer_state``/``set_optimizer_state``; for
learning-rate schedules ``get_learning_rate``/``set_learning_rate``) and pass
``trainer_cls=`` to ``train``/``train_sync``/``train_async``.

It subclasses the Cluster API's worker, so ``run_method``, ``add_method`` and
``run_code`` work on trainers too: the App API has one set of workers, not two.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

# The ring's actor-to-actor calls (allreduce) are DDLF calls; main's backends route the
# driver's, not these.
import ddlf_actors as ddlf
from ddlf_actors.cluster import ClusterWorker
from ddlf_actors.errors import ActorDiedError

from . import backends, datasets, keras_steps, ring, tf_startup
from .wire import WireMethods

__all__ = ["TrainerActor", "shard_range", "combine_shards", "nbytes"]


def shard_range(n: int, shard: int, num_shards: int) -> tuple[int, int]:
    """The [start, stop) rows of shard ``shard`` when ``n`` rows are split ``num_shards`` ways."""
    return n * shard // num_shards, n * (shard + 1) // num_shards


def combine_shards(num_test: int, results: list) -> tuple[float, float]:
    """``(loss, accuracy)`` on the whole test set from the K shards' ``(loss, accuracy)``,
    each weighted by its shard's size."""
    K = len(results)
    sizes = [hi - lo for lo, hi in (shard_range(num_test, j, K) for j in range(K))]
    total = float(sum(sizes)) or 1.0
    return (float(sum(s * r[0] for s, r in zip(sizes, results)) / total),
            float(sum(s * r[1] for s, r in zip(sizes, results)) / total))


def nbytes(arrays) -> int:
    """Bytes in a list of arrays (weights, deltas): what a transfer of them carries."""
    return int(sum(np.asarray(a).nbytes for a in arrays))


def _node_id() -> str | None:
    """This trainer's node, as its runtime (DDLF or Ray) names it; None outside a worker."""
    return backends.here().node_id()


class TrainerActor(ClusterWorker, WireMethods):
    """Holds a model built by ``model_fn()`` and a dataset loaded once.

    ``dataset`` is a registered name (``"fashion-mnist"``), a callable returning
    ``((x, y), (x_test, y_test))``, or a :func:`datasets.partitioned` directory, of
    which trainer ``index`` loads only partition ``index``. Trainers on one node share
    one read-only copy of the arrays (a memory-mapped cache file).
    """

    def __init__(self, model_fn, dataset, index: int = 0, num_cpus: float = 1):
        super().__init__(index)
        self.num_cpus = num_cpus
        self.partitioned = isinstance(dataset, datasets.PartitionedDataset)
        # Data first: a missing dataset fails before TensorFlow's slow start-up.
        (self.x, self.y), (self.x_test, self.y_test) = self.load_data(dataset, index)
        # Before anything can build a TF op: thread pools are fixed at first use.
        self.configure_threads(max(1, int(num_cpus or 1)))
        self.model = self.build_model(model_fn)
        self._last_call_end: float | None = None
        self._eval_s = 0.0  # evaluation time since the last train call, reported by train
        self._accumulated: dict | None = None   # Downpour: the update not pushed yet
        # Allreduce (schemes/allreduce.py): this round's delta, kept here, and the chunks
        # the ring neighbours send.
        self._held: tuple | None = None
        self._mailbox = ring.Mailbox()
        # The outer optimizer's velocity (outer_momentum), a copy on every trainer: each
        # applies the same step to the same mean, so the copies stay equal.
        self._velocity: list | None = None
        self._ring_sends: list = []

    # -- hooks: override these for another framework ----------------------------------------
    def configure_threads(self, n: int) -> None:
        """Give TensorFlow ``n`` intra-op threads and 1 inter-op thread (before TF starts)."""
        os.environ["OMP_NUM_THREADS"] = str(n)
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(n)
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
        # Quietly: TF's start-up lines would reach the driver's terminal (tf_startup.py).
        tf = tf_startup.import_tensorflow()

        try:
            tf.config.threading.set_intra_op_parallelism_threads(n)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TF already ran an op in this process: keep its pools
            pass

    def load_data(self, dataset, index: int):
        """Return ``((x, y), (x_test, y_test))``, shared read-only with this node's trainers."""
        if isinstance(dataset, datasets.PartitionedDataset):
            if index >= dataset.num_partitions:
                raise ValueError(f"trainer {index} has no partition: {dataset!r} holds "
                                 f"{dataset.num_partitions}; use at most that many workers")
            return datasets.load_shared(dataset.partition(index))
        return datasets.load_shared(dataset)

    def build_model(self, model_fn):
        return model_fn()

    def get_weights(self) -> list:
        """The current weights, as a list of numpy arrays."""
        return [np.asarray(w) for w in self.model.get_weights()]

    def set_weights(self, weights) -> None:
        self.model.set_weights(weights)

    def fit(self, x, y, epochs: int, batch_size: int) -> float:
        """Train in place on ``x, y``; return the mean training loss of the last epoch.

        The same steps as ``model.fit(x, y, epochs, batch_size, shuffle=False)`` (the
        driver already shuffled the indices, Algorithm 6), run as one compiled loop per
        epoch (``keras_steps.fit_steps``): ``fit`` costs about 0.2 s per call in set-up on
        one thread, which rounds of a few dozen steps would pay every round, and one
        ``train_on_batch`` per batch pays Python per step (measured,
        ``benchmarks/explore_defaults.py profile``)."""
        return keras_steps.fit_steps(self.model, x, y, epochs, batch_size)

    def get_optimizer_state(self) -> list | None:
        """The optimizer's variables (step count, momentum, Adam slots) as numpy arrays, or
        None for a model without an optimizer or one that has not run yet."""
        opt = getattr(self.model, "optimizer", None)
        variables = list(getattr(opt, "variables", None) or ())
        if not variables:
            return None
        return [np.array(v.numpy() if hasattr(v, "numpy") else v) for v in variables]

    def set_optimizer_state(self, state) -> None:
        """Load what :meth:`get_optimizer_state` returned (from a checkpoint, or from the
        trainer this one replaces). Raises ``ValueError`` if it does not fit."""
        opt = self.model.optimizer
        if not getattr(opt, "built", True):
            opt.build(self.model.trainable_variables)   # Keras creates slots lazily
        variables = list(opt.variables)
        if len(variables) != len(state) or any(tuple(v.shape) != np.shape(a)
                                               for v, a in zip(variables, state)):
            raise ValueError(f"optimizer state of {len(state)} arrays does not fit this "
                             f"model's optimizer ({len(variables)} variables)")
        for v, a in zip(variables, state):
            v.assign(a)

    def get_learning_rate(self) -> float | None:
        """The optimizer's learning rate now, or None if it has no settable one."""
        opt = getattr(self.model, "optimizer", None)
        rate = getattr(opt, "learning_rate", None)
        if rate is None:
            return None
        try:
            return float(np.asarray(rate))
        except (TypeError, ValueError):
            return None

    def set_learning_rate(self, rate: float) -> None:
        """Set the optimizer's learning rate (the driver's schedule, once per round).

        Raises ``TypeError`` when the model was compiled with a schedule of its own: one
        schedule has to give way, and the run's is the one that sees every trainer.
        """
        opt = self.model.optimizer
        try:
            opt.learning_rate = float(rate)   # a variable's assign: no retracing
        except TypeError as e:
            raise TypeError(
                "this model's optimizer was built with a LearningRateSchedule, so the run's "
                "lr_schedule/lr_scaling cannot set its rate: compile the model with a number "
                "as learning_rate and pass the schedule as lr_schedule= instead") from e

    def evaluate_arrays(self, x, y, batch_size: int = 512) -> tuple[float, float]:
        """Return ``(loss, accuracy)`` of the current model on ``x, y``."""
        out = self.model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
        acc = out.get("accuracy", out.get("sparse_categorical_accuracy"))
        if acc is None:  # the model was compiled without an accuracy metric
            pred = self.model.predict(x, batch_size=batch_size, verbose=0)
            acc = float(np.mean(np.argmax(pred, axis=-1) == np.asarray(y)))
        return float(out["loss"]), float(acc)

    # -- the remote API ----------------------------------------------------------------------
    def describe(self) -> dict:
        """Sizes the driver needs to partition indices and shard the test set, and what a
        checkpoint compares: the weights' shapes and dtypes."""
        weights = self.get_weights()
        return {"index": self._ddlf_index, "pid": os.getpid(), "num_train": int(len(self.x)),
                "partitioned": self.partitioned, "node": _node_id(),
                "num_test": 0 if self.x_test is None else int(len(self.x_test)),
                "weights_bytes": nbytes(weights),
                "weights": [[list(np.shape(w)), np.asarray(w).dtype.str] for w in weights],
                "learning_rate": self.get_learning_rate()}

    def train(self, weights, indices, epochs: int, batch_size: int, return_state: bool = False,
              learning_rate: float | None = None):
        """Train from ``weights`` (None: the current ones) on rows ``indices`` of this
        trainer's data, at ``learning_rate`` if given (it stays set). Return
        ``(delta, stats)``: delta is old − new weights; stats holds ``compute_s``,
        ``idle_s`` (since this trainer's previous call ended), ``samples`` and ``loss``,
        and with ``return_state`` the optimizer's state afterwards (what a checkpoint
        keeps)."""
        start = time.perf_counter()
        old, new, loss, samples = self._run(weights, indices, epochs, batch_size, learning_rate)
        delta = [o - n for o, n in zip(old, new)]
        return delta, self._stats(start, samples, loss, return_state)

    def run_steps(self, weights, indices, epochs: int, batch_size: int, push: bool,
                  fresh: bool = False, return_state: bool = False,
                  learning_rate: float | None = None):
        """Downpour's trainer side: train from ``weights`` (a fetch; None: carry on from
        this trainer's own weights) on rows ``indices``, adding the change to an
        accumulated update. With ``push``, return ``(update, stats)`` and start a new
        accumulation: ``update`` is old − new summed over every call since the last push,
        ``stats["samples"]`` and ``stats["loss"]`` cover those calls. Without, return
        ``(None, stats)`` with ``samples`` 0. ``fresh`` drops an accumulation left from
        another run. ``stats["trained"]`` is this call's own samples."""
        start = time.perf_counter()
        if fresh:
            self._accumulated = None
        acc = self._accumulated or {"update": None, "samples": 0, "loss": 0.0}
        if len(indices):
            old, new, loss, samples = self._run(weights, indices, epochs, batch_size,
                                                learning_rate)
            change = [o - n for o, n in zip(old, new)]
            acc["update"] = change if acc["update"] is None else [
                a + c for a, c in zip(acc["update"], change)]
            acc["samples"] += samples
            acc["loss"] += loss * samples
        elif weights is not None:
            self.set_weights(weights)
        trained = int(len(indices))
        if not push:
            self._accumulated = acc
            stats = self._stats(start, 0, 0.0, return_state)
            stats["trained"] = trained
            return None, stats
        self._accumulated = None
        update = acc["update"]
        if update is None:   # nothing trained since the last push
            update = [np.zeros_like(w) for w in self.get_weights()]
        stats = self._stats(start, acc["samples"],
                            acc["loss"] / acc["samples"] if acc["samples"] else 0.0, return_state)
        stats["trained"] = trained
        return update, stats

    def _run(self, weights, indices, epochs, batch_size, learning_rate):
        """Train on ``indices``: ``(weights before, weights after, loss, samples)``."""
        if learning_rate is not None:
            self.set_learning_rate(learning_rate)
        if weights is not None:
            self.set_weights(weights)
        old = self.get_weights()
        idx = np.asarray(indices)
        # Sorted gathers from a memory map read pages in order; the order of samples
        # inside the partition is restored by the permutation, so SGD sees it shuffled.
        x, y = self.x[idx], self.y[idx]
        loss = self.fit(x, y, int(epochs), int(batch_size))
        return old, self.get_weights(), loss, int(len(idx))

    def _stats(self, start: float, samples: int, loss: float, return_state: bool) -> dict:
        """A call's stats, ending now; its idle time runs from the previous call's end."""
        idle = 0.0 if self._last_call_end is None else start - self._last_call_end
        end = time.perf_counter()
        self._last_call_end = end
        eval_s, self._eval_s = self._eval_s, 0.0
        stats: dict[str, Any] = {"compute_s": end - start, "idle_s": idle, "eval_s": eval_s,
                                 "samples": samples, "loss": loss, "index": self._ddlf_index}
        if return_state:
            stats["optimizer_state"] = self.get_optimizer_state()
        return stats

    def evaluate(self, weights=None, shard=None):
        """``(loss, accuracy)`` of ``weights`` (None: the current ones) on the test set,
        or on its ``shard = (k, K)`` part. The current weights are left unchanged."""
        start = time.perf_counter()
        current = None
        if weights is not None:
            current = self.get_weights()
            self.set_weights(weights)
        x, y = self.x_test, self.y_test
        if x is None:
            raise ValueError("this trainer's dataset has no test set to evaluate on")
        if shard is not None:
            lo, hi = shard_range(len(x), *shard)
            x, y = x[lo:hi], y[lo:hi]
        try:
            result = self.evaluate_arrays(x, y) if len(x) else (0.0, 0.0)
        finally:
            if current is not None:
                self.set_weights(current)
        spent = time.perf_counter() - start
        self._eval_s += spent
        if self._last_call_end is not None:
            # Evaluation is work, not waiting: keep it out of the next call's idle time.
            self._last_call_end += spent
        return result

    # -- allreduce: the trainers average their deltas among themselves ----------------------
    # The driver sends indices and control only; the weights stay here (schemes/allreduce.py,
    # ring.py). A round is hold_delta on every trainer, then allreduce_held on every trainer.
    def hold_delta(self, key, indices, epochs: int, batch_size: int,
                   return_state: bool = False, learning_rate: float | None = None):
        """Train on rows ``indices`` from the current weights (at ``learning_rate`` if
        given, as :meth:`train`) and keep the delta here for :meth:`allreduce_held`, under
        ``key`` (``(run, round)``); return only the stats (as :meth:`train` does).

        The model is left holding the weights the round started from, so an evaluation
        queued behind this call sees them, and a collective that has to be redone starts
        again from the same place.
        """
        old = self.get_weights()
        delta, stats = self.train(None, indices, epochs, batch_size, return_state,
                                  learning_rate)
        self.set_weights(old)
        # The velocity the round starts from too: a redone collective starts again there.
        self._held = (tuple(key), old, delta, self._velocity)
        return stats

    def allreduce_held(self, tag, rank: int, size: int, right, fraction: float,
                       timeout_s: float, outer: dict | None = None) -> dict:
        """Average the held delta with the ring's, each scaled by its ``fraction`` of the
        samples, and apply the mean to the round's starting weights: plainly, or with
        ``outer = {"rate", "momentum", "nesterov"}`` as the driver's outer optimizer
        would (``schemes/outer.py``), on this trainer's copy of the velocity.

        ``tag`` is ``(run, round, attempt)``; this trainer is member ``rank`` of ``size``
        and sends to ``right`` (a handle). Returns ``{"status": "done", "digest": CRC of the new
        weights, ...}``; or, with the weights left unchanged, ``"aborted"`` (the driver
        called it off), ``"peer_lost"`` (the right neighbour died) or ``"timeout"`` (no
        chunk from the left for ``timeout_s``). Raises ``RuntimeError`` if no delta of that
        run and round is held (the driver's bug, not a fault).
        """
        start = time.perf_counter()
        tag = tuple(int(t) for t in tag)
        if self._held is None or self._held[0] != tag[:2]:
            held = None if self._held is None else self._held[0]
            raise RuntimeError(f"allreduce {tag} on trainer {self._ddlf_index}, which holds "
                               f"the delta of (run, round) {held}")
        _, old, delta, velocity = self._held
        box = self._mailbox
        box.begin(tag)
        self._ring_sends = sends = []

        def send(phase, step, chunk):
            sends.append(self.ring_send(right, tag, phase, step, chunk))

        def check():
            # A send that failed means the right neighbour is gone: stop waiting now
            # rather than when the driver's abort arrives.
            if not sends:
                return
            ready, _ = ddlf.wait(list(sends), num_returns=len(sends), timeout=0)
            for ref in ready:
                sends.remove(ref)
                try:
                    ddlf.get(ref)
                except ActorDiedError as e:
                    raise ring.PeerLost(str(e).strip().splitlines()[0]) from None

        def recv(phase, step):
            return box.take(tag, phase, step, timeout_s, check)

        vectors, spec = ring.scaled_vectors(delta, fraction)
        reply = {"index": self._ddlf_index, "sent_bytes": ring.ring_send_bytes(vectors, rank, size)}
        try:
            summed = ring.ring_allreduce(vectors, rank, size, send, recv)
        except ring.CollectiveAborted as e:
            return {**reply, "status": "aborted", "detail": str(e)}
        except ring.PeerLost as e:
            return {**reply, "status": "peer_lost", "detail": str(e)}
        except ring.CollectiveTimeout as e:
            return {**reply, "status": "timeout", "detail": str(e)}
        from .schemes.averaging import apply_delta  # not at import: schemes imports us
        from .schemes.outer import momentum_update

        mean = ring.unflatten(summed, spec)
        if outer is None:
            self.set_weights(apply_delta(old, mean))
        else:
            if outer["momentum"]:
                velocity, mean = momentum_update(velocity, mean, outer["momentum"],
                                                 outer["nesterov"])
            self.set_weights(apply_delta(old, mean, outer["rate"]))
            self._velocity = velocity
        spent = time.perf_counter() - start
        if self._last_call_end is not None:
            self._last_call_end += spent   # the collective is work, not idle time
        return {**reply, "status": "done", "digest": self.held_digest(),
                "collective_s": spent}

    def ring_send(self, right, tag, phase: str, step: int, chunk):
        """Send one chunk to the right neighbour; return the call's ref (a hook: the
        tests' fault injection overrides it)."""
        return right.deliver_chunk.remote(tag, phase, step, chunk)

    async def deliver_chunk(self, tag, phase: str, step: int, chunk) -> None:
        """A chunk from the left neighbour. ``async``: it runs on the event loop, so it
        arrives while the execution thread is inside :meth:`allreduce_held`."""
        self._mailbox.deliver(tag, phase, step, chunk)

    async def abort_collective(self, tag, reason: str) -> None:
        """The driver calls collective ``tag`` off (a member was lost); the member stops
        waiting and returns ``"aborted"`` with its weights unchanged."""
        self._mailbox.abort(tag, reason)

    def adopt_weights(self, source) -> dict:
        """Copy the current weights from the live trainer ``source`` (a handle), straight
        from it, not through the driver: how a replacement joins an allreduce run.

        Returns ``{"status": "done", "digest": ..., "bytes": ...}``, or ``{"status":
        "source_lost"}`` when ``source`` died first (the driver picks another).
        """
        try:
            weights = ddlf.get(source.get_weights.remote())
            self._velocity = ddlf.get(source.get_outer_velocity.remote())
        except ActorDiedError as e:
            return {"status": "source_lost", "detail": str(e).strip().splitlines()[0]}
        self.set_weights(weights)
        return {"status": "done", "digest": self.held_digest(),
                "bytes": nbytes(weights)}

    def held_digest(self) -> int:
        """A CRC of the weights and the outer velocity this trainer holds: the driver checks
        that every member of an allreduce run holds the same."""
        return ring.weights_digest(list(self.get_weights()) + list(self._velocity or []))

    def get_outer_velocity(self) -> list | None:
        """This trainer's copy of the outer optimizer's velocity (None before any
        momentum step): what an allreduce checkpoint keeps and a replacement copies."""
        return self._velocity

    def set_outer_velocity(self, velocity) -> None:
        """Start from ``velocity`` (a resumed allreduce run's, or None)."""
        self._velocity = None if velocity is None else [np.array(v, copy=True)
                                                        for v in velocity]

    @classmethod
    def local_model(cls, model_fn, weights):
        """A model in the calling process holding ``weights`` (what ``result.model`` is)."""
        with tf_startup.quiet_startup():   # the driver's first TF import, if it is one
            model = model_fn()
        model.set_weights(weights)
        return model
