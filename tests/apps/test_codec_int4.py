"""apps/codecs/int4.py: 4-bit values with a scale per block. No processes, no TensorFlow.

The shared checks (NaN/inf refused, non-float tensors sent exactly, specs, pickling, the
wire, the error-feedback sum) run for ``int4`` in ``test_codecs.py``; here are the ones
that belong to int4: its per-block bound, its bytes, its packing, and what error feedback
does for a biased 4-bit quantiser.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ddlf_actors.apps import codecs
from ddlf_actors.apps.codecs.base import RAW

FAST = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# The wide CNN's layers (models.wide_cnn, 5,106,106 parameters) and the paper CNN's.
WIDE_CNN = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (7744, 656), (656,), (656, 10), (10,)]
PAPER_CNN = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (7744, 64), (64,), (64, 10), (10,)]


def ship(payload):
    buffers = []
    data = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=[b.raw() for b in buffers])


def f64(a):
    return np.asarray(a, dtype=np.float64)


def block_peaks(x, block):
    """max |x| of each element's block (C order), per element, in float64."""
    flat = np.abs(f64(x)).reshape(-1)
    pad = -flat.size % block
    peaks = np.pad(flat, (0, pad)).reshape(-1, block).max(axis=1)
    return np.repeat(peaks, block)[:flat.size].reshape(np.shape(x))


def bound(x, block, dtype):
    eps = 2.0 ** -10 if dtype == np.float16 else 2.0 ** -23
    return block_peaks(x, block) * (1 / 14 + eps) + 2.0 ** -127


def finite(dtype):
    big = float(np.finfo(dtype).max)
    return st.floats(-big, big, width=8 * np.dtype(dtype).itemsize, allow_nan=False,
                     allow_infinity=False)


@st.composite
def float_tensors(draw):
    dtype = np.dtype(draw(st.sampled_from([np.float16, np.float32, np.float64])))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9))
    # Mostly values of one scale, sometimes spread over the whole range: both matter.
    wide = draw(st.booleans())
    elements = finite(dtype) if wide else st.floats(-3, 3, width=8 * dtype.itemsize)
    return draw(hnp.arrays(dtype, shape, elements=elements))


@pytest.mark.parametrize("block", [2, 8, 128])
@FAST
@given(arrays=st.lists(float_tensors(), min_size=1, max_size=4))
def test_int4_error_is_within_its_per_block_bound(block, arrays):
    codec = codecs.get(f"int4:{block}")
    payload = codec.encode(arrays)
    for a, b, h in zip(arrays, codec.decode(ship(payload)), payload.header):
        assert b.dtype == a.dtype and b.shape == a.shape
        if a.size == 0:
            continue
        if h[2] == RAW:   # only float64 beyond float32's range goes as it is
            assert a.dtype == np.float64 and np.abs(f64(a)).max() / 7 > np.finfo(np.float32).max
            assert np.array_equal(a, b)
            continue
        err = np.abs(f64(b) - f64(a))
        assert np.all(err <= bound(a, block, a.dtype)), float(np.max(err))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_bound_is_tight(dtype):
    # A dense grid lands next to the midpoints between levels: the bound holds and is
    # nearly reached, so a coarser quantiser (6 steps a side instead of 7) would fail it.
    x = np.linspace(-3.0, 3.0, 200_001).astype(dtype)
    codec = codecs.get("int4")
    err = np.abs(f64(codec.decode(codec.encode([x]))[0]) - f64(x))
    peaks = block_peaks(x, 128)
    assert np.all(err <= bound(x, 128, dtype))
    assert np.max(err / peaks) >= 0.99 / 14


