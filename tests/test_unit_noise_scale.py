"""The gradient noise scale's estimate (``apps/schemes/noise.py``, McCandlish et al. 2018,
appendix A) on gradients whose true noise scale is known, and
``benchmarks/training/noise_scale.py``'s command line: no framework, no model."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ddlf_actors.apps.schemes import noise


@pytest.fixture
def ns(monkeypatch):
    # The script sets OMP_NUM_THREADS on import (before numpy and torch load): keep ours.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    from benchmarks.training import noise_scale

    return noise_scale


def test_the_estimate_finds_a_known_noise_scale():
    # Per-sample gradients G + noise of covariance s²·I in d dimensions: tr(Σ) = s²·d, and
    # a batch of b averages the noise down to s²/b per coordinate.
    rng = np.random.default_rng(0)
    d, s, b, n = 2000, 3.0, 16, 400
    g = rng.normal(size=d) * 0.5
    true = s * s * d / float(g @ g)
    batches = [[(g + rng.normal(scale=s / np.sqrt(b), size=d))[:1500].reshape(30, 50),
                (g + 0)[1500:] + rng.normal(scale=s / np.sqrt(b), size=d - 1500)]
               for _ in range(n)]
    est = noise.estimate(batches, b)
    assert est["b_simple"] == pytest.approx(true, rel=0.1)
    assert est["G2"] == pytest.approx(float(g @ g), rel=0.1)


def test_no_signal_gives_no_noise_scale_and_one_batch_is_refused():
    up = [np.ones(4)]
    down = [-np.ones(4)]   # the mean gradient is 0: |G|² estimated below 0
    assert noise.estimate([up, down], 8)["b_simple"] is None
    with pytest.raises(ValueError, match="at least 2"):
        noise.estimate([up], 8)


def test_the_command_line_refuses_what_it_cannot_measure(ns):
    for argv in (["--models", "resnet"], ["--at", "0.3,0.1"], ["--batches", "1"]):
        with pytest.raises(SystemExit) as e:
            ns.main(argv)
        assert e.value.code == 2
