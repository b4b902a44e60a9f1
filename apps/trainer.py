"""``TrainerActor``: the paper's worker with training state.

A trainer is a long-lived actor. It builds its model and maps its dataset once, in
``__init__``; after that, each call only carries weights (one shared ``put`` per round)
and a partition of *indices* into the trainer's own copy of the data (the paper's
Algorithm 6: the master shuffles and partitions indices, never the data).

This is the core every scheme shares: the data and its partitions, the stats of each
call, the test-set shards. What it does with the model goes through a framework adapter
(``frameworks/``: Keras, PyTorch, ...), picked by the type of the model ``model_fn``
returns. The trainer side of a scheme lives in that scheme's module (allreduce's ring,
Downpour's accumulated pushes) and is mixed in here; codecs' side is ``weight_messages.py``'s.

To train another framework, register an adapter (``frameworks/base.py``). The first way
still works too: subclass, override the hooks :class:`TrainerActor` lists (the README and
``docs/training.md`` list the same) and pass ``trainer_cls=`` to
``train``/``train_sync``/``train_async``: by default each hook calls the adapter.

It subclasses the Cluster API's worker, so ``run_method``, ``add_method`` and
``run_code`` work on trainers too: the App API has one set of workers, not two.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, ClassVar

import numpy as np

from ddlf_actors.cluster import ClusterWorker

from . import backends, datasets, frameworks, tf_startup
from .arrays import combine_shards, nbytes, shard_range
from .frameworks import FrameworkAdapter, UnknownFrameworkError, torch_imports
from .frameworks.heap import keep_freed_memory
from .frameworks.threads import limit_threads
from .schemes import initial_weights
from .schemes.allreduce import AllreduceTrainer
from .schemes.downpour import DownpourTrainer
from .schemes.dp_trainer import DataParallelTrainer
from .schemes.probe import ProbeTrainer
from .weight_messages import WireMethods

__all__ = ["TrainerActor", "shard_range", "combine_shards", "nbytes"]


def _node_id() -> str | None:
    """This trainer's node, as its runtime (DDLF or Ray) names it; None outside a worker."""
    return backends.here().node_id()


