"""The ring allreduce with no cluster: members are threads, the transport is mailboxes."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlf_actors.apps import codecs, ring
from ddlf_actors.apps.schemes.averaging import apply_delta, weighted_mean


def ship(chunk):
    """A chunk as the receiver gets it: arrays copied, a payload through pickle protocol 5
    with its buffers out of band (as DDLF's wire sends them)."""
    if isinstance(chunk, codecs.Encoded):
        buffers = []
        data = pickle.dumps(chunk, protocol=5, buffer_callback=buffers.append)
        return pickle.loads(data, buffers=[b.raw() for b in buffers])
    return [np.array(c) for c in chunk]


def run_ring(vectors_per_member, timeout_s=10.0, codec=None, feedbacks=None):
    """Run ring_allreduce with one thread per member; return (results, bytes sent each)."""
    n = len(vectors_per_member)
    boxes = [ring.Mailbox() for _ in range(n)]
    tag = (5, 1, 1)
    for b in boxes:
        b.begin(tag)
    results = [None] * n
    sent = [0] * n
    errors = []

    def member(r):
        def send(phase, step, chunk):
            sent[r] += ring.chunk_nbytes(chunk)
            boxes[(r + 1) % n].deliver(tag, phase, step, ship(chunk))

        def recv(phase, step):
            return boxes[r].take(tag, phase, step, timeout_s)

        try:
            if codec is None:   # the call as it was before codecs: the default
                results[r] = ring.ring_allreduce(vectors_per_member[r], r, n, send, recv)
            else:
                results[r] = ring.ring_allreduce(
                    vectors_per_member[r], r, n, send, recv, codec=codec,
                    feedback=None if feedbacks is None else feedbacks[r])
        except BaseException as e:  # surfaced by the test
            errors.append(e)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return results, sent


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), length=st.integers(0, 40), seed=st.integers(0, 2**31))
def test_every_member_ends_with_the_same_sum(n, length, seed):
    rng = np.random.default_rng(seed)
    vectors = [[rng.normal(size=length).astype(np.float32), rng.normal(size=3)]
               for _ in range(n)]
    results, sent = run_ring(vectors)
    for g in range(2):
        expected = sum(v[g].astype(np.float64) for v in vectors)
        for res in results:
            np.testing.assert_allclose(res[g], expected, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(res[g], results[0][g])   # bit-identical everywhere
            assert res[g].dtype == vectors[0][g].dtype
    for r in range(n):
        assert sent[r] == ring.ring_send_bytes(vectors[r], r, n)


def test_each_member_sends_2_k_minus_1_over_k_of_the_vector():
    for n in (2, 4, 8):
        vectors = [[np.ones(8000, np.float32)] for _ in range(n)]
        _, sent = run_ring(vectors)
        assert sent == [2 * (n - 1) * 8000 * 4 // n] * n


def test_mean_matches_the_drivers_weighted_mean():
    rng = np.random.default_rng(0)
    layers = [(5, 3), (3,), (2, 2, 2)]
    for k in (1, 2, 3, 5):
        deltas = [[rng.normal(size=s).astype(np.float32) for s in layers] for _ in range(k)]
        samples = [int(x) for x in rng.integers(10, 100, k)]
        total = float(sum(samples))
        scaled = [ring.scaled_vectors(d, n / total) for d, n in zip(deltas, samples)]
        results, _ = run_ring([v for v, _ in scaled])
        mean = ring.unflatten(results[0], scaled[0][1])
        expected = weighted_mean(deltas, samples)
        for a, b in zip(mean, expected):
            assert a.shape == b.shape and a.dtype == b.dtype
            if k <= 2:   # a + b == b + a: the same bits as the driver's sum
                np.testing.assert_array_equal(a, b)
            else:        # each chunk summed from another member: the order differs
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        w = [np.zeros(s, np.float32) for s in layers]
        for a, b in zip(apply_delta(w, mean), apply_delta(w, expected)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_vectors_round_trip_by_dtype_without_casting():
    layers = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.float64),
              np.ones((1, 1), np.float32), np.zeros(0, np.float32)]
    vectors, spec = ring.scaled_vectors(layers, 0.5)
    assert [v.dtype for v in vectors] == [np.float32, np.float64]
    back = ring.unflatten(vectors, spec)
    for a, b in zip(back, layers):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b * b.dtype.type(0.5))


def test_digest_tells_weights_apart():
    w = [np.arange(4, dtype=np.float32), np.ones(2, np.float32)]
    assert ring.weights_digest(w) == ring.weights_digest([a.copy() for a in w])
    changed = [w[0].copy(), w[1].copy()]
    changed[1][0] = np.nextafter(np.float32(1), np.float32(2))   # one ulp
    assert ring.weights_digest(changed) != ring.weights_digest(w)
    assert ring.weights_digest([w[0].astype(np.float64), w[1]]) != ring.weights_digest(w)


