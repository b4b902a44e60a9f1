"""apps/codecs: round trips, error bounds, error feedback, specs. No processes, no TensorFlow.

Each lossy codec's docstring states its error bound; the tests below assert exactly that
inequality (with float64 arithmetic on the test's side, where the difference of the
input and its decoding is exact).
"""

from __future__ import annotations

import math
import pickle
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ddlf_actors.apps import codecs
from ddlf_actors.apps.codecs import registry
from ddlf_actors.apps.codecs.base import RAW, Codec, raw

LOSSLESS = ["none", "lz4", "zstd", "zstd:19"]
LOSSY = ["fp16", "int8", "int4", "int4:64", "topk:0.01", "topk:0.1", "topk:0.5"]
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DTYPES = st.sampled_from([np.float16, np.float32, np.float64, np.int8, np.int32, np.int64,
                          np.uint8, np.bool_, np.complex64])
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)


@st.composite
def layouts(draw, arr):
    """``arr`` as it is, or as a non-contiguous view of a bigger array, or Fortran-ordered."""
    how = draw(st.sampled_from(["c", "fortran", "transpose", "strided"]))
    if how == "fortran":
        return np.asfortranarray(arr)
    if how == "transpose":
        return arr.T
    if how == "strided" and arr.ndim:
        big = np.repeat(arr, 2, axis=-1)   # every other element of big is arr
        return big[..., ::2]
    return arr


@st.composite
def tensor_lists(draw, dtypes=DTYPES, elements=None, shapes=SHAPES, max_tensors=4):
    n = draw(st.integers(1, max_tensors))
    out = []
    for _ in range(n):
        dtype = np.dtype(draw(dtypes))
        arr = draw(hnp.arrays(dtype, draw(shapes),
                              elements=elements(dtype) if elements else None))
        out.append(draw(layouts(arr)))
    return out


def ship(payload):
    """Through pickle protocol 5, every buffer out of band, as DDLF's wire does it."""
    buffers = []
    data = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=[b.raw() for b in buffers])


def f64(a):
    return np.asarray(a, dtype=np.float64)


# -- lossless ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", LOSSLESS)
@FAST
@given(arrays=tensor_lists())
def test_lossless_codecs_round_trip_bit_exactly(spec, arrays):
    codec = codecs.get(spec)
    out = codec.decode(ship(codec.encode(arrays)))
    assert len(out) == len(arrays)
    for a, b in zip(arrays, out):
        assert b.shape == a.shape and b.dtype == a.dtype
        # Bytes, not values: NaN payloads and -0.0 must survive too.
        assert np.ascontiguousarray(b).tobytes() == np.ascontiguousarray(a).tobytes()


def test_none_sends_the_arrays_bytes_and_nothing_else():
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(5), np.int64(7)]
    payload = codecs.get("none").encode(arrays)
    assert payload.nbytes == sum(a.nbytes for a in arrays)


def test_lossless_codecs_shrink_redundant_data_and_never_grow_it():
    zeros = np.zeros((256, 256), np.float32)
    noise = np.random.default_rng(7).integers(0, 256, 100_000, dtype=np.uint8)
    for spec in ("lz4", "zstd"):
        codec = codecs.get(spec)
        payload = codec.encode([zeros, noise])
        assert payload.segments[0].nbytes < zeros.nbytes / 50
        assert payload.header[1][2] == RAW and payload.segments[1].nbytes == noise.nbytes
        assert np.array_equal(codec.decode(payload)[1], noise)


@pytest.mark.parametrize("spec", ["fp16", "int8", "int4", "topk:0.1"])
@FAST
@given(arrays=tensor_lists(dtypes=st.sampled_from([np.int8, np.int32, np.int64, np.uint8,
                                                   np.bool_, np.complex64])))
def test_lossy_codecs_send_non_float_tensors_exactly(spec, arrays):
    codec = codecs.get(spec)
    payload = codec.encode(arrays)
    assert all(h[2] == RAW for h in payload.header)
    for a, b in zip(arrays, codec.decode(ship(payload))):
        assert b.dtype == a.dtype and b.shape == a.shape
        assert np.ascontiguousarray(b).tobytes() == np.ascontiguousarray(a).tobytes()


