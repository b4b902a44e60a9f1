"""What a text run's history rows carry besides the usual: tokens and bits per byte.

:class:`TextMetrics` is the first callback of a run on a ``TextDataset`` (the driver adds
it), so every other callback (the CSV, the progress bar, TensorBoard, the dashboard,
early stopping) sees the row with:

- ``tokens``: tokens trained so far (the row's ``samples`` are windows of ``context``);
- ``tokens_per_s``: the row's ``samples_per_s`` in tokens;
- ``bits_per_byte``: the evaluated split's loss per token (nats) times its tokens per
  byte, over ln 2: comparable across tokenizers, and for the byte tokenizer simply the
  loss in bits;
- ``perplexity``: ``exp(test_loss)``, per token.

``test_loss`` and ``test_accuracy`` are of the dataset's ``eval_split`` (the validation
split unless told otherwise); accuracy is of the next token.
"""

from __future__ import annotations

import math

from ..callbacks import Callback
from ..datasets.text_dataset import bits_per_byte

__all__ = ["TextMetrics", "KEYS"]

KEYS = ("tokens", "tokens_per_s", "bits_per_byte", "perplexity")


class TextMetrics(Callback):
    """Adds :data:`KEYS` to each row of a run on ``dataset`` (prepared); ``history`` is the
    run's ``History`` callback, whose last row (also after a resume) gives the tokens
    trained before this one."""

    def __init__(self, dataset, history):
        self.dataset = dataset
        self.history = history

    def on_row(self, row, run):
        context = self.dataset.context
        rows = self.history.rows
        before = int(rows[-1].get("tokens") or 0) if rows else 0
        row["tokens"] = before + int(row.get("samples") or 0) * context
        rate = row.get("samples_per_s")
        row["tokens_per_s"] = None if not rate else rate * context
        loss = row.get("test_loss")
        if loss is None:
            row["bits_per_byte"] = row["perplexity"] = None
        else:
            row["bits_per_byte"] = bits_per_byte(loss, self.dataset.tokens_per_byte())
            row["perplexity"] = math.exp(min(loss, 700.0))