# -- the mailbox ---------------------------------------------------------------------------------
def _take_in_thread(box, *args, **kw):
    out = {}

    def run():
        try:
            out["value"] = box.take(*args, **kw)
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_an_abort_wakes_a_waiting_member_at_once():
    box = ring.Mailbox()
    box.begin((7, 3, 1))
    t, out = _take_in_thread(box, (7, 3, 1), "rs", 0, 60.0)
    time.sleep(0.1)
    box.abort((7, 3, 1), "trainer 2 was lost")
    t.join(5)
    assert not t.is_alive()
    assert isinstance(out["error"], ring.CollectiveAborted) and "trainer 2" in str(out["error"])


def test_no_chunk_within_the_timeout_is_an_error_not_a_hang():
    box = ring.Mailbox()
    box.begin((7, 1, 1))
    with pytest.raises(ring.CollectiveTimeout, match="rs/0 of collective"):
        box.take((7, 1, 1), "rs", 0, 0.2)


def test_check_runs_while_waiting_and_its_error_ends_the_wait():
    box = ring.Mailbox()
    box.begin((7, 1, 1))
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise ring.PeerLost("right neighbour died")

    with pytest.raises(ring.PeerLost):
        box.take((7, 1, 1), "ag", 2, 30.0, check, poll_s=0.01)
    assert len(calls) == 3


def test_stale_chunks_and_aborts_are_dropped_newer_ones_kept():
    box = ring.Mailbox()
    box.begin((7, 2, 1))
    box.deliver((7, 2, 2), "rs", 0, "from a neighbour already on attempt 2")
    box.abort((7, 2, 1), "attempt 1 called off")
    box.begin((7, 2, 2))
    # Attempt 1's abort does not touch attempt 2, whose early chunk waited for it.
    assert box.take((7, 2, 2), "rs", 0, 1.0) == "from a neighbour already on attempt 2"
    box.deliver((7, 2, 1), "rs", 1, "late chunk of attempt 1")
    box.abort((7, 1, 5), "an older round")
    with pytest.raises(ring.CollectiveTimeout):
        box.take((7, 2, 2), "rs", 1, 0.1)
    # An abort that arrives before its collective starts still counts.
    box.abort((7, 3, 1), "lost before it began")
    box.begin((7, 3, 1))
    with pytest.raises(ring.CollectiveAborted):
        box.take((7, 3, 1), "rs", 0, 5.0)


def test_the_next_run_on_the_same_trainers_starts_from_round_1_again():
    box = ring.Mailbox()
    box.begin((7, 6, 1))                    # run 7 ended at round 6
    # Run 3's first chunk arrives before this trainer starts run 3's first collective:
    # (3, 1, 1) < (7, 6, 1), but run ids are random, not ordered: it is kept.
    box.deliver((3, 1, 1), "rs", 0, "run 3, round 1")
    box.deliver((7, 6, 1), "ag", 0, "leftover of run 7")
    box.begin((3, 1, 1))
    assert box.take((3, 1, 1), "rs", 0, 1.0) == "run 3, round 1"
    assert box._chunks == {}                # run 7's leftovers are gone


# -- compression per hop (issue 23 section 3) ------------------------------------------------
# Each codec's per-element error as a fraction of the largest |value| of what it encodes
# (its docstring's bound; int4's is per block of 128, bounded here by the chunk's peak).
ALPHA = {"none": 0.0, "fp16": 2.0 ** -11, "int8": 1 / 254 + 2.0 ** -23,
         "int4": 1 / 14 + 2.0 ** -23}
# The relative error (L2, against the exact float64 sum) that each codec stays under;
# the measured value is in the assert message. Per hop int4 adds uniform noise of RMS
# step/√12 ≈ peak/24 ≈ 0.11σ of the partial sum it encodes, so over K encodes of partial
# sums of 1..K members the total is ≈ 0.11·√((K+1)/2) of the sum: 0.13 at K=2, 0.19 at 5.
CEILING = {"none": 1e-6, "fp16": 1e-3, "int8": 0.03, "int4": 0.25}


def _deltas(k, rng):
    """K members' vectors: float32 (odd length, chunks of unequal sizes) and float64, each
    scaled by 1/K as allreduce's members scale their deltas."""
    return [[(rng.standard_normal(10_007) * 1e-3 / k).astype(np.float32),
             rng.standard_normal(301) * 1e-3 / k] for _ in range(k)]


