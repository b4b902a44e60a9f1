"""What a training run returns."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

__all__ = ["TrainResult"]


@dataclasses.dataclass
class TrainResult:
    """``history``: one dict per row (a round for ``train_sync``, an epoch for
    ``train_async``); ``weights``: the final weights (a list of numpy arrays);
    ``config``: the run's shared settings (``TrainConfig``), ``options``: the scheme's
(``SyncOptions`` ...) with its defaults filled in; ``model``: a model holding them,
    built on first access by the trainer class's ``local_model``, through the model's
    framework adapter (``model_fn()`` in this process, holding the weights, with no
    optimizer built: a Keras model as ``model_fn`` compiled it, a ``torch.nn.Module`` in
    the mode ``model_fn`` left it); ``weights`` are ``get_weights``' arrays (PyTorch: the
    ``state_dict()`` values, buffers included, in its order); ``framework``: the adapter's
    name (``"keras"``, ``"torch"`` ...); ``events``: what happened
    to the run (trainers lost and joined, resumes, checkpoints), see ``records.RunEvent``;
    ``checkpoint``: the path of the last checkpoint written, if any; ``checkpoint_s``: the
    time the training loop spent on checkpoints (the rest is written in the background);
    ``checkpoint_write_s``: the background writer's own wall time (serialising, writing,
    ``fsync``), which overlaps training; ``checkpoint_cpu_s``: the CPU time of that, what
    the writer takes from the driver (the rest of its time waits on the disk)."""

    scheme: str
    history: list
    weights: list
    config: Any
    # The scheme's own settings (SyncOptions ...), its defaults filled in.
    options: Any = None
    model_fn: Callable | None = None
    trainer_cls: Any = None
    # Asynchronous runs: one record per applied update (trainer, versions, staleness).
    updates: list = dataclasses.field(default_factory=list)
    stopped_early: str | None = None
    startup_s: float = 0.0
    events: list = dataclasses.field(default_factory=list)
    checkpoint: str | None = None
    checkpoint_s: float = 0.0
    checkpoint_write_s: float = 0.0
    checkpoint_cpu_s: float = 0.0
    framework: str | None = None
    _model: Any = dataclasses.field(default=None, repr=False)

    @property
    def model(self):
        if self._model is None:
            options = self.config.framework_options() if self.config is not None else None
            self._model = self.trainer_cls.local_model(self.model_fn, self.weights, options)
        return self._model

    @property
    def final(self) -> dict:
        """The last history row."""
        return self.history[-1] if self.history else {}