# -- lossy: the stated bounds --------------------------------------------------------------
def finite(lo=None, hi=None):
    def elements(dtype):
        width = 8 * dtype.itemsize
        big = float(np.finfo(dtype).max)
        return st.floats(-big if lo is None else lo, big if hi is None else hi, width=width,
                         allow_nan=False, allow_infinity=False)
    return elements


def fp16_bound(x):
    x = f64(x)
    return np.maximum(np.abs(x) * 2.0 ** -11, 2.0 ** -39 * np.max(np.abs(x)))


@FAST
@given(arrays=tensor_lists(dtypes=st.sampled_from([np.float32, np.float64]),
                           elements=finite()))
def test_fp16_error_is_within_its_bound(arrays):
    codec = codecs.get("fp16")
    payload = codec.encode(arrays)
    for a, b in zip(arrays, codec.decode(ship(payload))):
        assert b.dtype == a.dtype and b.shape == a.shape
        if a.size:
            assert np.all(np.abs(f64(b) - f64(a)) <= fp16_bound(a))
    sent = [seg for seg, h in zip(payload.segments, payload.header) if h[2] != RAW]
    assert all(seg.dtype == np.float16 for seg in sent)


@FAST
@given(arrays=tensor_lists(dtypes=st.sampled_from([np.float16, np.float32, np.float64]),
                           elements=finite()))
def test_int8_error_is_within_its_bound(arrays):
    codec = codecs.get("int8")
    for a, b in zip(arrays, codec.decode(ship(codec.encode(arrays)))):
        assert b.dtype == a.dtype and b.shape == a.shape
        if a.size == 0:
            continue
        x, y = f64(a), f64(b)
        m = float(np.max(np.abs(x)))
        eps = float(np.finfo(a.dtype).eps)
        assert np.all(np.abs(y - x) <= m * (1 / 254 + eps))


@pytest.mark.parametrize("spec, dtype", [("int8", np.float32), ("int8", np.float64),
                                         ("fp16", np.float32), ("fp16", np.float64)])
def test_the_stated_bounds_are_tight(spec, dtype):
    # A dense grid lands next to the midpoints between representable values, where the
    # error is largest: the bound holds there, and is nearly reached (so a coarser
    # quantiser, e.g. 126 steps instead of 127, would fail it).
    x = np.linspace(-3.0, 3.0, 200_001).astype(dtype)
    codec = codecs.get(spec)
    err = np.abs(f64(codec.decode(codec.encode([x]))[0]) - f64(x))
    if spec == "int8":
        bound = 3.0 * (1 / 254 + np.finfo(dtype).eps)
        assert err.max() <= bound and err.max() >= 0.99 * 3.0 / 254
    else:
        bound = fp16_bound(x)
        assert np.all(err <= bound) and np.max(err / bound) >= 0.99


def test_int8_uses_one_byte_per_value_and_its_whole_range():
    x = np.linspace(-3, 3, 1001).astype(np.float32)
    payload = codecs.get("int8").encode([x])
    (q,) = payload.segments
    assert q.dtype == np.int8 and payload.nbytes == x.size
    assert q.min() == -127 and q.max() == 127


def test_int8_sends_tensors_with_a_subnormal_scale_exactly():
    x = np.array([1e-40, -3e-41, 0.0], dtype=np.float32)   # max|x|/127 is subnormal
    codec = codecs.get("int8")
    payload = codec.encode([x])
    assert payload.header[0][2] == RAW
    assert np.array_equal(codec.decode(payload)[0], x)


@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.3, 1.0])
@FAST
@given(arrays=tensor_lists(dtypes=st.sampled_from([np.float32, np.float64]),
                           elements=finite(-1e6, 1e6),
                           shapes=hnp.array_shapes(min_dims=1, max_dims=2, min_side=1,
                                                   max_side=40)))
