"""The same initial weights on every trainer, so that a run's start need not send them.

Every trainer builds its own model (``model_fn()``) when it starts, and a new run starts
from trainer 0's weights. Until 2026-11-29 the ring's start then sent those weights to
every trainer: K copies through the driver's one link (82 MB for ``wide_cnn`` at K = 4,
6.7 s of a 100 Mbit/s link, a sixth of that run's time to its target). Two pieces make
the copies unnecessary wherever they can be:

- :class:`SeededBuild` is the ``model_fn`` a trainer is built with: the user's, called
  with Python's and NumPy's global generators seeded from the run's seed, and both put
  back afterwards. Keras 3 draws an unseeded initializer's seed from Python's generator,
  a NumPy model draws from NumPy's, and PyTorch starts every process from the same default
  seed, so the trainers of one run build the same weights. A model that draws entropy
  elsewhere (``os.urandom``, its own generator) builds different ones, and is sent them
  as before.
- A trainer's ``describe()`` reports :func:`fingerprint` of the weights it holds;
  :func:`holders` names the trainers that already hold the start weights, which the start
  then skips. The ring's first collective still checks that every member ends with the
  same weights (``held_digest``), so a trainer that held something else cannot go
  unnoticed.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["SeededBuild", "fingerprint", "holders"]


class SeededBuild:
    """``model_fn``, called with Python's ``random`` and NumPy's global generator seeded
    from ``seed`` (both restored after, so nothing else in the process changes)."""

    def __init__(self, model_fn, seed: int):
        self.model_fn = model_fn
        self.seed = int(seed)

    def __call__(self, *args, **kwargs):
        py_state, np_state = random.getstate(), np.random.get_state()
        random.seed(self.seed)
        np.random.seed(self.seed % 2**32)
        try:
            return self.model_fn(*args, **kwargs)
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)

    def __getattr__(self, name: str) -> Any:
        # A subclass's build_model may read the model function's attributes. Unpickling
        # looks up dunders before model_fn exists: those are not forwarded.
        if name == "model_fn" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.model_fn, name)

    def __repr__(self) -> str:
        return f"SeededBuild({self.model_fn!r}, seed={self.seed})"


def fingerprint(weights: Sequence) -> str:
    """A BLAKE2b digest of the arrays' shapes, dtypes and bytes (about 20 ms for 20 MB)."""
    h = hashlib.blake2b(digest_size=16)
    for w in weights:
        a = np.ascontiguousarray(w)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.data.cast("B"))
    return h.hexdigest()


def holders(slots: Iterable, weights: Sequence) -> set[int]:
    """The indexes of ``slots`` whose trainer reported (``describe()``) holding exactly
    ``weights``."""
    fp = fingerprint(weights)
    return {s.index for s in slots
            if s.info is not None and s.info.get("weights_fingerprint") == fp}
