"""``scheme="auto"``: the choice from a probe (pure), and runs on the in-process backend:
the probe, an explicit option winning, a probe that fails, and a resumed run keeping its
choice."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from helpers_modules.numpy_trainer import NumpyTrainer, RateEchoTrainer, softmax_model_fn

from ddlf_actors.apps import train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.schemes import auto
from ddlf_actors.apps.schemes.probe import Probe, link_figures
from ddlf_actors.apps.schemes.rounds import outer_for_k

MB = 1e6


def _probe(step_s=0.05, bandwidth=125 * MB, latency=1e-4, encode=0.02):
    return Probe(step_s=step_s, bandwidth_Bps=bandwidth, latency_s=latency,
                 encode_s={c: encode for c in auto.probe_codecs(None)})


# -- choose(): the rules, from figures ---------------------------------------------------------
def test_one_trainer_sends_nothing_and_needs_no_probe():
    c = auto.choose(1, 20 * MB, None)
    assert (c.scheme, c.compression, c.overlap) == ("allreduce", None, False)
    assert "K = 1" in c.reason


def test_a_fast_link_keeps_the_model_uncompressed():
    # 2 MB over 1 GB/s: 2 ms a round against 16 x 50 ms of compute.
    c = auto.choose(4, 2 * MB, _probe(bandwidth=1000 * MB))
    assert (c.steps, c.compression, c.overlap) == (16, None, False)


def test_a_slower_link_takes_the_first_rung_within_the_budget():
    probe = _probe(bandwidth=125 * MB)          # 1 Gbit/s
    c = auto.choose(4, 20 * MB, probe)
    ring = auto.ring_seconds(4, 20 * MB, c.compression, 125 * MB, 1e-4, probe.encode_s)
    assert ring <= auto.BUDGET * c.steps * probe.step_s
    # and no earlier rung would have fitted
    for h, codec in auto.LADDER[:auto.LADDER.index((c.steps, c.compression))]:
        earlier = auto.ring_seconds(4, 20 * MB, codec, 125 * MB, 1e-4, probe.encode_s)
        assert earlier > auto.BUDGET * h * probe.step_s


def test_a_32_step_round_may_spend_more_on_its_ring_before_64():
    # 100 Mbit/s, a 20 MB model, steps of 115 ms: the 32-step int4 ring is about 12 % of
    # the round's compute (over BUDGET), which measured cheaper than 64 steps' epochs.
    probe = _probe(step_s=0.115, bandwidth=12 * MB, latency=1e-4, encode=0.05)
    c = auto.choose(4, 20.4 * MB, probe)
    ring = auto.ring_seconds(4, 20.4 * MB, "int4:ef", 12 * MB, 1e-4, probe.encode_s)
    assert auto.BUDGET < ring / (32 * 0.115) <= auto.LONG_ROUND_BUDGET
    assert (c.steps, c.compression) == (32, "int4:ef")
    # Only instead of 64 steps: wherever the plain first fit within BUDGET has 32 steps
    # or fewer, auto picks exactly that, at any link speed.
    for mb_s in (1, 3, 6, 9, 12, 15, 20, 30, 40, 60, 90, 125, 200, 1000):
        p = _probe(step_s=0.115, bandwidth=mb_s * MB, latency=1e-4, encode=0.05)
        ring = {(h, c): auto.ring_seconds(4, 20.4 * MB, c, mb_s * MB, 1e-4, p.encode_s)
                for h, c in auto.LADDER}
        first = next(((h, c) for h, c in auto.LADDER
                      if ring[h, c] <= auto.BUDGET * h * 0.115), None)
        picked = auto.choose(4, 20.4 * MB, p)
        if first is not None and first[0] <= 32:
            assert (picked.steps, picked.compression) == first, mb_s
        else:
            long = [r for r in auto.LADDER if r[0] == 32
                    and ring[r] <= auto.LONG_ROUND_BUDGET * 32 * 0.115]
            assert (picked.steps, picked.compression) == (long[0] if long else first
                                                          or (64, "int4:ef")), mb_s


def test_a_link_far_too_slow_overlaps_the_best_rung():
    c = auto.choose(4, 20 * MB, _probe(bandwidth=1 * MB))
    assert c.overlap and c.compression == "int4:ef" and c.steps == 64
    assert "overlap" in c.reason


def test_explicit_settings_win():
    c = auto.choose(4, 20 * MB, _probe(bandwidth=1 * MB), compression="fp16")
    assert c.compression == "fp16" and "compression" in c.explicit
    c = auto.choose(4, 20 * MB, _probe(bandwidth=1000 * MB), steps=8)
    assert c.steps == 8 and c.compression is None


def test_from_k_4_the_trainers_rate_is_scaled_by_the_root_of_k():
    probe = _probe(bandwidth=1000 * MB)
    for k in (2, 3):
        assert auto.choose(k, 2 * MB, probe, rate_settable=True).lr_scaling is None
    four = auto.choose(4, 2 * MB, probe, rate_settable=True)
    assert four.lr_scaling == "sqrt" and "the trainers' rate x2 (sqrt K)" in four.line(4)
    # A failed probe changes the rounds, not this rule; no settable rate: no rule.
    assert auto.choose(8, 2 * MB, Probe(failed="x"), rate_settable=True).lr_scaling == "sqrt"
    assert auto.choose(4, 2 * MB, probe, rate_settable=False).lr_scaling is None
    assert "rate" not in auto.choose(4, 2 * MB, probe).line(4)


def test_a_failed_probe_falls_back_and_says_why():
    c = auto.choose(4, 20 * MB, Probe(failed="2 of its 9 measurements did not finish"))
    assert (c.steps, c.compression) == auto.SAFE
    assert "did not finish" in c.reason and "probe failed" in c.reason


def _batch_probe(noise_scale, split_cost=0.55, step_s=0.1, batch=32, k=2):
    """Figures of a probe that weighed the batch: ``split_cost`` is a step of the split
    batch's time over a whole one's."""
    g2 = 1.0
    return dataclasses.replace(
        _probe(step_s=step_s, bandwidth=1000 * MB), split_batch=auto.split_of(batch, k),
        split_step_s=split_cost * step_s,
        noise={"G2": g2, "trace": noise_scale * g2, "b_simple": noise_scale, "n": 16})


def test_the_batch_is_split_when_the_noise_scale_is_far_below_k_batches():
    # gpt-tiny's figures: a noise scale of a few windows, a step of 16 about half of 32's.
    c = auto.choose(2, 3.4 * MB, _batch_probe(3.0), batch_size=32)
    assert c.batch_size == 16
    assert "batch split (gradient noise scale 3 against 2 x 32" in c.line(2)
    assert "16 samples a step per trainer (the batch split 2 ways)" in c.line(2)
    # The prediction: (1 + 32/3)·0.55·0.1/16 against (1 + 64/3)·0.1/32.
    predicted = ((1 + 32 / 3) * 0.55 * 0.1 / 16) / ((1 + 64 / 3) * 0.1 / 32)
    assert f"{predicted:.2f} of the time to a target" in c.line(2)
    # Four trainers split 32 into 8 each, and their rate is not scaled: together they step
    # on one process's batch.
    four = auto.choose(4, 3.4 * MB, _batch_probe(3.0, k=4), batch_size=32, rate_settable=True)
    assert four.batch_size == 8 and four.lr_scaling is None


def test_the_batch_is_kept_near_the_noise_scale_or_where_small_steps_cost_as_much():
    # wide_cnn's: a noise scale of ~86 images, a step of 16 costing 0.85 of 32's.
    c = auto.choose(2, 20 * MB, _batch_probe(86.0, split_cost=0.85), batch_size=32)
    assert c.batch_size is None and "batch kept (gradient noise scale 86" in c.line(2)
    # A split predicted to gain less than SPLIT_GAIN keeps the batch: 0.9 of the time here.
    near = auto.choose(2, 20 * MB, _batch_probe(60.0, split_cost=0.55), batch_size=32)
    predicted = ((1 + 32 / 60) * 0.55 / 16) / ((1 + 64 / 60) / 32)
    assert 1 - auto.SPLIT_GAIN < predicted < 1
    assert near.batch_size is None and f"{predicted:.2f} of the time" in near.line(2)
    # Four trainers of that CNN keep theirs too, and scale their rate.
    four = auto.choose(4, 20 * MB, _batch_probe(86.0, 0.85, k=4), batch_size=32,
                       rate_settable=True)
    assert four.batch_size is None and four.lr_scaling == "sqrt"


def test_the_batch_rule_keeps_the_batch_when_it_cannot_weigh_it():
    tiny = _batch_probe(3.0)
    # A schedule that counts steps would run through twice as fast on half the batch.
    assert auto.batch_rule(2, 32, tiny, schedule="steps")[0] == 32
    # No noise estimate (a trainer without compute_gradients), or one swamped by noise.
    failed = dataclasses.replace(tiny, noise=None, noise_failed="UnknownFrameworkError: no")
    b, why = auto.batch_rule(2, 32, failed)
    assert b == 32 and "no noise scale: UnknownFrameworkError" in why
    swamped = dataclasses.replace(tiny, noise={"G2": -1.0, "trace": 5.0, "b_simple": None})
    assert auto.batch_rule(2, 32, swamped)[0] == 32
    # No probe, one trainer, a batch of one: nothing to split.
    assert auto.batch_rule(2, 32, None) == (32, "")
    assert auto.batch_rule(1, 32, tiny) == (32, "")
    assert auto.batch_rule(2, 1, tiny) == (1, "")
    # Given, it wins either way, and a split rounds up: 3 trainers of 32 take 11 each.
    assert auto.batch_rule(2, 32, None, split=True)[0] == 16
    assert auto.batch_rule(3, 32, None, split=True)[0] == 11
    assert auto.batch_rule(2, 32, tiny, split=False)[0] == 32


def test_link_figures_split_latency_from_bandwidth():
    bw, lat = link_figures([1000, 1_001_000], [0.001, 0.011])
    assert lat == pytest.approx(0.001) and bw == pytest.approx(1e8)


def test_the_outer_step_is_off_for_one_trainer():
    from ddlf_actors.apps.schemes.api import resolve_options

    assert outer_for_k(1) == {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
    _, one = resolve_options("allreduce", workers=1)
    _, four = resolve_options("allreduce", workers=4)
    assert (one.outer_lr, one.outer_momentum, one.nesterov) == (1.0, 0.0, False)
    assert four.nesterov is True and four.outer_momentum > 0
    # An explicit setting wins over the K rule.
    _, given = resolve_options("allreduce", workers=1, outer_momentum=0.5)
    assert given.outer_momentum == 0.5


# -- runs on the in-process backend -----------------------------------------------------------
def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 64)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0).astype(np.int64)
    return (x, y), (x[:256], y[:256])


def _run(**options):
    # The batch rule weighs measured step times: kept out of the tests of the other rules
    # (they count rounds of 16), and tested on its own below with fixed figures.
    options.setdefault("split_batch", False)
    return train(softmax_model_fn(), _data, workers=options.pop("workers", 2), master_epochs=1,
                 batch_size=16, trainer_cls=options.pop("trainer_cls", NumpyTrainer),
                 backend=FakeBackend(), progress=False, seed=3, **options)


def test_train_defaults_to_auto_and_records_its_choice():
    result = _run()
    s = result.settings
    assert s["scheme"] == "allreduce" and s["auto"]["line"].startswith("auto: allreduce ring of 2")
    assert s["auto"]["probe"]["step_s"] > 0 and s["auto"]["probe"]["bandwidth_Bps"] > 0
    assert any(e["kind"] == "settings" for e in result.events)
    assert result.history[-1]["test_accuracy"] > 0.5


def test_explicit_options_skip_the_probe_and_are_kept():
    result = _run(compression="fp16", steps_per_round=4)
    s = result.settings
    assert s["compression"] == "fp16" and s["options"]["steps_per_round"] == 4
    assert s["auto"]["probe"] is None
    assert set(s["auto"]["explicit"]) == {"compression", "steps", "split_batch"}
    # With the batch left to auto, the probe runs for it alone (no link is measured).
    weighed = _run(compression="fp16", steps_per_round=4, split_batch=None).settings
    assert weighed["auto"]["probe"]["noise"]["n"] >= 4
    assert weighed["auto"]["probe"]["bandwidth_Bps"] is None
    assert weighed["compression"] == "fp16" and weighed["options"]["steps_per_round"] == 4
    assert "the codec and the steps per round as given" in weighed["auto"]["line"]
    assert "probe failed" not in weighed["auto"]["line"]


def test_auto_scales_four_trainers_rate_unless_a_rate_setting_is_given():
    base = softmax_model_fn()().lr
    result = _run(workers=4, trainer_cls=RateEchoTrainer)
    s = result.settings
    assert s["options"]["lr_scaling"] == "sqrt" and "x2 (sqrt K)" in s["auto"]["line"]
    assert [r["learning_rate"] for r in result.history] == pytest.approx(
        [2 * base] * len(result.history))
    # Given, the setting wins: the trainers keep their own rate.
    kept = _run(workers=4, trainer_cls=RateEchoTrainer, lr_scaling="none")
    assert kept.settings["options"]["lr_scaling"] == "none"
    assert "learning_rate" not in kept.history[0] and "sqrt" not in kept.settings["auto"]["line"]
    assert _run(workers=2).settings["options"]["lr_scaling"] == "none"


class StuckLinkTrainer(NumpyTrainer):
    """A trainer whose link probe never answers in time (a link that dropped)."""

    def probe_link(self, right, sizes=(), timeout_s=10.0):
        time.sleep(1.5)
        raise TimeoutError("the link dropped")


def test_a_probe_that_does_not_finish_falls_back_without_hanging():
    t = time.perf_counter()
    result = _run(trainer_cls=StuckLinkTrainer, probe_timeout_s=0.5)
    assert time.perf_counter() - t < 60
    line = result.settings["auto"]["line"]
    assert "probe failed" in line and "did not finish within 0.5 s" in line
    assert result.settings["compression"] == auto.SAFE[1]


class SlowStepTrainer(NumpyTrainer):
    """A model whose steps are slow (0.1 s here, a 6 M-parameter GPT's 0.94 s on one
    thread): its whole probe takes longer than a fixed timeout of a few steps."""

    def probe_step(self, batch_size, steps=3):
        time.sleep(0.1)
        return {"step_s": 0.1}

    def probe_link(self, right, sizes=(), timeout_s=10.0):
        time.sleep(0.8)   # what comes after the step: here, the link
        return super().probe_link(right, timeout_s=timeout_s)


def test_the_default_probe_timeout_allows_slow_steps_their_time(monkeypatch):
    # The default timeout (made 0.5 s here) grows by probe.STEPS_ALLOWED measured steps
    # once the steps are in: 0.5 + 24 x 0.1 s covers the 1 s this probe takes.
    monkeypatch.setitem(auto.AutoOptions.DEFAULTS, "probe_timeout_s", 0.5)
    line = _run(trainer_cls=SlowStepTrainer).settings["auto"]["line"]
    assert "probe failed" not in line and "a step of 100.0 ms" in line
    # A timeout given is kept to.
    given = _run(trainer_cls=SlowStepTrainer, probe_timeout_s=0.5).settings["auto"]["line"]
    assert "probe failed" in given and "did not finish within 0.5 s" in given


def test_the_probe_deadline_is_bounded_by_its_timeout():
    from ddlf_actors.apps.schemes.probe import deadline

    assert deadline(20.0, 0.94, 24) == pytest.approx(20.0 + 24 * 0.94)
    assert deadline(20.0, 0.0, 24) == 20.0
    # a step reported longer than the timeout itself (it could not have been) counts as it
    assert deadline(20.0, 1e9, 24) == 20.0 * 25


def test_a_resumed_auto_run_keeps_its_choice(tmp_path):
    first = _run(checkpoint_dir=str(tmp_path))
    again = train(softmax_model_fn(), _data, workers=2, master_epochs=2, batch_size=16,
                  trainer_cls=NumpyTrainer, backend=FakeBackend(), progress=False,
                  resume=str(tmp_path))
    assert again.settings["auto"]["line"] == first.settings["auto"]["line"]
    assert again.settings["auto"]["probe"] == first.settings["auto"]["probe"]


def test_a_setting_only_another_scheme_reads_names_that_scheme():
    from ddlf_actors.apps.schemes.auto import named_by

    assert named_by({"workers": 2, "steps_per_round": 8}) is None
    assert named_by({"backup_workers": 1}) == "sync"
    assert named_by({"compression": ("fp16", "int8:ef")}) == "sync"
    assert named_by({"alpha": 0.5, "tau": 4}) == "easgd"
    assert named_by({"no_such_option": 1}) is None   # the usual TypeError follows


@pytest.mark.parametrize("steps", [2, 4, 8])
def test_evals_per_epoch_holds_whatever_rounds_auto_ends_with(steps):
    # 512 rows per trainer in batches of 16: 16, 8 or 4 rounds an epoch. eval_every counts
    # rounds, which auto only knows after its choice; evals_per_epoch does not.
    result = _run(compression="none", steps_per_round=steps, evals_per_epoch=4)
    assert len(result.history) == 32 // steps
    evaluated = [r["round"] for r in result.history if r["test_accuracy"] is not None]
    every = 32 // steps // 4
    assert evaluated == list(range(every, 32 // steps + 1, every)) and len(evaluated) == 4


def test_eval_every_and_evals_per_epoch_are_one_or_the_other():
    from ddlf_actors.apps.options import ConfigError

    with pytest.raises(ConfigError, match="evals_per_epoch=4 and eval_every=2 both set"):
        _run(evals_per_epoch=4, eval_every=2)


class TextLikeTrainer(NumpyTrainer):
    """Reports a GPT's figures to the probe: a step's time in proportion to its batch, and
    a noise scale of 2 samples (far below 2 trainers x 16)."""

    def probe_step(self, batch_size, steps=3):
        return {"step_s": 0.01 * batch_size}

    def probe_noise(self, batch_size, batches=8, budget_s=4.0, seed=0):
        return {"G2": 1.0, "trace": 2.0, "b_simple": 2.0, "n": batches, "seconds": 0.0}


def test_a_split_batch_runs_every_round_on_it_and_a_resume_keeps_it(tmp_path):
    # 512 rows a trainer: 16 steps of 16 are 2 rounds an epoch; of 8, 4.
    split = _run(trainer_cls=TextLikeTrainer, split_batch=None, checkpoint_dir=str(tmp_path))
    s = split.settings
    assert s["auto"]["batch_size"] == 8 and split.config.batch_size == 8
    assert "8 samples a step per trainer (the batch split 2 ways)" in s["auto"]["line"]
    assert len(split.history) == 4 and split.history[-1]["test_accuracy"] > 0.5
    again = train(softmax_model_fn(), _data, workers=2, master_epochs=2, batch_size=16,
                  trainer_cls=TextLikeTrainer, backend=FakeBackend(), progress=False,
                  resume=str(tmp_path))
    assert again.config.batch_size == 8 and again.settings["auto"] == {
        **s["auto"], "line": again.settings["auto"]["line"]}
    assert len(again.history) == 8
    # Given, split_batch=False wins: each trainer steps on the whole batch.
    kept = _run(trainer_cls=TextLikeTrainer, split_batch=False)
    assert kept.config.batch_size == 16 and len(kept.history) == 2
    assert kept.settings["auto"]["probe"]["noise"] is None


def test_a_split_batch_takes_the_rounds_plain_average_unless_an_outer_setting_is_given():
    # docs/training.md: the outer momentum makes up for K trainers moving 1/K as far per
    # sample; with the batch split they take one process's steps, and it only adds rate.
    split = _run(trainer_cls=TextLikeTrainer, split_batch=None).settings
    assert split["auto"]["batch_size"] == 8
    assert (split["options"]["outer_momentum"], split["options"]["outer_lr"],
            split["options"]["nesterov"]) == (0.0, 1.0, False)
    assert "the rounds' average as it is (no outer momentum)" in split["auto"]["line"]
    # An outer setting given wins, and the rest of the outer step keeps its defaults.
    given = _run(trainer_cls=TextLikeTrainer, split_batch=None, outer_momentum=0.5).settings
    assert given["auto"]["batch_size"] == 8 and given["options"]["outer_momentum"] == 0.5
    assert given["options"]["nesterov"] is True and "no outer momentum" not in given["auto"]["line"]
    # The whole batch on each trainer keeps the outer step's defaults.
    kept = _run(trainer_cls=TextLikeTrainer, split_batch=False).settings
    assert (kept["options"]["outer_momentum"], kept["options"]["outer_lr"],
            kept["options"]["nesterov"]) == (0.8, 0.7, True)