def test_topk_keeps_exactly_the_largest_entries(fraction, arrays):
    codec = codecs.TopKCodec(fraction)
    payload = codec.encode(arrays)
    pos = 0
    for a, b, (_, _, method, nseg, _) in zip(arrays, codec.decode(ship(payload)),
                                             payload.header):
        segs = payload.segments[pos:pos + nseg]
        pos += nseg
        assert b.dtype == a.dtype and b.shape == a.shape
        x, y = f64(a).ravel(), f64(b).ravel()
        if method == RAW:   # cheaper whole: sent exactly
            assert np.array_equal(x, y)
            continue
        n, k = x.size, codec.kept(x.size)
        idx = segs[0].astype(np.int64)
        assert len(np.unique(idx)) == k == max(1, round(fraction * n))
        assert np.array_equal(y[idx], x[idx])
        dropped = np.ones(n, bool)
        dropped[idx] = False
        assert np.all(y[dropped] == 0)
        if dropped.any():
            assert np.abs(x[dropped]).max() <= np.abs(x[idx]).min()
        # ‖decoded − x‖² ≤ (1 − k/n)‖x‖², up to the rounding of the test's own sums.
        assert math.fsum((y - x) ** 2) <= (1 - k / n) * math.fsum(x ** 2) * (1 + 1e-12)


@pytest.mark.parametrize("nonzero", [30, 100, 900])
def test_topk_of_a_mostly_zero_tensor_keeps_the_largest_and_exactly_k(nonzero):
    # A change of weights that sparse deltas left mostly untouched: the non-zero entries
    # are selected among themselves (numpy's selection crawls on equal values).
    rng = np.random.default_rng(1)
    x = np.zeros(10_000, np.float32)
    at = rng.choice(x.size, nonzero, replace=False)
    x[at] = rng.standard_normal(nonzero).astype(np.float32)
    codec = codecs.get("topk:0.01")
    payload = codec.encode([x])
    (y,) = codec.decode(payload)
    idx = payload.segments[0].astype(np.int64)
    assert idx.size == len(np.unique(idx)) == 100
    assert np.array_equal(y[idx], x[idx]) and np.all(np.delete(y, idx) == 0)
    kept = min(nonzero, 100)
    assert np.array_equal(np.sort(np.abs(y))[-kept:], np.sort(np.abs(x))[-kept:])
    if nonzero <= 100:
        assert np.array_equal(y, x)   # every non-zero entry fits: exact


def test_topk_payload_is_indices_and_values():
    x = np.random.default_rng(0).standard_normal((100, 1000)).astype(np.float32)
    payload = codecs.get("topk:0.01").encode([x])
    idx, vals = payload.segments
    assert idx.dtype == np.uint32 and vals.dtype == np.float32 and idx.size == 1000
    assert np.all(np.diff(idx.astype(np.int64)) > 0)
    assert payload.nbytes == 1000 * 8   # 50x fewer bytes than the 400,000 of x


@pytest.mark.parametrize("spec", LOSSY)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_lossy_codecs_refuse_nan_and_inf_naming_the_tensor(spec, bad):
    arrays = [np.ones(4, np.float32), np.array([1.0, bad, 2.0], np.float32)]
    with pytest.raises(ValueError, match=r"tensor 1 .*NaN or inf"):
        codecs.get(spec).encode(arrays)


@pytest.mark.parametrize("magnitude", [1e-7, 1e-3, 1e6, 1e30])
def test_fp16_keeps_relative_precision_for_tiny_and_huge_tensors(magnitude):
    # Plain float16 turns 1e6 into inf and rounds 1e-7 to a subnormal with 2 significant
    # bits; the power-of-two scale keeps 11 bits for both.
    x = (np.random.default_rng(6).standard_normal(1000) * magnitude).astype(np.float32)
    codec = codecs.get("fp16")
    payload = codec.encode([x])
    assert payload.segments[0].dtype == np.float16 and payload.nbytes == 2000
    y = codec.decode(payload)[0]
    big = np.abs(x) >= 2.0 ** -28 * np.abs(x).max()
    assert np.all(np.abs(f64(y) - f64(x))[big] <= 2.0 ** -11 * np.abs(f64(x))[big])


def test_lossy_codecs_keep_dtype_and_pass_float16_through_fp16():
    h = np.array([0.1, -2.5], np.float16)
    payload = codecs.get("fp16").encode([h])
    assert payload.header[0][2] == RAW and codecs.get("fp16").decode(payload)[0].dtype == np.float16
    x = np.array([0.1, -2.5], np.float64)
    assert codecs.get("int8").decode(codecs.get("int8").encode([x]))[0].dtype == np.float64


# -- error feedback ------------------------------------------------------------------------
def _deltas(rng, steps, shapes, dtype=np.float32):
    return [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]