class TrainerActor(ClusterWorker, WireMethods, AllreduceTrainer, DownpourTrainer, ProbeTrainer,
                   DataParallelTrainer):
    """Holds a model built by ``model_fn()`` and a dataset loaded once.

    ``dataset`` is a registered name (``"fashion-mnist"``), a callable returning
    ``((x, y), (x_test, y_test))``, or a :func:`datasets.partitioned` directory, of
    which trainer ``index`` loads only partition ``index``. Trainers on one node share
    one read-only copy of the arrays (a memory-mapped cache file). ``framework_options``
    go to the adapter (PyTorch's ``optimizer=`` and ``loss=``), except two the trainer
    reads itself before anything imports a framework: ``keras_backend`` (Keras 3's
    backend: ``KERAS_BACKEND``, which Keras reads once, at its first import) and
    ``num_gpus`` (0 or absent: GPUs are hidden, ``tf_startup.hide_gpus_unless_requested``).

    A subclass trains a framework no adapter holds by overriding the hooks; by default
    each calls the adapter. Required hooks: ``fit``, ``get_weights``, ``set_weights``,
    ``evaluate_arrays``. Optional hooks, and what each does without an adapter:
    ``configure_threads`` (the BLAS/OpenMP thread variables), ``build_model``
    (``model_fn()``, kept as ``self.model``; return None to keep the model in your own
    attributes), ``get_learning_rate``/``set_learning_rate`` (no rate: ``lr_schedule=``
    and ``lr_scaling="inner"`` are refused when the run starts),
    ``get_optimizer_state``/``set_optimizer_state`` (no state: checkpoints hold none, and a
    resume says so once), ``buffer_mask`` (no buffers), ``local_model`` (``result.model``
    raises, naming ``result.weights``), ``compute_gradients``/``apply_gradients`` (none:
    ``scheme="dataparallel"`` is refused when the run starts, naming them, and
    ``scheme="auto"`` keeps each trainer's batch), ``step_schedule`` (``"none"``).
    """

    #: The framework adapter; None: the one whose framework the built model belongs to.
    adapter_cls: ClassVar[type[FrameworkAdapter] | None] = None

    def __init__(self, model_fn, dataset, index: int = 0, num_cpus: float = 1,
                 framework_options: dict | None = None):
        super().__init__(index)
        self.num_cpus = num_cpus
        options = dict(framework_options or {})
        # Before any framework is imported: which GPUs it may see, and Keras' backend.
        tf_startup.hide_gpus_unless_requested(options.pop("num_gpus", 0) or 0)
        self.keras_backend = options.pop("keras_backend", None)
        if self.keras_backend:
            use_keras_backend(self.keras_backend)
        # A step's freed tensors kept for the next step, not unmapped (frameworks/heap.py).
        keep_freed_memory()
        # Before model_fn: a later `import triton` (torch's first optimizer, Keras on torch)
        # must not crash where TensorFlow came first (frameworks/torch_imports.py).
        torch_imports.install()
        self.partitioned = isinstance(dataset, datasets.PartitionedDataset)
        # Data first: a missing dataset fails before a framework's slow start-up.
        (self.x, self.y), (self.x_test, self.y_test) = self.load_data(dataset, index)
        threads = max(1, int(num_cpus or 1))
        # Before anything can build an op: thread pools are fixed at first use.
        self.configure_threads(threads)
        with tf_startup.quiet_startup():   # a model_fn that imports TF: its lines hidden
            self.model = self.build_model(model_fn)
        self.adapter: FrameworkAdapter | None = None
        self._no_adapter = ""
        cls = self.adapter_cls
        if cls is None:
            try:
                cls = frameworks.for_model(self.model)
            except UnknownFrameworkError as e:   # a subclass may implement the hooks itself
                self._no_adapter = str(e)
        if cls is not None:
            self.adapter = cls(self.model, options)
        self._last_call_end: float | None = None
        self._eval_s = 0.0  # evaluation time since the last train call, reported by train

    # -- hooks: each calls the adapter; override them to train without one ------------------------
    # Required without an adapter: get_weights, set_weights, fit, evaluate_arrays. Every
    # other hook has a default that needs none (the class docstring lists them).
    def _framework(self, hook: str) -> FrameworkAdapter:
        if self.adapter is None:
            raise UnknownFrameworkError(
                f"{type(self).__name__}.{hook} is not overridden and no framework adapter "
                f"holds the model ({self._no_adapter}). A TrainerActor subclass that trains "
                "without an adapter must override get_weights, set_weights, fit and "
                "evaluate_arrays")
        return self.adapter

    def configure_threads(self, n: int) -> None:
        """``n`` intra-op threads and 1 inter-op thread for whichever framework the model
        turns out to use, before it runs an op (``frameworks/threads.py``)."""
        limit_threads(n)
        if self.adapter_cls is not None:
            self.adapter_cls.configure_threads(n)

    def load_data(self, dataset, index: int):
        """Return ``((x, y), (x_test, y_test))``, shared read-only with this node's trainers."""
        if isinstance(dataset, datasets.PartitionedDataset):
            if index >= dataset.num_partitions:
                raise ValueError(f"trainer {index} has no partition: {dataset!r} holds "
                                 f"{dataset.num_partitions}; use at most that many workers")
            return datasets.load_shared(dataset.partition(index))
        return datasets.load_shared(dataset)

    def build_model(self, model_fn):
        """The model, kept as ``self.model``: ``model_fn()``."""
        return model_fn()

    def get_weights(self) -> list:
        """The current weights, as a list of numpy arrays."""
        return self._framework("get_weights").get_weights()

    def set_weights(self, weights) -> None:
        self._framework("set_weights").set_weights(weights)

    def buffer_mask(self) -> list[bool]:
        """Which arrays of :meth:`get_weights` are buffers (values the model sets itself,
        such as BatchNorm's running statistics), which the schemes average as values.
        Without an adapter: none."""
        if self.adapter is None:
            return [False] * len(self.get_weights())
        return self.adapter.buffer_mask()

    def fit(self, x, y, epochs: int, batch_size: int) -> float:
        """Train in place on ``x, y`` (already shuffled by the driver); return the mean
        training loss of the last epoch."""
        return self._framework("fit").fit(x, y, epochs, batch_size)

    def get_optimizer_state(self) -> list | None:
        """The optimizer's state as numpy arrays, or None: what checkpoints keep and a
        replacement takes over. Without an adapter: None (checkpoints hold none; a resumed
        run says once that its trainers start with a fresh optimizer)."""
        if self.adapter is None:
            return None
        return self.adapter.get_optimizer_state()

    def set_optimizer_state(self, state) -> None:
        """Load what :meth:`get_optimizer_state` returned. Without an adapter
        ``ValueError``: this trainer never reported a state to load."""
        if self.adapter is None:
            raise ValueError(
                f"{type(self).__name__} has no optimizer state to load (it trains without a "
                "framework adapter and does not override set_optimizer_state), but the run "
                "holds one for its slot: a checkpoint of another trainer class? Override "
                "get_optimizer_state and set_optimizer_state, or resume with the class that "
                "wrote it")
        self.adapter.set_optimizer_state(state)

    def compute_gradients(self, x, y) -> tuple[list, float]:
        """``(gradients, loss)`` of the mean loss on the batch ``x, y`` at the current
        weights, as numpy arrays in the order :meth:`apply_gradients` takes; changes
        nothing (``scheme="dataparallel"``: each step's gradient goes around the ring)."""
        return self._framework("compute_gradients").compute_gradients(x, y)

    def apply_gradients(self, grads) -> None:
        """One step of this trainer's optimizer with ``grads`` (:meth:`compute_gradients`'
        arrays, averaged over the trainers)."""
        self._framework("apply_gradients").apply_gradients(grads)

    def gradients_missing(self) -> str | None:
        """None when this trainer can run ``scheme="dataparallel"``; else why not."""
        cls = type(self)
        if (cls.compute_gradients is not TrainerActor.compute_gradients
                and cls.apply_gradients is not TrainerActor.apply_gradients):
            return None
        if self.adapter is None:
            return (f"{cls.__name__} trains without a framework adapter and does not "
                    "override compute_gradients(x, y) -> (gradients, loss) and "
                    "apply_gradients(gradients)")
        return self.adapter.gradients_missing()

    def step_schedule(self) -> str:
        """How the model's own rate schedule counts: ``"none"``, ``"samples"`` or
        ``"steps"`` (``FrameworkAdapter.step_schedule``). ``scheme="auto"`` splits the batch
        between the trainers only where it is not ``"steps"``. Without an adapter:
        ``"none"`` (override it if your ``fit`` follows a schedule of steps)."""
        return self.adapter.step_schedule() if self.adapter is not None else "none"

    def get_learning_rate(self) -> float | None:
        """The optimizer's rate now, or None when it has no rate the run can set. Without
        an adapter: None, so ``lr_schedule=`` and ``lr_scaling="inner"`` are refused when
        the run starts (``schemes/rates.py``)."""
        if self.adapter is None:
            return None
        return self.adapter.get_learning_rate()

    def set_learning_rate(self, rate: float) -> None:
        """Set the rate (the run's schedule, once per round). Without an adapter
        ``TypeError``: override it together with :meth:`get_learning_rate`."""
        if self.adapter is None:
            raise TypeError(
                f"{type(self).__name__} cannot set its learning rate (it trains without a "
                "framework adapter and does not override set_learning_rate): override "
                "get_learning_rate and set_learning_rate to use lr_schedule= or "
                "lr_scaling='inner'")
        self.adapter.set_learning_rate(rate)

    def evaluate_arrays(self, x, y, batch_size: int = 512) -> tuple[float, float]:
        """Return ``(loss, accuracy)`` of the current model on ``x, y``."""
        return self._framework("evaluate_arrays").evaluate(x, y, batch_size)

    # -- the remote API ----------------------------------------------------------------------
    def describe(self) -> dict:
        """Sizes the driver needs to partition indices and shard the test set, and what a
        checkpoint compares: the weights' shapes and dtypes."""
        weights = self.get_weights()
        return {"index": self._ddlf_index, "pid": os.getpid(), "num_train": int(len(self.x)),
                "partitioned": self.partitioned, "node": _node_id(),
                "num_test": 0 if self.x_test is None else int(len(self.x_test)),
                "weights_bytes": nbytes(weights),
                # What the start compares with its weights: those who hold them are not
                # sent them (schemes/initial_weights.py).
                "weights_fingerprint": initial_weights.fingerprint(weights),
                "weights": [[list(np.shape(w)), np.asarray(w).dtype.str] for w in weights],
                "learning_rate": self.get_learning_rate(),
                "step_schedule": self.step_schedule(),
                "framework": self.adapter.name if self.adapter is not None else None,
                "buffers": self.buffer_mask(), "keras_backend": _keras_backend(),
                "gradients_missing": self.gradients_missing(),
                # What TF said when CUDA would not start (its line is hidden): the driver
                # says it once for the run (tf_startup.gpu_note).
                "cuda_failure": tf_startup.cuda_failure()}

    def train(self, weights, indices, epochs: int, batch_size: int, return_state: bool = False,
              learning_rate: float | None = None):
        """Train from ``weights`` (None: the current ones) on rows ``indices`` of this
        trainer's data, at ``learning_rate`` if given (it stays set). Return
        ``(delta, stats)``: delta is old − new weights; stats holds ``compute_s``,
        ``idle_s`` (since this trainer's previous call ended), ``samples`` and ``loss``,
        and with ``return_state`` the optimizer's state afterwards (what a checkpoint
        keeps)."""
        _, delta, stats = self._train_from_start(weights, indices, epochs, batch_size,
                                                return_state, learning_rate)
        return delta, stats

    def _train_from_start(self, weights, indices, epochs: int, batch_size: int,
                          return_state: bool = False, learning_rate: float | None = None):
        """:meth:`train`, returning ``(start weights, delta, stats)``: a caller that keeps
        the round's start (allreduce) needs no second copy of the model's weights."""
        start = time.perf_counter()
        old, new, loss, samples = self._run(weights, indices, epochs, batch_size, learning_rate)
        delta = [o - n for o, n in zip(old, new)]
        return old, delta, self._stats(start, samples, loss, return_state)

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

    @classmethod
    def local_model(cls, model_fn, weights, framework_options: dict | None = None):
        """A model in the calling process holding ``weights`` (what ``result.model`` is),
        built by its adapter's ``local_model``: no optimizer is made on the driver."""
        if cls.adapter_cls is not None:
            return cls.adapter_cls.local_model(model_fn, weights, framework_options)
        with tf_startup.quiet_startup():   # the driver's first TF import, if it is one
            model = model_fn()
        try:
            adapter_cls = frameworks.for_model(model)
        except UnknownFrameworkError as e:
            raise UnknownFrameworkError(
                f"result.model needs a framework adapter, and {cls.__name__} trains without "
                f"one ({e}). The trained weights are result.weights (its get_weights' "
                f"arrays); override the classmethod {cls.__name__}.local_model(model_fn, "
                "weights, framework_options) to build a model holding them") from None
        return adapter_cls.local_model(lambda: model, weights, framework_options)


def _keras_backend() -> str | None:
    """Keras' backend in this process, or None when Keras is not imported."""
    keras = sys.modules.get("keras")
    return keras.backend.backend() if keras is not None else None


def use_keras_backend(backend: str) -> None:
    """Make Keras 3 run on ``backend`` in this process: ``KERAS_BACKEND``, read once, when
    keras is first imported. ``RuntimeError`` if Keras is imported already on another."""
    current = _keras_backend()
    if current is not None and current != backend:
        raise RuntimeError(
            f"keras_backend={backend!r}, but Keras is already imported in this trainer's "
            f"process on {current!r} (KERAS_BACKEND is read once, at Keras' first import). "
            "The trainer's process imported Keras before its model_fn ran: run it in a "
            "fresh process")
    os.environ["KERAS_BACKEND"] = backend