@pytest.mark.parametrize("spec", ["none", "fp16", "int8", "int4"])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_a_codec_per_hop_gives_identical_members_bounded_error_predicted_bytes(k, spec):
    vectors = _deltas(k, np.random.default_rng(k))
    results, sent = run_ring(vectors, codec=spec)
    alpha = ALPHA[spec]
    for g in range(2):
        dtype = vectors[0][g].dtype
        for res in results:
            assert res[g].dtype == dtype
            np.testing.assert_array_equal(res[g], results[0][g])   # bit-identical members
        exact = sum(v[g].astype(np.float64) for v in vectors)
        err = np.abs(results[0][g].astype(np.float64) - exact)
        # Per chunk c: with P = Σ_j max|v_j| over the chunk, the partial sum of h members
        # peaks under (1+α)^(h−1)·P, and each of the K encodes adds at most α times the
        # peak of what it encodes: |err| ≤ P((1+α)^K − 1), plus the float rounding of the
        # K − 1 additions, plus int4's floor for blocks of zeros.
        eps = float(np.finfo(dtype).eps)
        bound = np.concatenate([
            np.full(len(c), p * ((1 + alpha) ** k - 1 + k * eps * (1 + alpha) ** k)
                    + k * 2.0 ** -127)
            for c, p in zip(np.array_split(exact, k),
                            [sum(float(np.abs(part).max())
                                 for part in (np.array_split(v[g], k)[c] for v in vectors))
                             for c in range(k)])])
        rel = float(np.linalg.norm(err) / np.linalg.norm(exact))
        worst = float(np.max(err / bound))
        assert worst <= 1 and rel <= CEILING[spec], (
            f"K={k} {spec} vector {g} ({dtype}): relative error {rel:.3e} (ceiling "
            f"{CEILING[spec]:g}), worst |err|/bound {worst:.3f}")
    # Bytes: each member sends 2 (K−1) chunks' encodings, as the codec foretells.
    for r in range(k):
        assert sent[r] == ring.ring_send_bytes(vectors[r], r, k, codec=spec)
    raw = [ring.ring_send_bytes(vectors[r], r, k) for r in range(k)]
    ratio = sum(raw) / sum(sent)
    expected = {"none": 1.0, "fp16": (2, 4), "int8": (4, 8), "int4": (7.4, 15)}[spec]
    assert ratio == expected if spec == "none" else expected[0] <= ratio <= expected[1], (
        f"K={k} {spec}: raw/encoded bytes {ratio:.2f}")


@pytest.mark.parametrize("k", [2, 3, 5])
def test_the_none_codec_gives_the_default_rings_bits(k):
    vectors = _deltas(k, np.random.default_rng(10 + k))
    plain, sent_plain = run_ring(vectors)
    coded, sent_coded = run_ring(vectors, codec="none")
    for a, b in zip(plain, coded):
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and np.array_equal(x, y)
    assert sent_plain == sent_coded == [ring.ring_send_bytes(v, r, k)
                                        for r, v in enumerate(vectors)]


@pytest.mark.parametrize("spec", ["int8", "int4", "int4:64"])
def test_one_members_values_cross_the_ring_at_one_encodings_error(spec):
    # Every member but one holds zeros: the partial sums are that member's values, and
    # since a decoded chunk re-encodes to itself, they reach everyone encoded once, not K
    # times. The running sum is never re-quantized on top of its own rounding.
    k = 4
    rng = np.random.default_rng(7)
    values = rng.standard_normal(4001).astype(np.float32)
    codec = codecs.get(spec)
    for who in range(k):
        vectors = [[values if j == who else np.zeros_like(values)] for j in range(k)]
        results, _ = run_ring(vectors, codec=spec)
        once = np.concatenate([codec.decode(codec.encode([c]))[0]
                               for c in np.array_split(values, k)])
        for res in results:
            np.testing.assert_array_equal(res[0], once)


def test_the_ring_refuses_codecs_that_drop_most_of_a_chunk():
    with pytest.raises(ValueError, match=r"'topk:0.01'.*forwarded verbatim.*int4"):
        ring.ring_allreduce([np.ones(8, np.float32)], 0, 2, None, None, codec="topk:0.01")
    with pytest.raises(ValueError, match="unknown codec 'int3'.*valid forms"):
        ring.ring_send_bytes([np.ones(8, np.float32)], 0, 2, codec="int3")
    assert ring.ring_send_bytes([np.ones(8, np.float32)], 0, 2, codec="zstd") is None
    assert ring.ring_codec(None) is None and ring.ring_codec("int4") == codecs.get("int4")