@pytest.mark.parametrize("spec", ["topk:0.01", "topk:0.1", "int8:ef", "fp16:ef", "int4:ef"])
def test_error_feedback_sum_of_decoded_plus_residual_is_sum_of_deltas(spec):
    codec = codecs.get(spec)
    enc = codec.encoder()
    assert isinstance(enc, codecs.ErrorFeedback)
    rng = np.random.default_rng(1)
    shapes = [(3, 3, 1, 8), (8,), (40, 30), ()]
    steps = _deltas(rng, 30, shapes)
    true = [np.zeros(s) for s in shapes]
    got = [np.zeros(s) for s in shapes]
    for delta in steps:
        dec = codec.decode(ship(enc.encode(delta)))
        for i, (d, y) in enumerate(zip(delta, dec)):
            true[i] += d
            got[i] += y
        for t, g, r in zip(true, got, enc.residual):
            r = 0.0 if r is None else f64(r)
            # float32 rounding of (delta + residual) in each step, summed over the steps.
            np.testing.assert_allclose(g + r, t, rtol=0, atol=1e-4)


@pytest.mark.parametrize("fraction", [0.01, 0.1])
def test_topk_residual_stays_within_the_contraction_bound(fraction):
    """Per tensor, ‖r'‖ ≤ √(1−δ)·(‖delta‖ + ‖r‖) with δ = k/n, so from r = 0 the residual
    never exceeds √(1−δ)·A / (1 − √(1−δ)), A the largest ‖delta‖ seen."""
    codec = codecs.TopKCodec(fraction)
    enc = codec.encoder()
    rng = np.random.default_rng(2)
    shapes = [(50, 20), (300,)]
    biggest = [0.0, 0.0]
    for delta in _deltas(rng, 200, shapes, np.float64):
        enc.encode(delta)
        for i, (d, r) in enumerate(zip(delta, enc.residual)):
            biggest[i] = max(biggest[i], float(np.linalg.norm(d)))
            c = math.sqrt(1 - codec.kept(d.size) / d.size)
            assert np.linalg.norm(r) <= c * biggest[i] / (1 - c) * (1 + 1e-9)


def test_error_feedback_delivers_what_plain_topk_loses_for_good():
    # The same delta every step: plain top-k sends the same entries each time and the
    # rest never arrives, so what is owed grows without bound; with error feedback it
    # stays within the contraction bound above.
    rng = np.random.default_rng(3)
    delta = [rng.standard_normal(1000)]
    plain, ef = codecs.get("topk:0.01:noef"), codecs.get("topk:0.01")
    enc_plain, enc_ef = plain.encoder(), ef.encoder()
    assert enc_plain.residual is None and isinstance(enc_ef, codecs.ErrorFeedback)
    c = math.sqrt(1 - ef.kept(1000) / 1000)
    bound = c * np.linalg.norm(delta[0]) / (1 - c)
    total = np.zeros(1000)
    got_plain, got_ef = np.zeros(1000), np.zeros(1000)
    for _ in range(600):
        total += delta[0]
        got_plain += plain.decode(enc_plain.encode(delta))[0]
        got_ef += ef.decode(enc_ef.encode(delta))[0]
        assert np.linalg.norm(total - got_ef) <= bound
    gap_plain = np.linalg.norm(total - got_plain)
    assert gap_plain > bound
    assert np.linalg.norm(total - got_ef) < gap_plain / 10


def test_error_feedback_encoder_refuses_another_layout_and_resets():
    enc = codecs.get("topk:0.1").encoder()
    enc.encode([np.ones(10)])
    assert enc.residual_norm() > 0
    with pytest.raises(ValueError, match="one encoder per stream"):
        enc.encode([np.ones(11)])
    enc.reset()
    assert enc.residual is None and enc.residual_norm() == 0.0
    enc.encode([np.ones(11)])


def test_lossless_codecs_have_no_error_feedback():
    assert type(codecs.get("zstd").encoder()) is codecs.Encoder
    with pytest.raises(ValueError, match="lossless"):
        codecs.get("none").encoder(error_feedback=True)


