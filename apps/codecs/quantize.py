"""Lossy codecs that keep every value at fewer bits: ``fp16`` and ``int8``.

Both apply to float16/32/64 tensors that hold data; other tensors (integers, bools,
empty ones) are sent exactly. Both raise ValueError, naming the tensor, for NaN or inf:
a diverged model should stop with an error, not ship garbage.
"""

from __future__ import annotations

import numpy as np

from .base import Codec, check_finite, is_lossy_float, raw, segment
from .registry import register

__all__ = ["FP16Codec", "Int8Codec"]

FP16_MAX = float(np.finfo(np.float16).max)   # 65504


@register
class FP16Codec(Codec):
    """``fp16``: each float tensor rounded to float16 (half the bytes of float32).

    Error bound, per element: ``|decoded − x| ≤ max(2⁻¹¹·|x|, 2⁻²⁵)`` (round to nearest:
    a relative 2⁻¹¹ for |x| ≥ 2⁻¹⁴, half of float16's subnormal spacing 2⁻²⁴ below).
    The decoded tensor has the input's dtype. Raises ValueError for |x| > 65504,
    float16's largest value (it would become inf), and for NaN or inf. float16 input
    and non-float tensors go through exactly.
    """

    name = "fp16"
    form = "fp16"
    lossless = False

    def encode_tensor(self, index, a):
        if not is_lossy_float(a) or a.dtype == np.float16:
            return raw(a)
        m = check_finite(self.name, index, a)
        if m > FP16_MAX:
            raise ValueError(
                f"tensor {index} (shape {a.shape}) holds |x| = {m:g}, beyond float16's "
                f"largest value {FP16_MAX:g}: fp16 would turn it into inf. Use int8 (it "
                "scales each tensor) or a lossless codec")
        return "f16", (a.astype(np.float16),), None

    def decode_tensor(self, method, segments, scalar, shape, dtype):
        (seg,) = segments
        seg = segment(seg, np.float16, _size(shape), "fp16")
        return seg.astype(dtype).reshape(shape)


@register
class Int8Codec(Codec):
    """``int8``: each float tensor as int8 with one scale per tensor (a quarter of float32).

    With ``m = max|x|`` over the tensor and ``s = m/127``, an element is sent as
    ``q = rint(x/s)`` in [−127, 127] and decoded as ``q·s``. Error bound, per element:
    ``|decoded − x| ≤ m·(1/254 + ε)``, where ε is the machine epsilon of x's dtype (half a
    step, plus the rounding of the scale arithmetic). Small values of a tensor with one
    large value lose most of their precision: that is the price of one scale per tensor.
    The decoded tensor has the input's dtype. Raises ValueError for NaN or inf. A tensor
    whose scale would be subnormal (m < 127·the dtype's smallest normal) and non-float
    tensors go through exactly; float16 tensors are scaled in float32.
    """

    name = "int8"
    form = "int8"
    lossless = False

    def encode_tensor(self, index, a):
        if not is_lossy_float(a):
            return raw(a)
        m = check_finite(self.name, index, a)
        work = np.float32 if a.dtype == np.float16 else a.dtype.type
        scale = work(m) / work(127)
        if m == 0:
            return "q8", (np.zeros(a.shape, dtype=np.int8).reshape(-1),), 0.0
        if not _finite_product(scale, work(127)):
            # m near the dtype's largest value: m/127 rounded up makes 127·s overflow to
            # inf on decode. The largest scale that does not keeps the bound (clip takes
            # care of the |x/s| a few ulps above 127 this allows).
            scale = np.nextafter(work(np.finfo(work).max) / work(127), work(0))
        if scale < np.finfo(work).tiny:
            # A subnormal scale has too few significant bits for the bound; such a tensor
            # is all but zero, so sending it exactly costs nothing that matters.
            return raw(a)
        # reshape(-1): a 0-d input would make divide return a scalar, not an array.
        t = np.divide(a.reshape(-1), scale, dtype=work)
        np.rint(t, out=t)
        np.clip(t, -127, 127, out=t)   # |t| ≤ 127·(1 + ε) already; rint cannot reach 128
        # The scale goes in the header as a Python float, which holds float32 and float64
        # exactly.
        return "q8", (t.astype(np.int8),), float(scale)

    def decode_tensor(self, method, segments, scalar, shape, dtype):
        (seg,) = segments
        seg = segment(seg, np.int8, _size(shape), "int8")
        work = np.float32 if dtype == np.float16 else dtype.type
        out = np.multiply(seg, work(scalar), dtype=work)
        return out.astype(dtype, copy=False).reshape(shape)


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _finite_product(a, b) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.isfinite(a * b))