def test_two_values_per_byte_low_nibble_first_and_the_whole_range():
    x = np.array([-7, -6, 0, 1, 7, 3, -1], np.float32)   # peak 7: the scale is 1
    payload = codecs.get("int4").encode([x])
    packed, scales = payload.segments
    assert packed.dtype == np.uint8 and packed.size == 4      # ceil(7 / 2)
    assert scales.dtype == np.float32 and scales.tolist() == [1.0]
    nibbles = np.stack([packed & 15, packed >> 4], axis=1).reshape(-1)
    assert nibbles.tolist() == [1, 2, 8, 9, 15, 11, 7, 8]     # q + 8, then a padding 0 (8)
    assert np.array_equal(codecs.get("int4").decode(payload)[0], x)


@pytest.mark.parametrize("n", [1, 2, 3, 127, 128, 129, 255, 256, 1001])
@pytest.mark.parametrize("block", [2, 64, 128])
def test_odd_and_partial_block_lengths(n, block):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    codec = codecs.get(f"int4:{block}")
    payload = codec.encode([x])
    assert payload.nbytes == (n + 1) // 2 + 4 * -(-n // block)
    assert payload.nbytes == codec.predicted_nbytes(n, np.float32)
    y = codec.decode(ship(payload))[0]
    assert y.shape == x.shape and np.all(np.abs(f64(y) - f64(x)) <= bound(x, block, x.dtype))


def test_zeros_stay_exactly_zero():
    codec = codecs.get("int4")
    zeros = np.zeros((3, 100), np.float32)
    assert np.array_equal(codec.decode(codec.encode([zeros]))[0], zeros)
    # A row the batch never touched, in a tensor with large values elsewhere: its blocks
    # are all zero and decode exactly, and so does every zero of a mixed block.
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    x[1] = 0
    x[2, ::3] = 0
    y = codec.decode(codec.encode([x]))[0]
    assert np.all(y[1] == 0) and np.all(y[2, ::3] == 0)


def test_each_block_keeps_its_own_precision():
    # int8's single scale flattens a small block next to a large one; int4's per-block
    # scale keeps it: here a block of 1e-4 values beside a block of 1e2 values.
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(128) * 1e-4, rng.standard_normal(128) * 1e2])
    x = x.astype(np.float32)
    small = slice(0, 128)
    for spec in ("int4", "int8"):
        y = codecs.get(spec).decode(codecs.get(spec).encode([x]))[0]
        rel = np.linalg.norm(f64(y[small]) - f64(x[small])) / np.linalg.norm(f64(x[small]))
        if spec == "int4":
            # Uniform rounding error: step/√12 = (peak/7)/√12 ≈ 2.6σ/24 ≈ 0.11 of the block.
            assert rel < 0.15
        else:
            assert rel > 0.9   # int8's step (max|x|/127 ≈ 2.5) zeroes the small block


def test_float16_and_float64_tensors_decode_to_their_dtype():
    codec = codecs.get("int4")
    for dtype in (np.float16, np.float64):
        x = np.linspace(-1, 1, 300).astype(dtype)
        y = codec.decode(codec.encode([x]))[0]
        assert y.dtype == dtype and np.all(np.abs(f64(y) - f64(x)) <= bound(x, 128, dtype))
    huge = np.array([1e300, -2.0], np.float64)          # no float32 scale holds its step
    payload = codec.encode([huge])
    assert payload.header[0][2] == RAW and np.array_equal(codec.decode(payload)[0], huge)


