"""``int4``: every float value in 4 bits, two to a byte, with one scale per block of values.

Why these choices (issue 23 section 3):

- **Symmetric, levels −7…7.** Deltas and weight changes are centred on zero, so a
  zero point buys almost nothing (an asymmetric step over [min, max] is 2m/15 where this
  one is m/7, 7 % finer) and would double the per-block overhead. Symmetric levels keep
  an exact zero (a row the batch never touched stays exactly unchanged, with no bias),
  and leave the level −8 unused so that +m and −m are both representable.
- **A float32 scale per block of 128 values.** The scale costs 32/128 = 0.25 bit per
  value, 4.25 bits in all: 7.5x fewer bytes than float32. That is the same overhead as
  the common 64 values with a float16 scale (bitsandbytes' blockwise 4-bit), but a
  float32 scale covers every magnitude a float32 delta holds (float16 scales underflow
  below 6·10⁻⁵·7, where late-training deltas live) with no exponent bookkeeping; and the
  step grows only with a block's largest value (for Gaussian values, about 2.4σ over 64
  and 2.6σ over 128: an 8 % coarser step). ``int4:<block>`` picks another even block size.
- **Round to nearest.** Deterministic (every member of a ring decodes the same bits);
  the bias it leaves on a value that repeats is what error feedback (``int4:ef``) carries.
"""

from __future__ import annotations

import numpy as np

from .base import Codec, check_finite, is_lossy_float, raw, segment
from .registry import register

__all__ = ["Int4Codec", "DEFAULT_BLOCK"]

DEFAULT_BLOCK = 128
_MAX_BLOCK = 1 << 20
_F32 = np.finfo(np.float32)

# Byte b -> its two values (low nibble first), each nibble minus 8: decoding is one gather of
# 2-byte entries (the table viewed as int16) instead of two shifts and an interleave.
_PAIRS = np.array([[(b & 15) - 8, (b >> 4) - 8] for b in range(256)],
                  dtype=np.int8).view(np.int16).reshape(256)