def test_a_codec_refuses_nan_in_a_chunk_rather_than_spreading_it():
    vectors = _deltas(2, np.random.default_rng(0))
    vectors[1][0][-1] = np.nan   # in chunk 1, the one member 1 sends first
    n = 2
    boxes = [ring.Mailbox() for _ in range(n)]
    for b in boxes:
        b.begin((1, 1, 1))
    with pytest.raises(ValueError, match="NaN or inf"):
        ring.ring_allreduce(vectors[1], 1, n,
                            lambda p, s, c: boxes[0].deliver((1, 1, 1), p, s, c),
                            lambda p, s: boxes[1].take((1, 1, 1), p, s, 1.0), codec="int4")


def run_rounds(vectors, rounds, codec, feedbacks=None):
    """``rounds`` collectives of the same vectors, as a run's rounds: the running sum of
    the results (float64), every round's members checked bit-identical."""
    total = None
    for _ in range(rounds):
        results, _ = run_ring(vectors, codec=codec, feedbacks=feedbacks)
        for res in results[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(res, results[0]))
        got = [a.astype(np.float64) for a in results[0]]
        total = got if total is None else [x + y for x, y in zip(total, got)]
    return total


@pytest.mark.parametrize("spec", ["int4", "int8"])
def test_hop_feedback_keeps_the_running_sum_on_track(spec):
    # The same deltas every round (a steady drift, where a deterministic quantiser's bias
    # adds up): without feedback the running sum's error grows with the rounds; with a
    # HopFeedback per member it stays within one encoding's error per hop.
    k, rounds = 3, 40
    vectors = _deltas(k, np.random.default_rng(21))
    exact = [sum(v[g].astype(np.float64) for v in vectors) * rounds for g in range(2)]
    plain = run_rounds(vectors, rounds, spec)
    fed = run_rounds(vectors, rounds, spec, [ring.HopFeedback() for _ in range(k)])

    def gap(total):
        return max(float(np.max(np.abs(t - e))) for t, e in zip(total, exact))

    # What is held back: per chunk, one residual per hop (K of them), each at most α
    # times the peak of that hop's input: a decoded partial sum plus its residual, under
    # P·(1 + α)^K with P = Σ_j max|v_j| (as in the bound above).
    alpha = ALPHA[spec]
    peak = max(sum(float(np.max(np.abs(v[g]))) for v in vectors) for g in range(2))
    assert gap(fed) <= k * alpha * peak * (1 + alpha) ** k, (gap(fed), peak)
    assert gap(plain) > 5 * gap(fed), (gap(plain), gap(fed))


def test_hop_feedback_resets_for_another_ring_and_needs_a_lossy_codec():
    fb = ring.HopFeedback()
    vectors = _deltas(2, np.random.default_rng(3))
    run_rounds(vectors, 1, "int4", [fb, ring.HopFeedback()])
    saved = fb.state()
    assert saved["key"][:2] == (0, 2) and set(saved["residuals"]) == {"rs0", "done"}
    fb2 = ring.HopFeedback()
    fb2.load(saved)
    assert all(np.array_equal(a, b) for a, b in zip(fb2.state()["residuals"]["rs0"],
                                                  saved["residuals"]["rs0"]))
    # A ring of 3 carries other chunks on each hop: member 0's residuals are dropped.
    run_rounds(_deltas(3, np.random.default_rng(4)), 1, "int4",
               [fb, ring.HopFeedback(), ring.HopFeedback()])
    assert fb.state()["key"][:2] == (0, 3) and set(fb.state()["residuals"]) == \
        {"rs0", "rs1", "done"}
    with pytest.raises(ValueError, match="needs a lossy codec"):
        ring.ring_allreduce([np.ones(4, np.float32)], 0, 2, None, None, codec="zstd",
                            feedback=fb)
    with pytest.raises(ValueError, match="needs a lossy codec"):
        ring.ring_allreduce([np.ones(4, np.float32)], 0, 2, None, None, feedback=fb)


def test_an_aborted_collective_leaves_the_residuals_as_they_were():
    fb = ring.HopFeedback()
    vectors = _deltas(2, np.random.default_rng(5))
    run_rounds(vectors, 1, "int4", [fb, ring.HopFeedback()])
    before = fb.state()
    box = ring.Mailbox()
    box.begin((1, 1, 1))
    box.abort((1, 1, 1), "member 1 lost")
    with pytest.raises(ring.CollectiveAborted):
        ring.ring_allreduce(vectors[0], 0, 2, lambda p, s, c: None,
                            lambda p, s: box.take((1, 1, 1), p, s, 5.0), codec="int4",
                            feedback=fb)
    after = fb.state()
    assert before["key"] == after["key"]
    for hop, res in before["residuals"].items():
        assert all(np.array_equal(a, b) for a, b in zip(res, after["residuals"][hop]))
