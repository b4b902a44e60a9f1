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
    the writer takes from the driver (the rest of its time waits on the disk); ``dataset``:
    what the run trained on (after a run on a text dataset, ``generate(prompt, n)``
    samples text from the model)."""

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
    # What the run trained on (a TextDataset's tokenizer is what generate() needs).
    dataset: Any = dataclasses.field(default=None, repr=False)
    # The scheme the run was, the settings it ran with, and what scheme="auto" chose and
    # why ({"scheme", "compression", "options", "auto": {..., "line"} or None}).
    settings: dict = dataclasses.field(default_factory=dict)
    _model: Any = dataclasses.field(default=None, repr=False)

    @property
    def model(self):
        if self._model is None:
            options = self.config.framework_options() if self.config is not None else None
            self._model = self.trainer_cls.local_model(self.model_fn, self.weights, options)
        return self._model

    def generate(self, prompt: str = "", n: int = 200, *, temperature: float = 0.8,
                 top_k: int | None = 40, seed: int | None = 0, stop: bool = True) -> str:
        """``prompt`` and up to ``n`` tokens sampled from a language model trained on a
        text dataset (``datasets.corpus``, ``datasets.text``), with its tokenizer:
        ``temperature`` (0: the likeliest token each step), the ``top_k`` likeliest
        tokens, numpy's generator seeded with ``seed``; ``stop``: end at a document's
        end. ``TypeError`` for a run on another kind of dataset."""
        from .datasets import TextDataset
        from .lm.generate import generate

        if not isinstance(self.dataset, TextDataset):
            raise TypeError("generate() needs a language model trained on a text dataset "
                            f"(datasets.corpus, datasets.text); this run trained on "
                            f"{type(self.dataset).__name__}")
        return generate(self.model, self.dataset.tokenizer, prompt, n,
                        context=self.dataset.context, temperature=temperature, top_k=top_k,
                        seed=seed, stop=stop)

    @property
    def final(self) -> dict:
        """The last history row."""
        return self.history[-1] if self.history else {}
