"""The driver's arithmetic on deltas (apps/schemes/averaging.py) with integer layers.

PyTorch's BatchNorm keeps ``num_batches_tracked`` as an int64 buffer, so a torch model's
weights hold an integer array among the floats. Float layers must stay bit-identical to
the formula every scheme used before; integer layers must stay integer and correct.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddlf_actors.apps.schemes.averaging import apply_delta, weighted_mean
from ddlf_actors.apps.schemes.outer import OuterOptimizer


def _old_weighted_mean(deltas, weights):
    """The formula before integer layers were handled (the reference for float layers)."""
    total = float(sum(weights))
    fractions = [float(wt) / total for wt in weights]
    out = []
    for i in range(len(deltas[0])):
        first = np.asarray(deltas[0][i])
        acc = first * first.dtype.type(fractions[0])
        for d, f in zip(deltas[1:], fractions[1:]):
            acc += np.asarray(d[i]) * first.dtype.type(f)
        out.append(acc)
    return out


def _old_apply_delta(w, delta, scale=1.0):
    return [wi - (scale * np.asarray(di)).astype(wi.dtype, copy=False)
            for wi, di in zip(w, delta)]


def _float_layers(seed: int, k: int):
    rng = np.random.default_rng(seed)
    shapes = [(3, 3, 1, 4), (4,), (7, 5), ()]
    return [[rng.normal(size=s).astype(dtype) for s, dtype in
             zip(shapes, (np.float32, np.float32, np.float64, np.float16))]
            for _ in range(k)]


@pytest.mark.parametrize("weights", [[1, 1], [600, 587, 13], [0.25, 0.75, 2.0, 1.0]])
def test_float_layers_are_bit_identical_to_the_formula_before(weights):
    deltas = _float_layers(len(weights), len(weights))
    new, old = weighted_mean(deltas, weights), _old_weighted_mean(deltas, weights)
    for a, b in zip(new, old):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    w = _float_layers(99, 1)[0]
    for scale in (1.0, 0.5, 2.0, 0.3):
        for a, b in zip(apply_delta(w, new, scale), _old_apply_delta(w, new, scale)):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_the_old_formula_truncates_an_integer_mean_to_zero():
    # Why the change: two trainers each ran 29 batches; int64(0.5) is 0.
    deltas = [[np.array(-29, np.int64)], [np.array(-29, np.int64)]]
    assert _old_weighted_mean(deltas, [1, 1])[0] == 0
    assert weighted_mean(deltas, [1, 1])[0] == -29


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_integer_layers_stay_integer_and_are_rounded(dtype):
    sign = 1 if np.dtype(dtype).kind == "u" else -1
    deltas = [[np.array([sign * 3, 10], dtype)], [np.array([sign * 4, 10], dtype)]]
    mean = weighted_mean(deltas, [1, 1])[0]
    assert mean.dtype == np.dtype(dtype)
    assert mean.tolist() == [sign * 4, 10]          # 3.5 rounds half to even: 4
    mean = weighted_mean(deltas, [3, 1])[0]          # 0.75 * 3 + 0.25 * 4 = 3.25
    assert mean.tolist() == [sign * 3, 10]


def test_apply_delta_rounds_an_integer_step():
    w = [np.array([10, 10], np.int64), np.array([1.0, 2.0], np.float32)]
    delta = [np.array([-3, -1], np.int64), np.array([0.5, 0.5], np.float32)]
    out = apply_delta(w, delta, 0.5)
    assert out[0].dtype == np.int64 and out[0].tolist() == [12, 10]   # +1.5 -> 2, +0.5 -> 0
    assert out[1].dtype == np.float32 and out[1].tolist() == [0.75, 1.75]
    assert apply_delta(w, delta)[0].tolist() == [13, 11]
    assert w[0].tolist() == [10, 10]   # a new list: the inputs are unchanged


def test_a_batchnorm_counter_through_a_sync_round_with_outer_momentum():
    # What sync does with a torch model's weights: the samples-weighted mean of the
    # deltas, then the outer step (Nesterov 0.9, rate 1.0 as the defaults with K = 2).
    w = [np.ones((2, 2), np.float32), np.array(100, np.int64)]
    deltas = [[np.full((2, 2), 0.1, np.float32), np.array(-29, np.int64)],
              [np.full((2, 2), 0.3, np.float32), np.array(-28, np.int64)]]
    outer = OuterOptimizer(lr=1.0, momentum=0.9, nesterov=True)
    for _ in range(3):
        w = outer.step(w, weighted_mean(deltas, [928, 896]), 2)
        assert w[0].dtype == np.float32 and w[1].dtype == np.int64
    # Counters take no momentum (an integer array times 0.9 in its own dtype is 0), so
    # each round adds the mean batches per trainer: round(28.51) = 29.
    assert int(w[1]) == 100 + 3 * 29


# -- the outer step's fewer-copies paths against the plain expressions ------------------------
def _plain_momentum(velocity, mean_delta, momentum, nesterov):
    """momentum_update as written before it wrote into fewer new arrays."""
    if velocity is None:
        velocity = [np.zeros_like(g) for g in mean_delta]
    new_v, update = [], []
    for v, g in zip(velocity, mean_delta):
        v = v * g.dtype.type(momentum) + g
        new_v.append(v)
        update.append(g + v * g.dtype.type(momentum) if nesterov else v)
    return new_v, update


def _bits(arrays):
    return [(np.asarray(a).dtype.str, np.asarray(a).tobytes()) for a in arrays]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("nesterov", [True, False])
def test_the_outer_step_is_bit_identical_to_the_plain_expressions(dtype, nesterov):
    from ddlf_actors.apps import ring
    from ddlf_actors.apps.schemes.averaging import _scaled
    from ddlf_actors.apps.schemes.outer import momentum_update

    rng = np.random.default_rng(7)
    shapes = [(3, 4), (5,), (), (6, 2, 3)]    # a 0-d weight takes the plain path
    w = [np.asarray(rng.standard_normal(s) * 3, dtype=dtype) for s in shapes]
    g = [np.asarray(rng.standard_normal(s) * 1e-3, dtype=dtype) for s in shapes]
    v = [np.asarray(rng.standard_normal(s) * 1e-2, dtype=dtype) for s in shapes]
    v_before = _bits(v)
    for velocity in (None, v):
        assert [_bits(x) for x in momentum_update(velocity, g, 0.9, nesterov)] == \
            [_bits(x) for x in _plain_momentum(velocity, g, 0.9, nesterov)]
    assert _bits(v) == v_before                  # a redone collective reuses it
    for scale in (1.0, 0.7, 1 / 3, np.float64(0.7), 2):
        plain = [np.asarray(wi) - _scaled(scale, di, np.asarray(wi)) for wi, di in zip(w, g)]
        assert _bits(apply_delta(w, g, scale)) == _bits(plain)
    for fraction in (0.25, 1 / 3):
        vectors, _ = ring.scaled_vectors(g, fraction)
        plain = np.concatenate([(a * a.dtype.type(fraction)).ravel() for a in g])
        assert _bits(vectors) == _bits([plain])
