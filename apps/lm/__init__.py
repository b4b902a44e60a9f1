"""Language models on DDLF: a small GPT in Keras or PyTorch, trained on text windows.

    from ddlf_actors.apps import datasets, lm, train
    ds = datasets.corpus("fortunes", context=128)
    model_fn = lm.GptModelFn(ds, framework="torch", total_steps=...)
    result = train(model_fn, ds, workers=2)
    print(result.generate("A fool", 200))

- ``gpt_torch.gpt_tiny_torch`` and ``gpt_keras.gpt_tiny`` (``models.gpt_tiny_torch``,
  ``models.gpt_tiny``): the models; ``sizes.SIZES`` their shapes.
- :class:`GptModelFn`: a picklable ``model_fn`` of either, sized for a dataset.
- ``generate.generate``: sampling (``result.generate`` calls it).
- ``metrics.TextMetrics``: tokens and bits per byte in the history rows.
- ``run_files``: what ``ddlf-train`` saves with a text run, and loads to generate.

Importing this imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import math

from .generate import generate
from .gpt_keras import gpt_tiny
from .gpt_torch import gpt_tiny_torch
from .sizes import SIZES, count_params

__all__ = ["gpt_tiny", "gpt_tiny_torch", "GptModelFn", "SIZES", "FRAMEWORKS", "generate",
           "count_params", "steps_per_trainer"]

# The framework a GPT trains on when none is named (benchmarks/training/lm_frameworks.py,
# docs/language-models.md): at one thread, a trainer's, PyTorch and Keras on TF are within
# the spread (Keras 1.08x per CPU second); at two, PyTorch is 1.13x per CPU second and
# uses both cores where TF used 1.16; PyTorch starts 3x faster.
DEFAULT_FRAMEWORK = "torch"
FRAMEWORKS = ("torch", "keras")


def steps_per_trainer(windows: int, workers: int, batch_size: int, master_epochs: int,
                      worker_epochs: int = 1) -> int:
    """The optimizer steps each of ``workers`` trainers takes in a run: what a GPT's
    cosine decays over (``total_steps``)."""
    per_trainer = math.ceil(windows / max(1, workers))
    return math.ceil(per_trainer / batch_size) * master_epochs * worker_epochs


class GptModelFn:
    """``model_fn`` of a GPT for ``dataset`` (its vocabulary and context): ``gpt_tiny_torch``
    or ``gpt_tiny`` of ``size``, with ``options`` (``total_steps``, ``learning_rate``,
    ``seed``, ``layers`` ...). Picklable by reference, named for the model it builds (the
    dashboard and checkpoints call it ``gpt_tiny_torch`` / ``gpt_tiny``)."""

    def __init__(self, dataset=None, framework: str = DEFAULT_FRAMEWORK, size: str = "tiny", *,
                 vocab_size: int | None = None, context: int | None = None, **options):
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework {framework!r}: use one of {', '.join(FRAMEWORKS)}")
        if dataset is not None:
            vocab_size = vocab_size or dataset.vocab_size
            context = context or dataset.context
        if vocab_size is None or context is None:
            raise ValueError("GptModelFn needs a dataset, or vocab_size= and context=")
        self.framework = framework
        self.size = size
        self.vocab_size, self.context = int(vocab_size), int(context)
        self.options = dict(options)
        self.__name__ = "gpt_tiny_torch" if framework == "torch" else "gpt_tiny"

    def __call__(self, **overrides):
        build = gpt_tiny_torch if self.framework == "torch" else gpt_tiny
        return build(self.vocab_size, self.context, self.size, **{**self.options, **overrides})

    def settings(self) -> dict:
        """What rebuilds this model: JSON for ``lm.json`` (``run_files``)."""
        return {"framework": self.framework, "size": self.size,
                "vocab_size": self.vocab_size, "context": self.context, **self.options}

    def __repr__(self) -> str:
        return f"GptModelFn({self.__name__}, {self.size}, vocab={self.vocab_size}, " \
               f"context={self.context})"