@register
class Int4Codec(Codec):
    """``int4[:block]``: each float tensor as 4-bit integers, two per byte, with a float32
    scale per block of ``block`` (default 128) consecutive values (in C order).

    With ``m_b = max|x|`` over a block and ``s_b = m_b/7`` (at least float32's smallest
    normal, 2⁻¹²⁶), an element is sent as ``q = rint(x/s_b)`` in [−7, 7], stored as
    ``q + 8`` in a nibble (the element of even index in the low nibble), and decoded as
    ``q·s_b`` in the input's dtype. Error bound, per element of block b:
    ``|decoded − x| ≤ m_b·(1/14 + ε) + 2⁻¹²⁷``, where ε is float32's machine epsilon
    (2⁻²³; float16's, 2⁻¹⁰, for float16 input): half a step, the rounding of the scale,
    and a floor for blocks of (nearly) zeros, which decode exactly when exactly zero.
    A tensor of n elements takes ``ceil(n/2) + 4·ceil(n/block)`` bytes.

    Raises ValueError for NaN or inf. Non-float tensors, empty ones, and float64 tensors
    beyond float32's range (m/7 > 3.4·10³⁸, where a float32 scale cannot hold the step)
    go through exactly. Error feedback is off unless asked for (``int4:ef``).
    """

    name = "int4"
    form = "int4[:block, an even number of values per scale, default 128]"
    lossless = False

    def __init__(self, block: int = DEFAULT_BLOCK, *, error_feedback: bool | None = None):
        super().__init__(error_feedback=error_feedback)
        self.block = _check_block(block)

    @classmethod
    def from_param(cls, text, error_feedback):
        if text is None:
            return cls(error_feedback=error_feedback)
        try:
            block = int(text)
        except ValueError:
            raise ValueError(f"int4 block must be an even whole number of values per scale "
                             f"(e.g. int4:64), got {text!r}") from None
        return cls(block, error_feedback=error_feedback)

    @classmethod
    def decoder(cls):
        return cls()   # the block size travels in each tensor's header

    def param_text(self):
        return None if self.block == DEFAULT_BLOCK else str(self.block)

    def predicted_nbytes(self, size, dtype):
        dtype = np.dtype(dtype)
        if dtype.kind != "f" or dtype.itemsize > 8 or size == 0:
            return size * dtype.itemsize
        return (size + 1) // 2 + 4 * (-(-size // self.block))

    def encode_tensor(self, index, a):
        if not is_lossy_float(a):
            return raw(a)
        m = check_finite(self.name, index, a)
        work = np.float64 if a.dtype == np.float64 else np.float32
        if m / 7 > float(_F32.max):
            return raw(a)   # only float64 gets here: no float32 scale holds its step
        flat = a.reshape(-1).astype(work, copy=False)
        n, b = flat.size, self.block
        nblocks = -(-n // b)
        if n % b:
            padded = np.zeros(nblocks * b, dtype=work)   # zeros: the last block's padding
            padded[:n] = flat
        else:
            padded = flat   # only read below
        blocks = padded.reshape(nblocks, b)
        # reduceat over |x|: 2x faster than blocks.max(axis=1) on rows of 128 (numpy 2.4
        # pays per row), and than a max and a min reduceat without the temporary.
        peak = np.maximum.reduceat(np.abs(flat), np.arange(0, n, b))
        scales = _scales(peak, work)
        t = np.divide(blocks, scales[:, None].astype(work, copy=False), dtype=work)
        np.rint(t, out=t)
        # |x/s| exceeds 7 by a few ulps at most (s rounded to nearest): rint gives 7, and
        # the clip makes sure of it.
        np.clip(t, -7, 7, out=t)
        t += 8
        q = t.astype(np.uint8).reshape(-1)           # even length: b is even
        packed = q[0::2] | (q[1::2] << np.uint8(4))  # both ≤ 15: stays in uint8
        # A prefix of a fresh array: contiguous, one buffer on the wire.
        return "q4", (packed[:(n + 1) // 2], scales), b

    def decode_tensor(self, method, segments, scalar, shape, dtype):
        if method != "q4":
            raise ValueError(f"malformed 'int4' payload: unknown method {method!r}")
        packed, scales = segments
        n = int(np.prod(shape, dtype=np.int64))
        try:
            b = _check_block(scalar)
        except ValueError as e:
            raise ValueError(f"malformed 'int4' payload: {e}") from None
        nblocks = -(-n // b)
        packed = segment(packed, np.uint8, (n + 1) // 2, "int4 values")
        scales = segment(scales, np.float32, nblocks, "int4 scales")
        work = np.float64 if dtype == np.float64 else np.float32
        q = np.take(_PAIRS, packed).view(np.int8)    # 2·ceil(n/2) values in [−7, 7]
        if q.size != nblocks * b:
            full = np.zeros(nblocks * b, dtype=np.int8)
            full[:q.size] = q[:nblocks * b]
            q = full
        # q·s is exact in float32 (4 bits times 24) and in float64.
        out = np.multiply(q.reshape(nblocks, b), scales[:, None].astype(work, copy=False),
                          dtype=work)
        out = out.reshape(-1)[:n]
        return out.astype(dtype, copy=False).reshape(shape)


def _check_block(block) -> int:
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) \
            or not 2 <= block <= _MAX_BLOCK or block % 2:
        raise ValueError(f"int4 block must be an even whole number of values per scale in "
                         f"[2, {_MAX_BLOCK}] (e.g. int4:64), got {block!r}")
    return int(block)


def _scales(peak: np.ndarray, work) -> np.ndarray:
    """Per block ``peak/7`` as float32: at least float32's smallest normal (a subnormal
    scale has too few bits, and a zero one would divide by zero); for float32 work at most
    the largest whose 7-fold is finite; for float64 work rounded up, so |x/s| ≤ 7 exactly."""
    s = np.divide(peak, work(7), dtype=work)
    s32 = s.astype(np.float32)
    if work is np.float64:
        # (The caller sent tensors whose m/7 exceeds float32's range as they are.)
        low = s32.astype(np.float64) < s
        s32[low] = np.nextafter(s32[low], np.float32(np.inf))
        np.maximum(s32, _F32.tiny, out=s32)
    else:
        np.clip(s32, _F32.tiny, np.nextafter(_F32.max / np.float32(7), np.float32(0)),
                out=s32)
    return s32
