"""Lossy codecs that keep every value at fewer bits: ``fp16`` and ``int8``.

Both scale each tensor by its largest magnitude and apply to float16/32/64 tensors that
hold data; other tensors (integers, bools, empty ones) are sent exactly. Both raise
ValueError, naming the tensor, for NaN or inf: a diverged model should stop with an
error, not ship garbage.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Codec, check_finite, is_lossy_float, raw, segment
from .registry import register

__all__ = ["FP16Codec", "Int8Codec"]


@register
class FP16Codec(Codec):
    """``fp16``: each float tensor as float16 (half the bytes of float32), scaled by a
    power of two per tensor.

    With ``m = max|x|`` over the tensor, the tensor is multiplied by ``2^e``, the power of
    two that brings m into [2¹⁴, 2¹⁵), rounded to float16 and divided by ``2^e`` on
    decode. Scaling by a power of two is exact, so this is plain float16 rounding minus
    its two failures: values above 65504 become inf, and values below 2⁻¹⁴ fall into
    float16's subnormals, where precision drops and numpy converts far more slowly (a
    paper-CNN delta, a quarter of whose values are there, took 35 ms instead of 1.5).

    Error bound, per element: ``|decoded − x| ≤ max(2⁻¹¹·|x|, 2⁻³⁹·m)`` (a relative 2⁻¹¹
    for every |x| ≥ 2⁻²⁸·m). The decoded tensor has the input's dtype. Raises ValueError
    for NaN or inf. float16 input, non-float tensors, and tensors at the ends of their
    dtype's range (float32: m < 2⁻¹¹¹ or m ≥ 2¹²⁷; float64: m < 2⁻¹⁰⁰⁹ or m ≥ 2¹⁰²³) go
    through exactly.
    """

    name = "fp16"
    form = "fp16"
    lossless = False

    def predicted_nbytes(self, size, dtype):
        dtype = np.dtype(dtype)
        return 2 * size if _lossy_dtype(dtype, size) else size * dtype.itemsize

    def encode_tensor(self, index, a):
        if not is_lossy_float(a) or a.dtype == np.float16:
            return raw(a)
        m = check_finite(self.name, index, a)
        e = 15 - math.frexp(m)[1] if m else 0   # m·2^e in [2^14, 2^15)
        info = np.finfo(a.dtype)
        # 2^e must be a normal number, decoded values y·2^-e (y a multiple of 2^-24)
        # multiples of the dtype's smallest subnormal, so that decoding is exact, and
        # the largest, y = 2^15 (m rounded up), finite.
        if not 15 - info.maxexp < e <= min(info.maxexp - 1, info.nmant - info.minexp - 24):
            return raw(a)
        scaled = np.multiply(a, a.dtype.type(2.0 ** e)) if e else a
        return "f16", (scaled.astype(np.float16).reshape(-1),), e

    def decode_tensor(self, method, segments, scalar, shape, dtype):
        (seg,) = segments
        seg = segment(seg, np.float16, _size(shape), "fp16")
        out = seg.astype(dtype)
        if scalar:
            out *= dtype.type(2.0 ** -scalar)
        return out.reshape(shape)


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

    def predicted_nbytes(self, size, dtype):
        dtype = np.dtype(dtype)
        return size if _lossy_dtype(dtype, size) else size * dtype.itemsize

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


def _lossy_dtype(dtype: np.dtype, size: int) -> bool:
    """Whether a tensor of this dtype and size is quantized (as is_lossy_float decides)."""
    return dtype.kind == "f" and dtype.itemsize <= 8 and size > 0


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _finite_product(a, b) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.isfinite(a * b))
