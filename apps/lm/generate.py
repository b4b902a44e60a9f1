"""Sampling text from a trained GPT, Keras or PyTorch: ``result.generate(prompt, n)``.

Each step feeds the last ``context`` tokens, takes the last position's logits, divides
them by ``temperature``, keeps the ``top_k`` largest and samples one token with numpy's
generator (``seed``), so a seeded call gives the same text whichever framework computed
the logits. An empty prompt starts a new document (the separator alone). Generation
stops after ``n`` tokens or at the next separator (a document's end) with ``stop=True``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["generate", "sample_ids"]


def _logits_fn(model):
    """``ids (1, t) int -> logits (vocab,) of the last position`` for ``model``."""
    from ..frameworks import for_model

    name = for_model(model).name
    if name == "torch":
        import torch

        def torch_logits(ids):
            model.eval()
            with torch.no_grad():
                out = model(torch.from_numpy(ids.astype(np.int64)))
            return out[0, -1].double().numpy()

        return torch_logits
    if name == "keras":
        def keras_logits(ids):
            out = model(ids.astype(np.int32), training=False)
            return np.asarray(out)[0, -1].astype(np.float64)

        return keras_logits
    raise TypeError(f"generate() runs Keras and PyTorch models, not a {name} one")


def sample_ids(model, ids, n: int, context: int, *, temperature: float = 0.8,
               top_k: int | None = 40, seed: int | None = 0, stop_id: int | None = None):
    """``n`` ids sampled after ``ids`` (a list of ints), stopping early at ``stop_id``."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits_of = _logits_fn(model)
    rng = np.random.default_rng(seed)
    ids = list(ids)
    out: list[int] = []
    for _ in range(int(n)):
        logits = logits_of(np.asarray([ids[-context:]]))
        if temperature == 0:
            token = int(np.argmax(logits))
        else:
            z = logits / temperature
            if top_k is not None and top_k < len(z):
                z = np.where(z >= np.partition(z, -top_k)[-top_k], z, -np.inf)
            p = np.exp(z - z.max())
            token = int(rng.choice(len(p), p=p / p.sum()))
        if stop_id is not None and token == stop_id:
            break
        ids.append(token)
        out.append(token)
    return out


def generate(model, tokenizer, prompt: str = "", n: int = 200, *, context: int,
             temperature: float = 0.8, top_k: int | None = 40, seed: int | None = 0,
             stop: bool = True) -> str:
    """``prompt`` followed by up to ``n`` sampled tokens, as text. ``model`` is a GPT
    (``result.model``), ``tokenizer`` the dataset's, ``context`` the model's window."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    ids = [tokenizer.separator] + [int(i) for i in tokenizer.encode(prompt)]
    new = sample_ids(model, ids, n, context, temperature=temperature, top_k=top_k, seed=seed,
                     stop_id=tokenizer.separator if stop else None)
    return prompt + tokenizer.decode(new)
