"""``topk:<fraction>``: send only each tensor's largest-magnitude entries.

Sparsification loses most of a delta, so it is meant to run with error feedback (the
default): the trainer's encoder keeps what was not sent and adds it to its next delta
(see ``feedback.py``). Without it, the dropped entries are lost for good.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Codec, check_finite, is_lossy_float, raw, segment
from .registry import register

__all__ = ["TopKCodec"]


@register
class TopKCodec(Codec):
    """``topk:<fraction>``: per float tensor of n elements, the k = max(1, round(fraction·n))
    entries of largest |x|, as their flat indices (the smallest unsigned int type that
    holds n − 1, sorted) and their values (in the tensor's dtype).

    Error bound, per tensor: every decoded element is either exactly x or 0, exactly k
    elements are kept, and no dropped element is larger in magnitude than a kept one;
    hence ``‖decoded − x‖² ≤ (1 − k/n)·‖x‖²``. Ties are broken arbitrarily. ``fraction``
    is in (0, 1]. Error feedback is on by default (``topk:<fraction>:noef`` turns it off).
    A tensor where the indices would cost more than sending it whole, and non-float
    tensors, go through exactly. Raises ValueError for NaN or inf.

    Only for streams the receiver adds up (``needs_summing``): top-k of whole weights
    would zero most of them. To send weights with it, send their changes since the
    receiver's last copy, through an error-feedback encoder.
    """

    name = "topk"
    form = "topk:<fraction in (0, 1]>"
    lossless = False
    default_feedback = True
    needs_summing = True

    def __init__(self, fraction: float, *, error_feedback: bool | None = None):
        super().__init__(error_feedback=error_feedback)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)) \
                or not 0 < fraction <= 1:
            raise ValueError(f"topk fraction must be a number in (0, 1] (the share of each "
                             f"tensor's entries to send, e.g. topk:0.01), got {fraction!r}")
        self.fraction = float(fraction)

    @classmethod
    def from_param(cls, text, error_feedback):
        if text is None:
            raise ValueError("topk needs the fraction of entries to send, e.g. topk:0.01")
        try:
            fraction = float(text)
        except ValueError:
            raise ValueError(f"topk fraction must be a number in (0, 1], got {text!r}") from None
        if not math.isfinite(fraction):
            raise ValueError(f"topk fraction must be a number in (0, 1], got {text!r}")
        return cls(fraction, error_feedback=error_feedback)

    @classmethod
    def decoder(cls):
        return cls(1.0)   # the fraction only matters when encoding

    def param_text(self):
        return repr(self.fraction)

    def predicted_nbytes(self, size, dtype):
        dtype = np.dtype(dtype)
        whole = size * dtype.itemsize
        if dtype.kind != "f" or dtype.itemsize > 8 or size == 0:
            return whole
        k = self.kept(size)
        sent = k * (np.min_scalar_type(size - 1).itemsize + dtype.itemsize)
        return whole if sent >= whole else sent

    def kept(self, n: int) -> int:
        """How many of a tensor's ``n`` entries are sent."""
        return min(n, max(1, int(round(self.fraction * n))))

    def encode_tensor(self, index, a):
        if not is_lossy_float(a):
            return raw(a)
        check_finite(self.name, index, a)
        n = a.size
        k = self.kept(n)
        itype = np.min_scalar_type(n - 1)
        if k * (itype.itemsize + a.dtype.itemsize) >= n * a.dtype.itemsize:
            return raw(a)   # indices and values would outweigh the tensor itself
        flat = np.ascontiguousarray(a).reshape(-1)
        mag = np.abs(flat)
        nz = np.flatnonzero(mag)
        # argpartition is O(n): only the k largest are found, not a full sort.
        if nz.size == n:
            idx = np.argpartition(mag, n - k)[n - k:]
        elif nz.size > k:
            # Select among the non-zero entries only: numpy's introselect is 10-25x slower
            # on an array of mostly equal values, such as the change of weights that
            # sparse deltas left mostly untouched (495,616 float32: 35 ms dense, 270-520 ms
            # with 90-99 % zeros).
            sub = mag[nz]
            idx = nz[np.argpartition(sub, sub.size - k)[sub.size - k:]]
        else:
            # Every non-zero entry is kept; zeros make up the k.
            idx = np.concatenate([nz, np.flatnonzero(mag == 0)[:k - nz.size]])
        idx.sort()   # sorted indices scatter in memory order on decode
        return "topk", (idx.astype(itype), flat[idx]), None

    def decode_tensor(self, method, segments, scalar, shape, dtype):
        idx, vals = segments
        idx, vals = np.asarray(idx), np.asarray(vals)
        n = int(np.prod(shape, dtype=np.int64))
        k = idx.size
        if idx.dtype.kind != "u" or not 0 < k <= n:
            raise ValueError(f"malformed topk indices: {idx.dtype}[{k}] for {n} entries")
        vals = segment(vals, dtype, k, "topk values")
        if int(idx.max()) >= n:
            raise ValueError(f"malformed topk indices: index {int(idx.max())} >= {n} entries")
        out = np.zeros(n, dtype=dtype)
        out[idx] = vals
        return out.reshape(shape)

    def tensor_error(self, a, method, segments, scalar):
        # What was not sent: a with the kept entries zeroed (no decode needed).
        err = np.array(a, copy=True).reshape(-1)
        err[segments[0]] = 0
        return err.reshape(a.shape)
