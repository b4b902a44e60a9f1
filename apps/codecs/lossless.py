"""Lossless codecs: ``none``, ``lz4`` and ``zstd``. Decoding gives back every bit.

``lz4`` and ``zstd`` compress each tensor's bytes on their own, so a tensor is never
copied into one big buffer first; a tensor that does not shrink is sent as it is. On
float32 weights and deltas they save little (random low mantissa bits do not compress;
see ``docs/benchmarks/training.md``, "Codecs"); they pay off on tensors with many repeated values, such
as zeros.
"""

from __future__ import annotations

import threading

import numpy as np

from .base import Codec, CodecUnavailableError, raw, require
from .registry import register

__all__ = ["NoneCodec", "LZ4Codec", "ZstdCodec"]


@register
class NoneCodec(Codec):
    """``none``: each tensor as it is. No copy for contiguous input; ``nbytes`` equals the
    arrays' own bytes. Bit-exact."""

    name = "none"
    form = "none"

    def predicted_nbytes(self, size, dtype):
        return size * np.dtype(dtype).itemsize

    def encode_tensor(self, index, a):
        return raw(a)


class _BytesCodec(Codec):
    """A lossless codec over each tensor's raw bytes (one segment of uint8 per tensor)."""

    method = ""

    def encode_tensor(self, index, a):
        # A flat uint8 view (no copy): the compressor sees the bytes, whatever the shape.
        data = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        packed = self.compress(data)
        if len(packed) >= data.nbytes:
            # Incompressible (random float mantissas often are): sending it as it is
            # costs fewer bytes and no decoding.
            return raw(a)
        # frombuffer: the compressor's bytes become a segment without a copy.
        return self.method, (np.frombuffer(packed, dtype=np.uint8),), None

    def decode_tensor(self, method, segments, scalar, shape, dtype):
        if method != self.method:
            raise ValueError(f"malformed {self.name!r} payload: unknown method {method!r}")
        (seg,) = segments
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        # The size the frame declares is checked before decompressing, so a corrupt or
        # foreign segment cannot make us allocate more than the header's tensor.
        declared = self.declared_size(seg)
        if declared != size:
            raise ValueError(f"corrupt {self.name!r} segment: it declares {declared} bytes, "
                             f"the header's {dtype}{shape} tensor has {size}")
        try:
            data = self.decompress(seg)
        except CodecUnavailableError:
            raise
        except Exception as e:  # the libraries' own error types (LZ4BlockError, ZstdError)
            raise ValueError(f"corrupt {self.name!r} segment for a {dtype}{shape} tensor: "
                             f"{type(e).__name__}: {e}") from e
        if len(data) != size:
            raise ValueError(f"corrupt {self.name!r} segment: decompressed to {len(data)} "
                             f"bytes, the header says {size} ({dtype}{shape})")
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    def compress(self, a: np.ndarray) -> bytes:
        raise NotImplementedError

    def declared_size(self, seg: np.ndarray) -> int | None:
        """The decompressed size a segment's own frame header states (None: unknown)."""
        raise NotImplementedError

    def decompress(self, seg: np.ndarray):
        raise NotImplementedError


@register
class LZ4Codec(_BytesCodec):
    """``lz4``: LZ4 block compression of each tensor (the ``lz4`` package). Bit-exact.

    Very fast in both directions (GB/s); compresses float weights only slightly.
    """

    name = "lz4"
    form = "lz4"
    method = "lz4"

    @classmethod
    def available(cls) -> None:
        require(cls.name, "lz4.block", "lz4")

    def compress(self, a):
        return require(self.name, "lz4.block", "lz4").compress(a, store_size=True)

    def declared_size(self, seg):
        # store_size=True puts the size first, as 4 little-endian bytes.
        return int.from_bytes(bytes(seg[:4]), "little") if len(seg) >= 4 else None

    def decompress(self, seg):
        # bytearray: the decoded array is writable, at no extra copy.
        return require(self.name, "lz4.block", "lz4").decompress(seg, return_bytearray=True)


# zstd contexts are costly to make (hundreds of KB at high levels) and not thread-safe:
# keep one per thread and level, outside the codec, so codec objects stay picklable.
_zstd_local = threading.local()


@register
class ZstdCodec(_BytesCodec):
    """``zstd[:level]``: Zstandard compression of each tensor (the ``zstandard`` package),
    level 1 to 22, default 3. Bit-exact. Higher levels squeeze a little more out of
    float data at a much higher encode cost; decoding speed hardly depends on the level.
    """

    name = "zstd"
    form = "zstd[:level 1-22]"
    method = "zstd"
    default_level = 3

    def __init__(self, level: int = default_level, *, error_feedback: bool | None = None):
        super().__init__(error_feedback=error_feedback)
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)) \
                or not 1 <= level <= 22:
            raise ValueError(f"zstd level must be an int from 1 to 22, got {level!r}")
        self.level = int(level)

    @classmethod
    def from_param(cls, text, error_feedback):
        if text is None:
            return cls(error_feedback=error_feedback)
        try:
            level = int(text)
        except ValueError:
            raise ValueError(f"zstd level must be an int from 1 to 22, got {text!r}") from None
        return cls(level, error_feedback=error_feedback)

    def param_text(self):
        return None if self.level == self.default_level else str(self.level)

    @classmethod
    def available(cls) -> None:
        require(cls.name, "zstandard", "zstandard")

    def _context(self, key):
        zstd = require(self.name, "zstandard", "zstandard")
        ctx = getattr(_zstd_local, "contexts", None)
        if ctx is None:
            ctx = _zstd_local.contexts = {}
        if key not in ctx:
            ctx[key] = zstd.ZstdDecompressor() if key == "d" else zstd.ZstdCompressor(level=key)
        return ctx[key]

    def compress(self, a):
        return self._context(self.level).compress(a)

    def declared_size(self, seg):
        zstd = require(self.name, "zstandard", "zstandard")
        try:
            n = zstd.frame_content_size(seg)
        except zstd.ZstdError:
            return None
        return n if n >= 0 else None   # -1: the frame does not record its size

    def decompress(self, seg):
        return self._context("d").decompress(seg)
