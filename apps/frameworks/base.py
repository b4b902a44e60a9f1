"""A framework adapter: how a trainer holds, trains and reads one framework's model.

The schemes speak only lists of numpy arrays. Everything a trainer does with the model
itself goes through one adapter, so another framework is one new file: Keras
(:mod:`.keras`), PyTorch (:mod:`.torch`), or the numpy model the tests train.

An adapter wraps a model that ``model_fn()`` built on the trainer. It never imports its
framework at module import time: a node's forkserver imports ``ddlf_actors.apps``, and
none of TensorFlow, torch or JAX is fork-safe once its threads run. :meth:`owns` looks the
framework up in ``sys.modules`` instead (a model of it exists, so it is imported).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import numpy as np

__all__ = ["FrameworkAdapter", "eval_batch_size", "EVAL_TOKENS"]

# Tokens in one evaluation batch of a text dataset: its logits are (tokens x vocabulary)
# floats, 33 MB for 8192 tokens of a 1024-id vocabulary, where 512 windows of 128 of a
# 4096-id BPE would be 1 GB.
EVAL_TOKENS = 8192


def eval_batch_size(x, batch_size: int) -> int:
    """``batch_size``, or fewer samples for token windows (integer ``(n, T)`` inputs) so
    that a batch holds at most :data:`EVAL_TOKENS` tokens."""
    shape = np.shape(x)
    if len(shape) == 2 and np.asarray(x[:0]).dtype.kind in "iu" and shape[1] > 0:
        return max(1, min(int(batch_size), EVAL_TOKENS // int(shape[1])))
    return int(batch_size)


class FrameworkAdapter:
    """One framework's surface: weights in and out, training and evaluating on numpy
    arrays, optimizer state and learning rate. Subclasses implement every method.

    ``options`` holds framework-specific settings from the run (for PyTorch the
    ``optimizer=`` and ``loss=`` callables); an adapter ignores those it does not read.
    """

    #: what ``framework=`` names it, and what the dashboard and checkpoints record
    name: ClassVar[str] = ""
    #: the file ``ddlf-train run`` saves the final model to, in ``--out``
    model_file: ClassVar[str] = "model"

    def __init__(self, model: Any, options: dict | None = None):
        self.model = model
        self.options = dict(options or {})

    # -- which models, and the process ---------------------------------------------------------
    @classmethod
    def owns(cls, model: Any) -> bool:
        """True if ``model`` is this framework's (without importing the framework)."""
        raise NotImplementedError

    @classmethod
    def configure_threads(cls, n: int) -> None:
        """Give the framework ``n`` intra-op threads (and one inter-op thread), before it
        runs its first op where it must be (TensorFlow's pools are fixed at first use)."""
        raise NotImplementedError

    # -- weights -------------------------------------------------------------------------------
    def get_weights(self) -> list[np.ndarray]:
        """Every array the schemes average, as numpy arrays in a fixed order (Keras:
        ``model.get_weights()``; PyTorch: ``state_dict()`` values, buffers included)."""
        raise NotImplementedError

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Load arrays in :meth:`get_weights`' order and layout."""
        raise NotImplementedError

    def buffer_mask(self) -> list[bool]:
        """For each array of :meth:`get_weights`, in order: True for a *buffer*, a value
        the model sets itself while it trains (BatchNorm's running mean and variance, a
        batch counter), False for a weight the optimizer steps. The schemes average
        buffers as values and never step them like gradients (``schemes/averaging.py``).
        This default: no buffers."""
        return [False] * len(self.get_weights())

    # -- training ------------------------------------------------------------------------------
    def fit(self, x: np.ndarray, y: np.ndarray, epochs: int, batch_size: int) -> float:
        """Train in place on ``x, y`` in the order given (the driver shuffled the indices:
        Algorithm 6), ``epochs`` passes of batches of ``batch_size``; return the mean
        training loss of the last pass."""
        raise NotImplementedError

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[list, float]:
        """``(gradients, loss)``: the gradient of the mean loss on the batch ``x, y`` at
        the current weights (numpy arrays, one per trainable variable, in a fixed order)
        and that loss; changes nothing. What ``scheme="dataparallel"`` all-reduces."""
        raise NotImplementedError

    def apply_gradients(self, grads: Sequence[np.ndarray]) -> None:
        """One optimizer step with ``grads`` (:meth:`compute_gradients`' order)."""
        raise NotImplementedError

    def gradients_missing(self) -> str | None:
        """None when :meth:`compute_gradients` and :meth:`apply_gradients` work for this
        model; else why not (``scheme="dataparallel"`` is refused with it). This default:
        whether the subclass implements both."""
        cls = type(self)
        if (cls.compute_gradients is FrameworkAdapter.compute_gradients
                or cls.apply_gradients is FrameworkAdapter.apply_gradients):
            return (f"the {cls.name or cls.__name__} framework adapter does not implement "
                    "compute_gradients and apply_gradients")
        return None

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 512) -> tuple[float, float]:
        """``(mean loss, accuracy)`` of the current weights on ``x, y``; changes nothing."""
        raise NotImplementedError

    # -- optimizer ------------------------------------------------------------------------------
    def get_optimizer_state(self) -> list | None:
        """The optimizer's state (step count, momentum, Adam moments) as numpy arrays, or
        None when there is none yet. What checkpoints keep and replacements take over."""
        raise NotImplementedError

    def set_optimizer_state(self, state: list) -> None:
        """Load what :meth:`get_optimizer_state` returned. ``ValueError`` if it does not
        fit this model's optimizer."""
        raise NotImplementedError

    def reset_optimizer_state(self) -> None:
        """Put the optimizer back as it was before its first step, when
        :meth:`get_optimizer_state` had nothing to return then (the start-up probe's steps
        must leave no trace). Adapters whose state is complete from the start need not."""

    def step_schedule(self) -> str:
        """How the optimizer's own rate schedule counts: ``"none"`` (it has none),
        ``"samples"`` (it follows the samples trained: :meth:`fit` tells it each step's
        batch) or ``"steps"`` (it counts steps, so a smaller batch runs through it sooner:
        ``scheme="auto"`` then keeps each trainer's batch). This default: none."""
        return "none"

    def get_learning_rate(self) -> float | None:
        """The optimizer's rate now, or None if it has no settable one."""
        raise NotImplementedError

    def set_learning_rate(self, rate: float) -> None:
        """Set the rate (the run's schedule, once per round). ``TypeError`` when the model
        carries a schedule of its own that cannot be overridden."""
        raise NotImplementedError

    # -- the driver's side ---------------------------------------------------------------------
    @classmethod
    def local_model(cls, model_fn: Callable[[], Any], weights: Sequence[np.ndarray],
                    options: dict | None = None) -> Any:
        """``model_fn()`` built in the calling process, holding ``weights``: what
        ``result.model`` is."""
        raise NotImplementedError

    @classmethod
    def weights_of(cls, model: Any) -> list[np.ndarray]:
        """``model``'s arrays in :meth:`get_weights`' order, read in the calling process
        (the driver) without building what training needs (an optimizer)."""
        return cls(model).get_weights()

    @classmethod
    def save(cls, model: Any, path: str) -> None:
        """Write ``model`` to ``path`` in the framework's own format."""
        raise NotImplementedError