# -- the wire ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", LOSSLESS + LOSSY)
def test_payload_bytes_are_its_segments_and_the_header_is_small(spec):
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (1600, 64), (64,)]]
    payload = codecs.get(spec).encode(arrays)
    buffers = []
    header = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    assert sum(b.raw().nbytes for b in buffers) == payload.nbytes
    assert len(header) < 150 * len(arrays)
    # Each segment is one buffer: no per-element Python objects on the wire.
    assert len(buffers) == len(payload.segments)


@pytest.mark.parametrize("spec", ["none", "fp16", "int8", "int4", "zstd"])
def test_ddlf_serialization_ships_large_segments_out_of_band(spec):
    from ddlf_actors.runtime.wire import serialization

    rng = np.random.default_rng(8)
    delta = [rng.standard_normal((7744, 64)).astype(np.float32) * 1e-3,
             rng.standard_normal(64).astype(np.float32)]
    payload = codecs.get(spec).encode(delta)
    segments = serialization.dumps((payload, {"loss": 0.5}))
    big = [s.nbytes for s in payload.segments if s.nbytes >= 64 * 1024]
    assert big and sorted(memoryview(b).nbytes for b in segments[1:]) == sorted(big)
    got, stats = serialization.loads(segments)
    assert stats == {"loss": 0.5}
    for a, b in zip(codecs.get(spec).decode(payload), codecs.decode(got)):
        assert np.array_equal(a, b)


def test_decode_refuses_other_codecs_and_malformed_payloads():
    x = [np.arange(100, dtype=np.float32)]
    payload = codecs.get("lz4").encode(x)
    with pytest.raises(ValueError, match="encoded with codec 'lz4'"):
        codecs.get("zstd").decode(payload)
    assert np.array_equal(codecs.decode(payload)[0], x[0])
    with pytest.raises(ValueError, match="Encoded payload"):
        codecs.get("none").decode(x)
    short = codecs.Encoded("none", payload.header, ())
    with pytest.raises(ValueError, match="malformed"):
        codecs.get("none").decode(short)


@pytest.mark.parametrize("spec", ["lz4", "zstd"])
def test_corrupt_compressed_segments_raise_not_garbage(spec):
    codec = codecs.get(spec)
    x = np.round(np.random.default_rng(5).standard_normal(1000), 1)   # compressible
    payload = codec.encode([x])
    assert payload.header[0][2] == spec
    seg = payload.segments[0][:-10]            # truncated
    with pytest.raises(ValueError, match="corrupt"):
        codec.decode(codecs.Encoded(spec, payload.header, (seg,)))
    header = (((2000,),) + payload.header[0][1:],)   # header disagrees with the frame
    with pytest.raises(ValueError, match="corrupt"):
        codec.decode(codecs.Encoded(spec, header, payload.segments))


def test_encode_refuses_a_single_array_and_objects():
    with pytest.raises(TypeError, match=r"list of arrays.*\[array\]"):
        codecs.get("none").encode(np.ones((3, 4)))
    with pytest.raises(TypeError, match="object"):
        codecs.get("none").encode([np.array([object()])])


# -- specs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["topk:0", "topk:2", "topk:-0.1", "topk", "topk:nan",
                                  "topk:inf", "topk:abc", "int9", "zstd:-5", "zstd:0",
                                  "zstd:23", "zstd:3.5", "lz4:1", "none:ef", "fp16:2", "",
                                  "topk:0.1:ef:noef", "topk:0.1:0.2", "gzip", "int4:3", "int4:0",
                                  "int4:-2", "int4:1.5", "int4:abc", "int4:64:128"])
def test_bad_specs_raise_naming_the_valid_forms(spec):
    with pytest.raises(ValueError) as info:
        codecs.get(spec)
    msg = str(info.value)
    assert repr(spec) in msg
    for form in ("none", "lz4", "zstd[:level 1-22]", "fp16", "int8", "topk:<fraction"):
        assert form in msg


def test_bad_spec_types_and_pairs():
    with pytest.raises(TypeError, match="valid forms"):
        codecs.get(42)
    with pytest.raises(ValueError, match=r"\(down, up\)"):
        codecs.resolve_pair(("none", "fp16", "int8"))
    with pytest.raises(ValueError, match="int9"):
        codecs.resolve_pair(("none", "int9"))


