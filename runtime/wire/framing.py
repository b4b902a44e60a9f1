"""Length-prefixed frames: pure functions over bytes, no sockets.

A frame carries one or more *segments*: the first is a small header, the others are a
pickle payload and its protocol-5 out-of-band buffers. Large numpy arrays therefore go
to the socket as their own buffers instead of being copied into one big bytes object.

Wire layout (all integers big-endian)::

    +-------+--------+-----------+---------------------+-----------+-----+
    | magic | nseg   | body_len  | nseg x u64 lengths  | segment 0 | ... |
    | 'DF'  | u16    | u64       |                     |           |     |
    +-------+--------+-----------+---------------------+-----------+-----+

``body_len`` (the sum of segment lengths) is checked against the frame limit, and
``nseg`` against the segment limit, before anything is allocated for the frame. Any
inconsistency raises :class:`FrameError`; the caller must then abort the connection,
because after a framing error the byte stream has no trustworthy boundary left.
"""

from __future__ import annotations

import struct

import numpy as np

from .. import config
from ..errors import FrameError

__all__ = ["encode_frame", "FrameDecoder", "PREFIX_SIZE", "MAGIC"]

MAGIC = b"DF"
_PREFIX = struct.Struct("!2sHQ")
PREFIX_SIZE = _PREFIX.size
# Segments at least this large are received straight into their final buffer (no copy).
_LARGE = 256 * 1024
_STAGING = 256 * 1024


def _nbytes(seg) -> int:
    return seg.nbytes if isinstance(seg, memoryview) else len(seg)


def encode_frame(segments) -> list:
    """Return the buffers to write for one frame made of ``segments`` (bytes-like objects)."""
    lengths = [_nbytes(s) for s in segments]
    n = len(lengths)
    head = _PREFIX.pack(MAGIC, n, sum(lengths)) + struct.pack(f"!{n}Q", *lengths)
    return [head, *segments]


class FrameDecoder:
    """Incremental frame parser.

    Use :meth:`feed` with arbitrary chunks of bytes (tests, fuzzing), or the
    ``get_buffer``/``buffer_updated`` pair from an ``asyncio.BufferedProtocol`` so that
    large segments are received directly into their own buffer. Both return a list of
    complete frames, each a list of segments (``bytearray``, or a ``memoryview`` over an
    uninitialised numpy buffer for large ones). Truncated input simply
    waits for more; malformed input raises :class:`FrameError`.
    """

    __slots__ = (
        "max_frame_bytes",
        "max_segments",
        "_buf",
        "_nseg",
        "_body_len",
        "_lengths",
        "_segs",
        "_big",
        "_big_fill",
        "_staging",
    )

    def __init__(self, max_frame_bytes: int | None = None, max_segments: int | None = None):
        self.max_frame_bytes = config.MAX_FRAME_BYTES if max_frame_bytes is None else max_frame_bytes
        self.max_segments = config.MAX_SEGMENTS if max_segments is None else max_segments
        self._buf = bytearray()
        self._nseg = 0
        self._body_len = 0
        self._lengths: tuple | None = None
        self._segs: list = []
        self._big: memoryview | None = None
        self._big_fill = 0
        self._staging: memoryview | None = None

    # -- buffered-protocol interface -------------------------------------------------
    def get_buffer(self) -> memoryview:
        if self._big is not None:
            return self._big[self._big_fill :]
        if self._staging is None:
            self._staging = memoryview(bytearray(_STAGING))
        return self._staging

    def buffer_updated(self, nbytes: int) -> list:
        if self._big is not None:
            self._big_fill += nbytes
            if self._big_fill < len(self._big):
                return []
            self._finish_big()
            return self._drain()
        # BufferedProtocol calls get_buffer before every buffer_updated; with no big segment
        # open, get_buffer handed out (and so allocated) the staging buffer.
        assert self._staging is not None
        return self.feed(self._staging[:nbytes])

    # -- chunk interface --------------------------------------------------------------
    def feed(self, data) -> list:
        data = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
        if self._big is not None:
            take = min(len(data), len(self._big) - self._big_fill)
            self._big[self._big_fill : self._big_fill + take] = data[:take]
            self._big_fill += take
            if self._big_fill < len(self._big):
                return []
            self._finish_big()
            data = data[take:]
        self._buf += data
        return self._drain()

    @property
    def pending_bytes(self) -> int:
        """Bytes received that do not yet form a complete frame, including the parts of
        an unfinished frame (prefix, length table, whole segments) already parsed."""
        n = len(self._buf)
        if self._nseg:
            n += PREFIX_SIZE
            if self._lengths is not None:
                n += 8 * self._nseg + sum(self._lengths[: len(self._segs)])
        if self._big is not None:
            n += self._big_fill
        return n

    def _finish_big(self) -> None:
        self._segs.append(self._big)
        self._big = None
        self._big_fill = 0

    def _drain(self) -> list:
        frames = []
        buf = self._buf
        off = 0
        end = len(buf)
        while True:
            if self._lengths is None:
                if self._nseg == 0:
                    if end - off < PREFIX_SIZE:
                        break
                    magic, nseg, body_len = _PREFIX.unpack_from(buf, off)
                    if magic != MAGIC:
                        raise FrameError(f"bad frame magic {bytes(magic)!r}: not a DDLF peer, or the stream is corrupt")
                    if not 1 <= nseg <= self.max_segments:
                        raise FrameError(f"frame declares {nseg} segments; the limit is 1..{self.max_segments}")
                    if body_len > self.max_frame_bytes:
                        raise FrameError(
                            f"frame declares {body_len} bytes, over the limit of {self.max_frame_bytes} "
                            "(raise it with DDLF_MAX_FRAME_BYTES on every host)"
                        )
                    off += PREFIX_SIZE
                    self._nseg = nseg
                    self._body_len = body_len
                need = 8 * self._nseg
                if end - off < need:
                    break
                lengths = struct.unpack_from(f"!{self._nseg}Q", buf, off)
                off += need
                if sum(lengths) != self._body_len:
                    raise FrameError("frame segment lengths do not add up to its declared size")
                self._lengths = lengths
                self._segs = []
            lengths = self._lengths
            segs = self._segs
            while len(segs) < len(lengths):
                size = lengths[len(segs)]
                avail = end - off
                if avail >= size:
                    segs.append(bytearray(buf[off : off + size]))
                    off += size
                elif size >= _LARGE:
                    # Receive the rest of this segment straight into its final buffer.
                    # np.empty, unlike bytearray(size), does not zero-fill: that would be
                    # a whole extra pass over a 100 MB buffer that recv overwrites anyway.
                    big = np.empty(size, dtype=np.uint8).data   # a memoryview of it
                    big[:avail] = buf[off:end]
                    off = end
                    self._big = big
                    self._big_fill = avail
                    break
                else:
                    break
            if len(segs) < len(lengths):
                break
            frames.append(segs)
            self._lengths = None
            self._nseg = 0
            self._segs = []
        if off:
            del buf[:off]
        return frames

