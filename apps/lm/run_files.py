"""What a text run leaves in its folder, and how a later process loads it to generate.

``ddlf-train run`` on a text dataset writes, besides the model (``model.pt`` or
``model.keras``) and the history:

- ``tokenizer.json``: the tokenizer (``datasets.tokenizer.load``);
- ``lm.json``: what rebuilds the model (framework, size, vocabulary, context, the
  optimizer's settings) and what it was trained on (the dataset, its splits' sizes).

:func:`load_run` reads them back: ``(model, tokenizer, settings)``, the model holding the
saved weights, built with no optimizer. ``ddlf-train generate --run DIR`` uses it.
"""

from __future__ import annotations

import json
import os

__all__ = ["save_run", "load_run", "SETTINGS_FILE", "TOKENIZER_FILE"]

SETTINGS_FILE = "lm.json"
TOKENIZER_FILE = "tokenizer.json"
_MODEL_FILES = {"torch": "model.pt", "keras": "model.keras"}


def save_run(out: str, model_fn, dataset, history: list) -> list:
    """Write ``tokenizer.json`` and ``lm.json`` for a run of ``model_fn`` (a
    ``GptModelFn``) on ``dataset`` into ``out``; the paths written."""
    os.makedirs(out, exist_ok=True)
    tok_path = os.path.join(out, TOKENIZER_FILE)
    dataset.tokenizer.save(tok_path)
    last: dict = next((r for r in reversed(history) if r.get("test_loss") is not None), {})
    settings = {
        "model": model_fn.settings(),
        "model_file": _MODEL_FILES[model_fn.framework],
        "dataset": {"name": dataset.__name__, "tokenizer": dataset.tokenizer.spec,
                    "context": dataset.context, "split": list(dataset.split),
                    "eval_split": dataset.eval_split, **(dataset.info or {})},
        "final": {k: last.get(k) for k in ("epoch", "tokens", "test_loss", "bits_per_byte")},
    }
    path = os.path.join(out, SETTINGS_FILE)
    with open(path, "w") as f:
        json.dump(settings, f, indent=1)
    return [tok_path, path]


def load_run(run_dir: str):
    """``(model, tokenizer, settings)`` of the text run saved in ``run_dir``.
    ``FileNotFoundError`` naming what is missing (a run that was not on text, or not
    finished); ``ValueError`` for a file that is not what DDLF wrote."""
    from ..datasets import tokenizer as tokenizers
    from . import GptModelFn

    path = os.path.join(run_dir, SETTINGS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: no such file; --run takes the --out folder of a finished "
            "ddlf-train run on a text dataset (--dataset fortunes or text:PATH)")
    with open(path) as f:
        settings = json.load(f)
    tok = tokenizers.load(os.path.join(run_dir, TOKENIZER_FILE))
    spec = dict(settings["model"])
    framework = spec.pop("framework")
    size = spec.pop("size")
    fn = GptModelFn(framework=framework, size=size, **spec)
    weights = os.path.join(run_dir, settings["model_file"])
    if not os.path.isfile(weights):
        raise FileNotFoundError(f"{weights}: no such file (the run's model)")
    if framework == "torch":
        import torch

        model = fn()
        model.load_state_dict(torch.load(weights))
    else:
        from .. import tf_startup

        with tf_startup.quiet_startup():
            model = fn(compile=False)
        model.load_weights(weights)
    return model, tok, settings
