"""The GPT sizes, named: the same shapes in Keras and PyTorch.

Parameters with the byte tokenizer (256 ids) and a context of 128 / 256:

| size | layers | heads | dim | parameters | for |
|---|---|---|---|---|---|
| ``tiny`` | 4 | 4 | 128 | 0.84 M (context 128) | tests, examples, the CLI's default |
| ``small`` | 6 | 6 | 288 | 6.1 M (context 256) | the benchmarks (issue 32's 5-20 M) |

A block holds 12·dim² + 13·dim parameters (attention 4·dim², MLP 8·dim², biases, two
LayerNorms); the embeddings (vocab + context)·dim, the output reuses the token's.
"""

from __future__ import annotations

__all__ = ["SIZES", "resolve_size", "count_params"]

SIZES = {"tiny": {"layers": 4, "heads": 4, "dim": 128},
         "small": {"layers": 6, "heads": 6, "dim": 288}}


def resolve_size(size: str, layers=None, heads=None, dim=None) -> dict:
    """``{"layers", "heads", "dim"}`` of ``size`` with any given override. ``ValueError``
    for an unknown size or a dim that heads do not divide."""
    if size not in SIZES:
        raise ValueError(f"unknown GPT size {size!r}: use one of {', '.join(SIZES)} (or pass "
                         "layers=, heads=, dim=)")
    shape = dict(SIZES[size])
    for key, value in (("layers", layers), ("heads", heads), ("dim", dim)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an int >= 1, got {value!r}")
            shape[key] = value
    if shape["dim"] % shape["heads"]:
        raise ValueError(f"dim={shape['dim']} is not a multiple of heads={shape['heads']}")
    return shape


def count_params(vocab_size: int, context: int, layers: int, dim: int, **_) -> int:
    """The parameters of a GPT of this shape (both frameworks have the same)."""
    block = 12 * dim * dim + 13 * dim
    return (vocab_size + context) * dim + layers * block + 2 * dim
