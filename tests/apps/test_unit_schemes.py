"""The scheme pieces that need no cluster: the registry, scheme settings, the outer
optimizer, learning rates, the work ledger, EASGD's exchange and sized pieces."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ddlf_actors.apps import UnknownSchemeError, train
from ddlf_actors.apps.config import ConfigError
from ddlf_actors.apps.options import SchemeOptions, int_at_least, option
from ddlf_actors.apps.schemes import (
    AllreduceMachine,
    DownpourMachine,
    EasgdMachine,
    Machine,
    OuterOptimizer,
    SyncOptions,
    registry,
    resolve_options,
)
from ddlf_actors.apps.schemes.averaging import apply_delta
from ddlf_actors.apps.schemes.easgd import elastic_exchange
from ddlf_actors.apps.schemes.ledger import WorkLedger
from ddlf_actors.apps.schemes.plan import Plan
from ddlf_actors.apps.schemes.rates import InnerRate, evaluate, k_multiplier, steps_in


def _w(v):
    return [np.full((3, 2), v, np.float32), np.full(2, v, np.float32)]


# -- the registry ------------------------------------------------------------------------------
def test_the_registry_holds_every_scheme_by_name():
    assert registry.names()[:5] == ["sync", "async", "allreduce", "easgd", "downpour"]
    assert registry.get("easgd") is EasgdMachine and registry.get("downpour") is DownpourMachine
    assert registry.get("allreduce") is AllreduceMachine
    with pytest.raises(UnknownSchemeError,
                       match="unknown scheme 'sinc'.*sync, async, allreduce, easgd"):
        registry.get("sinc")
    # train() refuses it before it starts anything (no cluster here).
    with pytest.raises(ValueError, match="unknown scheme 'sinc': the registered schemes are"):
        train(None, "fashion-mnist", scheme="sinc")


def test_register_adds_a_scheme_and_refuses_a_taken_name():
    import dataclasses

    @dataclasses.dataclass
    class MineOptions(SchemeOptions):
        rounds_per_epoch: int | None = option(None, check=int_at_least(1), help="rounds")

    class Mine(Machine):
        name = "mine-test"
        Options = MineOptions

    registry.register("mine-test", Mine)
    try:
        assert registry.get("mine-test") is Mine and "mine-test" in registry.names()
        assert "mine-test" in registry.accepting("rounds_per_epoch")
        with pytest.raises(ValueError, match="already registered to"):
            registry.register("sync", Mine)
    finally:
        registry._SCHEMES.pop("mine-test")


# -- scheme-level settings ---------------------------------------------------------------------
def test_a_setting_another_scheme_reads_is_refused_naming_who_reads_it():
    with pytest.raises(ConfigError, match="alpha= does not apply to the 'sync' scheme; it is "
                                          "read by 'easgd'") as e:
        resolve_options("sync", alpha=0.5)
    assert e.value.option == "alpha="
    with pytest.raises(ValueError, match="outer_momentum= does not apply to the 'async'"):
        resolve_options("async", outer_momentum=0.9)
    with pytest.raises(ValueError, match="staleness_bound=.*'async', 'easgd', 'downpour'"):
        resolve_options("sync", staleness_bound=1)
    with pytest.raises(TypeError, match="unknown option 'staleness_bund'; did you mean "
                                        "'staleness_bound'"):
        resolve_options("async", staleness_bund=1)


def test_defaults_fill_what_a_run_leaves_out_and_follow_what_it_sets():
    _, sync = resolve_options("sync")
    assert sync.outer_momentum == SyncOptions.DEFAULTS["outer_momentum"]
    # The rounds, the evaluations and the warm-up depend on the data's size: still left
    # out here, filled in once the trainers report it (test_more_schemes.py).
    assert sync.rounds_per_epoch is None and sync.eval_every is None
    assert sync.warmup_rounds is None
    # Without momentum there is no Nesterov; without scaling nothing to warm up, and the
    # outer step is a plain average.
    _, plain = resolve_options("sync", outer_momentum=0.0, lr_scaling="none")
    assert plain.nesterov is False and plain.warmup_rounds == 0 and plain.outer_lr == 1.0
    # outer_momentum=0 alone is a plain average too (not a damped one at the default rate).
    _, no_momentum = resolve_options("sync", outer_momentum=0.0)
    assert no_momentum.outer_lr == 1.0 and no_momentum.nesterov is False
    # lr_scaling="none" given is what the default is: the default outer rate stays.
    assert resolve_options("sync", lr_scaling="none")[1].outer_lr == \
        resolve_options("sync")[1].outer_lr == SyncOptions.DEFAULTS["outer_lr"]
    # The K rule on the trainers: the outer rate is 1; on the outer step: K x the default.
    assert resolve_options("sync", lr_scaling="inner")[1].outer_lr == 1.0
    assert resolve_options("sync", lr_scaling="outer")[1].outer_lr == \
        SyncOptions.DEFAULTS["outer_lr"]
    # The square-root rule on the trainers keeps the outer step, and has no warm-up
    # unless one is given.
    _, root = resolve_options("allreduce", lr_scaling="sqrt")
    assert root.outer_lr == SyncOptions.DEFAULTS["outer_lr"] and root.warmup_rounds == 0
    assert resolve_options("allreduce", lr_scaling="sqrt",
                           warmup_rounds=4)[1].warmup_rounds == 4
    assert resolve_options("easgd", workers=3)[1].alpha == pytest.approx(0.3)
    assert resolve_options("easgd", workers=3, alpha=0.1)[1].alpha == 0.1
    _, down = resolve_options("downpour")
    assert down.n_fetch and down.n_push and not hasattr(down, "rounds_per_epoch")


def test_settings_that_contradict_each_other():
    with pytest.raises(ValueError, match="warmup_rounds=3 ramps up a scaling rule for K"):
        resolve_options("sync", warmup_rounds=3, lr_scaling="none")
    with pytest.raises(ValueError, match="nesterov=True needs outer_momentum > 0"):
        resolve_options("sync", nesterov=True, outer_momentum=0.0)
    with pytest.raises(ValueError, match="the larger must be a multiple of the smaller.*4 and 8"):
        resolve_options("downpour", n_fetch=4, n_push=6)
    with pytest.raises(ConfigError, match="backup_workers must be less than workers"):
        resolve_options("sync", workers=2, backup_workers=2)
    # Every bad value is a ConfigError naming its option (the CLI names the flag from it).
    for scheme, bad in (("sync", dict(outer_momentum=1.0)), ("easgd", dict(alpha=0)),
                        ("sync", dict(outer_lr=-1)), ("easgd", dict(tau=0)),
                        ("sync", dict(lr_scaling="both")), ("sync", dict(nesterov="yes")),
                        ("async", dict(lr_schedule=0.1)), ("sync", dict(warmup_rounds=-1)),
                        ("sync", dict(master_epochs=0)), ("sync", dict(placement_strategy="X"))):
        with pytest.raises(ConfigError) as e:
            resolve_options(scheme, **bad)
        assert e.value.option.rstrip("=") == next(iter(bad)), e.value


def test_a_schedule_is_recorded_by_name_in_a_checkpoint():
    def halving(step):
        return 0.5 ** step

    saved = SyncOptions(outer_lr=halving).to_json()
    assert saved["outer_lr"].endswith("halving") and saved["outer_momentum"] is None


# -- the outer optimizer -----------------------------------------------------------------------
def test_plain_outer_step_is_plain_averaging_bit_for_bit():
    rng = np.random.default_rng(0)
    w = [rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)]
    g = [rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)]
    opt = OuterOptimizer()
    assert opt.plain
    for a, b in zip(opt.step(w, g, k=3), apply_delta(w, g)):
        np.testing.assert_array_equal(a, b)
    assert opt.state() == []


@pytest.mark.parametrize("nesterov", [False, True])
def test_outer_momentum_follows_its_formula(nesterov):
    mu, lr = 0.8, 0.5
    opt = OuterOptimizer(lr, mu, nesterov)
    w, v = _w(0.0), 0.0
    for t, g in enumerate([1.0, 2.0, -1.0, 0.5]):
        w = opt.step(w, _w(g))
        v = mu * v + g
        expected = -sum(lr * ((gi + mu * vi) if nesterov else vi)
                        for gi, vi in _history(mu, [1.0, 2.0, -1.0, 0.5][:t + 1]))
        np.testing.assert_allclose(w[0], expected, rtol=1e-6)
    np.testing.assert_allclose(opt.state()[0], v, rtol=1e-6)


def _history(mu, grads):
    v, out = 0.0, []
    for g in grads:
        v = mu * v + g
        out.append((g, v))
    return out


def test_outer_rate_scales_with_k_after_a_linear_warm_up():
    opt = OuterOptimizer(1.0, scale_with_k=True, warmup_rounds=4)
    rates = []
    w = _w(0.0)
    for _ in range(6):
        rates.append(opt.rate(3))
        w = opt.step(w, _w(1.0), k=3)
    assert rates == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0, 3.0])
    np.testing.assert_allclose(w[0], -sum(rates), rtol=1e-6)
    # A schedule of the round replaces the constant rate.
    sched = OuterOptimizer(lambda t: 1.0 / (t + 1))
    sched.step(_w(0.0), _w(1.0))
    assert sched.rate(1) == pytest.approx(0.5)


def test_outer_state_round_trip_continues_bit_equal():
    rng = np.random.default_rng(1)
    grads = [[rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)]
             for _ in range(6)]
    whole = OuterOptimizer(0.7, 0.9, True)
    w = _w(0.0)
    for g in grads:
        w = whole.step(w, g, 2)
    first = OuterOptimizer(0.7, 0.9, True)
    w2 = _w(0.0)
    for g in grads[:3]:
        w2 = first.step(w2, g, 2)
    resumed = OuterOptimizer(0.7, 0.9, True)
    resumed.load_state(first.state(), first.steps)
    for g in grads[3:]:
        w2 = resumed.step(w2, g, 2)
    for a, b in zip(w, w2):
        np.testing.assert_array_equal(a, b)


# -- learning rates ----------------------------------------------------------------------------
def test_rates_schedules_and_the_linear_scaling_rule():
    assert k_multiplier(0, 4, 3) == 1.0 and k_multiplier(3, 4, 3) == 4.0
    assert k_multiplier(1, 4, 3) == pytest.approx(2.0) and k_multiplier(0, 4, 0) == 4.0
    assert k_multiplier(5, 1, 3) == 1.0
    # The square-root rule: sqrt(K) after the warm-up, reached linearly from 1.
    assert k_multiplier(0, 4, 0, power=0.5) == 2.0 and k_multiplier(1, 4, 2, 0.5) == 1.5
    assert k_multiplier(0, 9, 0, 0.5) == pytest.approx(3.0)
    assert steps_in(100, 32) == 4 and steps_in(96, 32, 2) == 6
    assert evaluate(0.1, 7) == 0.1 and evaluate(lambda s: 0.1 * s, 3) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="gave 0.0 at step 0"):
        evaluate(lambda s: 0.1 * s, 0)
    assert InnerRate().at(0, 0, 2) is None                     # trainers keep their own
    inner = InnerRate(scale_with_k=True, warmup_rounds=2, base=0.01)
    assert [inner.at(r, 0, 2) for r in range(3)] == pytest.approx([0.01, 0.015, 0.02])
    with pytest.raises(ValueError, match="report none"):
        InnerRate(scale_with_k=True).at(0, 0, 2)
    root = InnerRate(scale_with_k=True, base=0.001, power=0.5)
    assert [root.at(r, 0, 4) for r in range(2)] == pytest.approx([0.002, 0.002])


def test_a_keras_schedule_is_evaluated_on_the_driver():
    keras = pytest.importorskip("keras")
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    assert evaluate(decay, 10) == pytest.approx(0.05)
    assert InnerRate(decay).at(0, 20, 2) == pytest.approx(0.025)


def test_a_keras_trainer_sets_its_optimizers_rate():
    keras = pytest.importorskip("keras")
    from ddlf_actors.apps.frameworks import for_model

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    adapter = for_model(model)(model)            # what a trainer's hooks call
    assert adapter.name == "keras"
    assert adapter.get_learning_rate() == pytest.approx(0.01)
    adapter.set_learning_rate(0.25)
    assert adapter.get_learning_rate() == pytest.approx(0.25)
    scheduled = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    scheduled.compile(optimizer=keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)), loss="mse")
    with pytest.raises(TypeError, match="pass the schedule as lr_schedule= instead"):
        for_model(scheduled)(scheduled).set_learning_rate(0.1)


# -- the work ledger ---------------------------------------------------------------------------
def test_work_straddling_a_row_boundary_is_split_by_time():
    ledger = WorkLedger(start=0.0)
    ledger.dispatched("a", 0, 0.0)
    ledger.dispatched("b", 1, 0.0)
    ledger.finished("a", compute_s=3.0, eval_s=1.0, when=5.0)   # busy 1..5
    first = ledger.close(6.0)            # b still running: 0..6 counted as compute
    assert first == {0: (3.0, 1.0), 1: (6.0, 0.0)}
    ledger.finished("b", compute_s=9.5, eval_s=0.0, when=10.0)  # busy 0.5..10
    second = ledger.close(12.0)
    assert second == {1: (4.0, 0.0)}     # only its part after 6 s
    # A call that began before the window and finished in it counts from the window.
    ledger.dispatched("c", 0, 11.0)
    ledger.finished("c", 5.0, 0.0, when=13.0)   # says 5 s of work, but left at 11
    assert ledger.close(14.0) == {0: (1.0, 0.0)}


def test_no_trainer_is_ever_busier_than_the_window():
    rng = np.random.default_rng(3)
    ledger, now, rows = WorkLedger(0.0), 0.0, []
    running = {}
    for i in range(400):
        now += float(rng.exponential(0.3))
        for j in (0, 1, 2):
            if j not in running:
                running[j] = (f"call{i}-{j}", now)
                ledger.dispatched(running[j][0], j, now)
        j = int(rng.integers(0, 3))
        call, started = running.pop(j)
        # The trainer's own figure may exceed what the driver saw (clock, queueing).
        ledger.finished(call, compute_s=(now - started) * float(rng.uniform(0.5, 1.5)),
                        eval_s=float(rng.uniform(0, 0.2)), when=now)
        if i % 7 == 0:
            start = ledger.start
            rows.append((now - start, ledger.close(now)))
    assert rows
    for wall, work in rows:
        assert all(c + e <= wall + 1e-9 for c, e in work.values())


def test_a_rows_overhead_is_never_negative_from_float_rounding():
    # The ledger keeps a trainer's busy time within the wall time up to rounding: 0.1 + 0.2
    # is a hair above 0.3, which once gave overhead_s = -1.4e-17 on a real run.
    stub = SimpleNamespace(ctx=SimpleNamespace(t0=0.0), now=1.0, bytes_sent=0,
                           bytes_received=0)
    stats = [{"index": 0, "samples": 4, "loss": 1.0, "compute_s": 0.3, "idle_s": 0.0}]
    row = Machine.new_row(stub, 1, 0.5, stats, 0.3, work={0: (0.1 + 0.2, 0.0)})
    assert row["overhead_s"] == 0.0 and row["compute_s"] == 0.1 + 0.2


# -- easgd and downpour pieces -----------------------------------------------------------------
def test_elastic_exchange_moves_both_by_alpha_of_their_gap():
    center, local = _w(0.0), _w(10.0)
    c, x = elastic_exchange(center, local, 0.25)
    np.testing.assert_allclose(c[0], 2.5)
    np.testing.assert_allclose(x[0], 7.5)
    assert c[0].dtype == np.float32


def test_sized_pieces_cover_the_epoch_once():
    plan = Plan(seed=4, rounds_per_epoch=1, num_train=100)
    pieces = plan.sized_pieces(1, 32)
    assert [len(p) for p in pieces] == [32, 32, 32, 4]
    assert sorted(np.concatenate(pieces).tolist()) == list(range(100))
