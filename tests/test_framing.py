"""Frame encoding/decoding: pure functions over bytes, no sockets."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlf_actors.runtime.errors import FrameError
from ddlf_actors.runtime.wire.framing import MAGIC, PREFIX_SIZE, FrameDecoder, encode_frame

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LARGE = 256 * 1024  # segments at least this big take the decoder's direct-receive path


# -- helpers ---------------------------------------------------------------------------------
def wire(segments) -> bytes:
    """The exact bytes one frame puts on the wire."""
    return b"".join(bytes(b) for b in encode_frame(segments))


def manual_frame(segments, *, magic=b"DF", nseg=None, body_len=None, lengths=None) -> bytes:
    """Build a frame by hand from the documented layout (independent of encode_frame)."""
    lens = [len(s) for s in segments] if lengths is None else list(lengths)
    n = len(lens) if nseg is None else nseg
    total = sum(len(s) for s in segments) if body_len is None else body_len
    return (magic + struct.pack("!H", n) + struct.pack("!Q", total)
            + b"".join(struct.pack("!Q", x) for x in lens) + b"".join(segments))


def as_bytes(frames) -> list[list[bytes]]:
    return [[bytes(s) for s in f] for f in frames]


def feed_chunks(dec: FrameDecoder, data: bytes, sizes) -> list:
    """Feed ``data`` in chunks of the given sizes (cycled), collecting every frame."""
    frames = []
    pos = 0
    i = 0
    sizes = list(sizes) or [1]
    while pos < len(data):
        n = max(1, sizes[i % len(sizes)])
        frames += dec.feed(data[pos : pos + n])
        pos += n
        i += 1
    return frames


def feed_buffered(dec: FrameDecoder, data, max_chunk: int | None = None) -> list:
    """Drive the decoder the way asyncio.BufferedProtocol does: get_buffer, copy, buffer_updated."""
    mv = memoryview(data).cast("B")
    frames = []
    pos = 0
    while pos < len(mv):
        buf = dec.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), len(mv) - pos)
        if max_chunk is not None:
            n = min(n, max_chunk)
        buf[:n] = mv[pos : pos + n]
        frames += dec.buffer_updated(n)
        pos += n
    return frames


segment_st = st.binary(min_size=0, max_size=300)
frame_st = st.lists(segment_st, min_size=1, max_size=6)


# -- layout ----------------------------------------------------------------------------------
def test_layout_matches_documentation():
    segs = [b"hdr", b"", b"payload!"]
    assert wire(segs) == manual_frame(segs)
    assert PREFIX_SIZE == 12
    assert MAGIC == b"DF"


def test_encode_accepts_memoryview_and_numpy_segments():
    arr = np.arange(1000, dtype=np.float64)
    segs = [b"h", memoryview(arr).cast("B"), bytearray(b"xy")]
    frames = FrameDecoder().feed(wire(segs))
    assert len(frames) == 1
    assert bytes(frames[0][0]) == b"h"
    assert np.array_equal(np.frombuffer(frames[0][1], dtype=np.float64), arr)
    assert bytes(frames[0][2]) == b"xy"


# -- round trips ---------------------------------------------------------------------------
def test_round_trip_single_frame():
    segs = [b"header", b"pickle-payload", os.urandom(1000)]
    frames = FrameDecoder().feed(wire(segs))
    assert as_bytes(frames) == [segs]


def test_round_trip_empty_segments():
    segs = [b"", b"", b""]
    frames = FrameDecoder().feed(wire(segs))
    assert as_bytes(frames) == [segs]


def test_several_frames_back_to_back():
    all_segs = [[b"a"], [b"bb", b"ccc"], [os.urandom(5000), b"", b"z"], [b"last"]]
    data = b"".join(wire(s) for s in all_segs)
    dec = FrameDecoder()
    assert as_bytes(dec.feed(data)) == all_segs
    assert dec.pending_bytes == 0
    # The decoder is reusable afterwards.
    assert as_bytes(dec.feed(wire([b"again"]))) == [[b"again"]]


def test_one_byte_at_a_time():
    all_segs = [[b"a", b"bc"], [os.urandom(700)], [b"", b"x"]]
    data = b"".join(wire(s) for s in all_segs)
    dec = FrameDecoder()
    frames = []
    for i in range(len(data)):
        frames += dec.feed(data[i : i + 1])
    assert as_bytes(frames) == all_segs
    assert dec.pending_bytes == 0


def test_feed_accepts_memoryview_chunks():
    segs = [b"h", os.urandom(4000)]
    data = wire(segs)
    dec = FrameDecoder()
    frames = feed_chunks(dec, memoryview(data), [7, 300, 1])
    assert as_bytes(frames) == [segs]


@FUZZ
@given(frames=st.lists(frame_st, min_size=1, max_size=5),
       sizes=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=20))
def test_round_trip_random_chunks(frames, sizes):
    data = b"".join(wire(f) for f in frames)
    dec = FrameDecoder()
    assert as_bytes(feed_chunks(dec, data, sizes)) == frames
    assert dec.pending_bytes == 0


@FUZZ
@given(frames=st.lists(frame_st, min_size=1, max_size=5),
       max_chunk=st.integers(min_value=1, max_value=500))
def test_round_trip_buffered_protocol_random(frames, max_chunk):
    data = b"".join(wire(f) for f in frames)
    dec = FrameDecoder()
    assert as_bytes(feed_buffered(dec, data, max_chunk)) == frames


@pytest.mark.parametrize("size", [LARGE, LARGE + 1, 3 * LARGE + 17])
@pytest.mark.parametrize("chunk", [1000, 64 * 1024, 300 * 1024])
def test_large_segment_via_feed(size, chunk):
    big = os.urandom(size)
    segs = [b"head", big, b"tail"]
    data = wire(segs) + wire([b"next"])
    dec = FrameDecoder()
    frames = feed_chunks(dec, data, [chunk])
    assert as_bytes(frames) == [segs, [b"next"]]
    assert dec.pending_bytes == 0


def test_large_segment_is_received_into_its_own_buffer():
    """A large segment that arrives in pieces goes to the direct path (not a bytearray copy)."""
    big = os.urandom(2 * LARGE)
    dec = FrameDecoder()
    data = wire([b"h", big])
    frames = feed_chunks(dec, data, [4096])
    assert len(frames) == 1
    seg = frames[0][1]
    assert bytes(seg) == big
    # Received straight into its own buffer: exactly the segment's size, nothing shared.
    assert memoryview(seg).nbytes == len(big)


@pytest.mark.parametrize("max_chunk", [None, 1, 4096, 100_000])
def test_buffered_protocol_interface_large_segment(max_chunk):
    big = os.urandom(4 * LARGE + 3)
    all_segs = [[b"h1", big, b"t"], [b"small"], [b"h3", os.urandom(LARGE)]]
    data = b"".join(wire(s) for s in all_segs)
    dec = FrameDecoder()
    if max_chunk == 1:
        # one byte at a time over ~1.3 MB is slow in pure Python; only do the first frame
        # header byte-wise, then the rest in larger reads.
        head = len(wire([b"h1", big, b"t"])) - len(big) - 1
        frames = feed_buffered(dec, data[:head], 1) + feed_buffered(dec, data[head:], 8192)
    else:
        frames = feed_buffered(dec, data, max_chunk)
    assert as_bytes(frames) == all_segs
    assert dec.pending_bytes == 0


def test_buffered_protocol_get_buffer_for_big_segment_is_remaining_space():
    big = os.urandom(LARGE * 2)
    data = wire([b"h", big])
    dec = FrameDecoder()
    first = 12 + 16 + 1 + 1000
    buf = dec.get_buffer()
    buf[:first] = data[:first]
    assert dec.buffer_updated(first) == []
    # Now inside the large segment: the buffer offered must be exactly what is missing of it,
    # so that a recv can never run past the segment into the next frame.
    buf = dec.get_buffer()
    assert len(buf) == len(big) - 1000
    buf[:] = data[first:]
    frames = dec.buffer_updated(len(buf))
    assert as_bytes(frames) == [[b"h", big]]


def test_100mb_segment_round_trip():
    n = 100 * 1024 * 1024
    arr = np.random.default_rng(0).integers(0, 256, size=n, dtype=np.uint8)
    buffers = encode_frame([b"hdr", memoryview(arr)])
    head = bytes(buffers[0])
    src = memoryview(arr)
    dec = FrameDecoder()
    frames = dec.feed(head + b"hdr")
    assert frames == []
    step = 1 << 20
    for off in range(0, n, step):
        frames += dec.feed(src[off : off + step])
    assert len(frames) == 1
    got = frames[0]
    assert bytes(got[0]) == b"hdr"
    out = np.frombuffer(got[1], dtype=np.uint8)
    assert out.shape == (n,)
    assert np.array_equal(out, arr)
    assert dec.pending_bytes == 0


# -- malformed input -------------------------------------------------------------------------
def test_oversized_prefix_raises_before_allocating():
    dec = FrameDecoder(max_frame_bytes=1000)
    prefix = b"DF" + struct.pack("!HQ", 1, 10**12)
    assert len(prefix) == PREFIX_SIZE
    with pytest.raises(FrameError):
        dec.feed(prefix)


def test_oversized_prefix_raises_byte_by_byte():
    dec = FrameDecoder(max_frame_bytes=1000)
    prefix = b"DF" + struct.pack("!HQ", 1, 10**12)
    for b in prefix[:-1]:
        assert dec.feed(bytes([b])) == []
    with pytest.raises(FrameError):
        dec.feed(prefix[-1:])


def test_oversized_prefix_via_buffered_protocol():
    dec = FrameDecoder(max_frame_bytes=1000)
    prefix = b"DF" + struct.pack("!HQ", 1, 1001)
    buf = dec.get_buffer()
    buf[: len(prefix)] = prefix
    with pytest.raises(FrameError):
        dec.buffer_updated(len(prefix))


def test_frame_at_the_limit_is_accepted():
    dec = FrameDecoder(max_frame_bytes=1000)
    segs = [b"x" * 400, b"y" * 600]
    assert as_bytes(dec.feed(manual_frame(segs))) == [segs]
    with pytest.raises(FrameError):
        FrameDecoder(max_frame_bytes=999).feed(manual_frame(segs))


def test_default_limit_rejects_huge_declared_size():
    with pytest.raises(FrameError):
        FrameDecoder().feed(b"DF" + struct.pack("!HQ", 1, 2**64 - 1))


def test_zero_segments_raises():
    with pytest.raises(FrameError):
        FrameDecoder().feed(manual_frame([], nseg=0, body_len=0))


def test_zero_segments_raises_on_prefix_alone():
    with pytest.raises(FrameError):
        FrameDecoder().feed(b"DF" + struct.pack("!HQ", 0, 0))


def test_too_many_segments_raises():
    dec = FrameDecoder(max_segments=4)
    assert as_bytes(dec.feed(manual_frame([b"a"] * 4))) == [[b"a"] * 4]
    with pytest.raises(FrameError):
        FrameDecoder(max_segments=4).feed(b"DF" + struct.pack("!HQ", 5, 5))
    with pytest.raises(FrameError):
        FrameDecoder().feed(b"DF" + struct.pack("!HQ", 65535, 0))


@pytest.mark.parametrize("magic", [b"XX", b"df", b"FD", b"\x00\x00", b"GE"])
def test_bad_magic_raises(magic):
    with pytest.raises(FrameError):
        FrameDecoder().feed(manual_frame([b"abc"], magic=magic))


def test_bad_magic_after_a_good_frame_raises():
    dec = FrameDecoder()
    good = wire([b"ok"])
    with pytest.raises(FrameError):
        dec.feed(good + b"GET / HTTP/1.1\r\n\r\n")


@pytest.mark.parametrize("lengths,body_len", [
    ([3, 3], 5),       # sum larger than declared
    ([1, 1], 5),       # sum smaller than declared
    ([0], 3),
    ([2**63, 2**63], 0),  # would wrap a 64-bit sum
])
def test_lengths_not_summing_to_body_len_raise(lengths, body_len):
    frame = manual_frame([b"abc", b"def"], body_len=body_len, lengths=lengths)
    with pytest.raises(FrameError):
        FrameDecoder().feed(frame)


def test_lengths_mismatch_detected_before_body_arrives():
    frame = manual_frame([b"abc", b"def"], body_len=6, lengths=[4, 3])
    head = frame[: PREFIX_SIZE + 16]
    with pytest.raises(FrameError):
        FrameDecoder().feed(head)


# -- truncated input -------------------------------------------------------------------------
def test_every_strict_prefix_yields_nothing():
    segs = [b"hdr", os.urandom(200), b"", b"tail"]
    data = wire(segs)
    for i in range(len(data)):
        dec = FrameDecoder()
        assert dec.feed(data[:i]) == []
        # ... and the rest completes it.
        assert as_bytes(dec.feed(data[i:])) == [segs]


def test_strict_prefix_of_large_frame_yields_nothing():
    big = os.urandom(LARGE * 2)
    data = wire([b"h", big])
    for cut in (0, 5, PREFIX_SIZE, PREFIX_SIZE + 16, PREFIX_SIZE + 17, PREFIX_SIZE + 18 + LARGE,
                len(data) - 1):
        dec = FrameDecoder()
        assert feed_chunks(dec, data[:cut], [10_000]) == []
        assert as_bytes(dec.feed(data[cut:])) == [[b"h", big]]


@pytest.mark.parametrize("big", [False, True])
def test_pending_bytes_counts_a_partial_frame(big):
    """``pending_bytes`` is documented as the bytes received that do not yet form a frame."""
    segs = [b"hdr", os.urandom(2 * LARGE if big else 200), b"tail"]
    data = wire(segs)
    for cut in (1, PREFIX_SIZE - 1, PREFIX_SIZE, PREFIX_SIZE + 24, PREFIX_SIZE + 24 + 3,
                PREFIX_SIZE + 24 + 100, len(data) - 1):
        dec = FrameDecoder()
        assert feed_chunks(dec, data[:cut], [4096]) == []
        assert dec.pending_bytes == cut, f"after {cut} of {len(data)} bytes"


@FUZZ
@given(segs=frame_st, data=st.data())
def test_truncated_frame_random(segs, data):
    raw = wire(segs)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    sizes = data.draw(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=5))
    dec = FrameDecoder()
    assert feed_chunks(dec, raw[:cut], sizes) == []


# -- fuzzing -------------------------------------------------------------------------------
def _feed_expect_frames_or_frame_error(dec, data: bytes, sizes) -> None:
    try:
        frames = feed_chunks(dec, data, sizes)
    except FrameError:
        return
    for f in frames:
        assert isinstance(f, list) and f
        for s in f:
            memoryview(s)  # every segment is a bytes-like object


@FUZZ
@given(data=st.binary(max_size=2000),
       sizes=st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=10),
       small_limit=st.booleans())
def test_fuzz_arbitrary_bytes(data, sizes, small_limit):
    dec = FrameDecoder(max_frame_bytes=4096) if small_limit else FrameDecoder()
    _feed_expect_frames_or_frame_error(dec, data, sizes)


@FUZZ
@given(tail=st.binary(max_size=500),
       nseg=st.integers(min_value=0, max_value=70000),
       body=st.integers(min_value=0, max_value=2**64 - 1),
       sizes=st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=10))
def test_fuzz_arbitrary_bytes_after_valid_magic(tail, nseg, body, sizes):
    """Random bytes are unlikely to start with the magic: force it, with random lengths."""
    head = b"DF" + struct.pack("!H", min(nseg, 65535)) + struct.pack("!Q", body)
    dec = FrameDecoder(max_frame_bytes=1 << 20)
    _feed_expect_frames_or_frame_error(dec, head + tail, sizes)


@FUZZ
@given(segs=st.lists(segment_st, min_size=1, max_size=4), data=st.data())
def test_fuzz_mutated_valid_frames(segs, data):
    raw = bytearray(wire(segs) * 2)
    op = data.draw(st.sampled_from(["flip", "truncate", "append", "splice"]))
    if op == "flip":
        for _ in range(data.draw(st.integers(min_value=1, max_value=8))):
            i = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
            raw[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    elif op == "truncate":
        raw = raw[: data.draw(st.integers(min_value=0, max_value=len(raw)))]
    elif op == "append":
        raw += data.draw(st.binary(min_size=1, max_size=200))
    else:
        i = data.draw(st.integers(min_value=0, max_value=len(raw)))
        raw[i:i] = data.draw(st.binary(min_size=1, max_size=40))
    sizes = data.draw(st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=5))
    dec = FrameDecoder(max_frame_bytes=1 << 20)
    _feed_expect_frames_or_frame_error(dec, bytes(raw), sizes)


@FUZZ
@given(segs=st.lists(segment_st, min_size=1, max_size=4), data=st.data())
def test_fuzz_mutated_frames_buffered_protocol(segs, data):
    raw = bytearray(wire(segs))
    i = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[i] = data.draw(st.integers(min_value=0, max_value=255))
    raw += data.draw(st.binary(max_size=100))
    dec = FrameDecoder(max_frame_bytes=1 << 20)
    try:
        feed_buffered(dec, bytes(raw), data.draw(st.integers(min_value=1, max_value=64)))
    except FrameError:
        pass


def test_random_garbage_seeded():
    """A longer deterministic garbage run, mixed with valid frames."""
    rng = random.Random(1234)
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(1, 5)):
            if rng.random() < 0.5:
                parts.append(wire([rng.randbytes(rng.randint(0, 50)) for _ in range(rng.randint(1, 3))]))
            else:
                parts.append(rng.randbytes(rng.randint(1, 60)))
        data = b"".join(parts)
        dec = FrameDecoder(max_frame_bytes=1 << 16)
        _feed_expect_frames_or_frame_error(dec, data, [rng.randint(1, 30)])