@pytest.mark.parametrize("layers", [WIDE_CNN, PAPER_CNN], ids=["wide_cnn", "paper_cnn"])
def test_at_least_7x_fewer_bytes_than_float32_on_a_models_layers(layers):
    rng = np.random.default_rng(2)
    delta = [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in layers]
    payload = codecs.get("int4").encode(delta)
    raw_bytes = sum(a.nbytes for a in delta)
    values = sum(a.size for a in delta)
    scales = sum(s.nbytes for s in payload.segments if s.dtype == np.float32)
    assert payload.nbytes == sum((a.size + 1) // 2 + 4 * -(-a.size // 128) for a in delta)
    assert raw_bytes / payload.nbytes >= 7.0, raw_bytes / payload.nbytes
    # What the scales cost: 4 bytes per block of 128, about 0.25 bit per value (a little
    # more for the small tensors' partial blocks), 5.9 % of the payload.
    assert 0.25 <= 8 * scales / values < 0.26
    assert scales / payload.nbytes < 0.06


# -- error feedback --------------------------------------------------------------------------
def test_error_feedback_delivers_what_plain_int4_biases_away():
    # The same small delta every round, as a weight that moves steadily would send. Plain
    # int4 rounds it the same way each time: its error adds up linearly. With error
    # feedback the residual carries it, and the total delivered stays within one block
    # step of the truth.
    rng = np.random.default_rng(3)
    delta = [np.concatenate([rng.standard_normal(64) * 1e-3, [5e-3] * 64]).astype(np.float32)]
    plain, ef = codecs.get("int4"), codecs.get("int4:ef")
    enc_plain, enc_ef = plain.encoder(), ef.encoder()
    assert enc_plain.residual is None and isinstance(enc_ef, codecs.ErrorFeedback)
    total = np.zeros(128)
    got_plain, got_ef = np.zeros(128), np.zeros(128)
    step = float(np.abs(delta[0]).max()) / 7
    residuals = []
    for _ in range(300):
        total += delta[0]
        got_plain += f64(plain.decode(ship(enc_plain.encode(delta)))[0])
        got_ef += f64(ef.decode(ship(enc_ef.encode(delta)))[0])
        residuals.append(enc_ef.residual_norm())
        # The residual is what is owed: decoded + residual = the sum of the deltas.
        np.testing.assert_allclose(got_ef + f64(enc_ef.residual[0]), total, rtol=0, atol=1e-5)
    # Bounded: the residual never exceeds half a step of the block whose peak it may
    # raise, per element (plus float32 rounding).
    assert np.max(np.abs(total - got_ef)) <= step * (1 + 1 / 7) / 2 * 1.01
    assert max(residuals[-100:]) <= max(residuals[:100]) * 1.5   # no drift
    gap_plain = np.max(np.abs(total - got_plain))
    assert gap_plain > 50 * np.max(np.abs(total - got_ef))


@pytest.mark.parametrize("spec", ["int4", "int4:64:noef"])
def test_error_feedback_is_off_unless_asked(spec):
    codec = codecs.get(spec)
    assert codec.error_feedback is False and type(codec.encoder()) is codecs.Encoder
    assert codecs.get(spec + ":ef" if spec == "int4" else "int4:64:ef").error_feedback


def test_block_size_travels_in_the_payload():
    x = [np.random.default_rng(4).standard_normal(1000).astype(np.float32)]
    payload = codecs.get("int4:16").encode(x)
    assert payload.header[0][4] == 16 and payload.segments[1].size == 63
    assert np.array_equal(codecs.decode(payload)[0], codecs.get("int4").decode(payload)[0])
    bad = codecs.Encoded("int4", ((payload.header[0][:4] + (3,)),), payload.segments)
    with pytest.raises(ValueError, match="malformed 'int4' payload"):
        codecs.get("int4").decode(bad)
    short = codecs.Encoded("int4", payload.header, (payload.segments[0][:-1],
                                                    payload.segments[1]))
    with pytest.raises(ValueError, match="malformed int4 values"):
        codecs.get("int4").decode(short)


@pytest.mark.parametrize("spec", ["none", "fp16", "int8", "int4", "int4:32", "topk:0.01",
                                  "topk:0.9"])
def test_predicted_bytes_match_what_is_sent(spec):
    codec = codecs.get(spec)
    rng = np.random.default_rng(5)
    for shape, dtype in [((7744, 64), np.float32), ((10,), np.float32), ((33,), np.float64),
                         ((5,), np.float16), ((4,), np.int64), ((0,), np.float32)]:
        a = (rng.standard_normal(shape) * 100).astype(dtype)
        assert codec.encode([a]).nbytes == codec.predicted_nbytes(a.size, a.dtype), shape
    for compressor in ("lz4", "zstd"):
        assert codecs.get(compressor).predicted_nbytes(10, np.float32) is None
