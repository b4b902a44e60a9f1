"""What a codec accepts as input: a list of numeric arrays (shared by codecs and encoders)."""

from __future__ import annotations

import numpy as np

__all__ = ["as_arrays"]


def as_arrays(arrays) -> list:
    """``arrays`` as a list of numpy arrays; TypeError for one array or non-numeric data.

    A single ndarray is refused rather than taken as a list of its rows, which would
    encode fine and decode into the wrong shape.
    """
    if isinstance(arrays, (np.ndarray, np.generic, str, bytes, dict)):
        raise TypeError(f"a codec encodes a list of arrays (one per tensor), got "
                        f"{type(arrays).__name__}; pass [array] for a single one")
    out = [np.asarray(a) for a in arrays]
    for i, a in enumerate(out):
        if a.dtype.hasobject:
            raise TypeError(f"tensor {i} has dtype {a.dtype}: a codec encodes numeric "
                            "arrays only (objects have no fixed bytes to send)")
    return out
