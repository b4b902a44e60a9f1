"""The ring allreduce with no cluster: members are threads, the transport is mailboxes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlf_actors.apps import ring
from ddlf_actors.apps.schemes.averaging import apply_delta, weighted_mean


def run_ring(vectors_per_member, timeout_s=10.0):
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
            sent[r] += sum(np.asarray(c).nbytes for c in chunk)
            boxes[(r + 1) % n].deliver(tag, phase, step, [np.array(c) for c in chunk])

        def recv(phase, step):
            return boxes[r].take(tag, phase, step, timeout_s)

        try:
            results[r] = ring.ring_allreduce(vectors_per_member[r], r, n, send, recv)
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