@pytest.mark.parametrize("spec", ["none", "lz4", "zstd", "zstd:9", "fp16", "int8",
                                  "int8:ef", "topk:0.01", "topk:0.25:noef", "fp16:noef",
                                  "int4", "int4:ef", "int4:64", "int4:64:ef"])
def test_specs_are_canonical_and_codecs_pickle(spec):
    codec = codecs.get(spec)
    assert codecs.get(codec.spec) == codec
    assert pickle.loads(pickle.dumps(codec)) == codec
    assert codecs.get(codec) is codec
    assert codecs.get(spec.upper()) == codec


def test_only_topk_needs_a_summed_stream():
    assert [n for n in codecs.names() if codecs.get(
        "topk:0.1" if n == "topk" else n).needs_summing] == ["topk"]


def test_defaults_and_error_feedback_flags():
    assert codecs.get(None) == codecs.get("none")
    assert codecs.get("topk:0.01").error_feedback is True
    assert codecs.get("topk:0.01:noef").error_feedback is False
    assert codecs.get("int8").error_feedback is False
    assert codecs.get("int8:ef").spec == "int8:ef"
    assert codecs.get("zstd:3").spec == "zstd"


def test_resolve_pair():
    down, up = codecs.resolve_pair("fp16")
    assert down == up == codecs.get("fp16")
    down, up = codecs.resolve_pair(("fp16", "topk:0.01"))
    assert (down.spec, up.spec) == ("fp16", "topk:0.01")
    assert codecs.resolve_pair(None) == (codecs.get("none"), codecs.get("none"))
    assert codecs.resolve_pair([None, "int8"])[1] == codecs.get("int8")


# -- missing libraries ---------------------------------------------------------------------
@pytest.mark.parametrize("spec, modules, pip_name", [
    ("lz4", ["lz4", "lz4.block"], "lz4"),
    ("zstd:5", ["zstandard"], "zstandard"),
])
def test_a_codec_whose_library_is_missing_is_refused_with_the_pip_command(
        monkeypatch, spec, modules, pip_name):
    codec = codecs.get(spec)   # made while the library was there, like a shipped codec
    payload = codec.encode([np.zeros(1000)])
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)   # import now raises ImportError
    name = spec.split(":")[0]
    with pytest.raises(codecs.CodecUnavailableError) as info:
        codecs.get(spec)
    msg = str(info.value)
    assert f"codec {name!r}" in msg and f"pip install {pip_name}" in msg
    assert isinstance(info.value, ImportError) and isinstance(info.value, ValueError)
    # A trainer on a machine without the library fails the same way at its first use.
    with pytest.raises(codecs.CodecUnavailableError, match=f"pip install {pip_name}"):
        codec.encode([np.ones(3)])
    with pytest.raises(codecs.CodecUnavailableError, match=f"pip install {pip_name}"):
        codec.decode(payload)
    # The other codecs are unaffected.
    assert codecs.get("fp16").decode(codecs.get("fp16").encode([np.ones(3)]))[0][0] == 1


# -- registry ------------------------------------------------------------------------------
def test_a_new_codec_is_one_class(monkeypatch):
    monkeypatch.setattr(registry, "_CODECS", dict(registry._CODECS))

    @codecs.register
    class Halve(Codec):
        """``halve``: float64 tensors as float32 (a toy)."""

        name = "halve"
        form = "halve"
        lossless = False

        def encode_tensor(self, index, a):
            if a.dtype != np.float64:
                return raw(a)
            return "f32", (a.astype(np.float32).ravel(),), None

        def decode_tensor(self, method, segments, scalar, shape, dtype):
            return segments[0].astype(dtype).reshape(shape)

    codec = codecs.get("halve")
    assert "halve" in codecs.names() and "halve" in codecs.forms()
    x = [np.linspace(0, 1, 10)]
    assert codec.encode(x).nbytes == 40
    np.testing.assert_allclose(codecs.decode(codec.encode(x))[0], x[0], rtol=1e-7)
    assert isinstance(codec.encoder(error_feedback=True), codecs.ErrorFeedback)

    class Other(Codec):
        name = "halve"
    with pytest.raises(ValueError, match="taken"):
        codecs.register(Other)
    with pytest.raises(ValueError, match="codec name"):
        codecs.register(type("Bad", (Codec,), {"name": "a:b"}))
