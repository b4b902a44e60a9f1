"""The bookkeeping of benchmarks/training/train_compare.py's protocol (issue 21), with no TensorFlow:
the validation split, the first crossing of the target, interleaving, median and range,
which ratios are allowed, the choices file, and DDLF's history read as evaluation points
(one small run on the numpy trainer)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BENCH = os.path.join(_REPO, "benchmarks")
sys.path.insert(0, _REPO)
from benchmarks import protocol  # noqa: E402
from benchmarks.protocol import (  # noqa: E402
    ChoicesMissing,
    RatioRefused,
    SplitDataset,
    candidate_row,
    choose,
    ddlf_points,
    divergence,
    first_crossing,
    interleave,
    pair,
    read_choices,
    split_indices,
    summarize,
    write_choices,
)

sys.path.remove(_REPO)


# -- the validation split ------------------------------------------------------------------------


def test_selection_trains_on_the_first_50000_and_validates_on_the_last_10000():
    s = split_indices("select", 60_000, 10_000)
    assert np.array_equal(s.train, np.arange(50_000))
    assert np.array_equal(s.evaluate, np.arange(50_000, 60_000))
    assert s.eval_from == "train" and s.eval_name == "validation"
    assert not set(s.train.tolist()) & set(s.evaluate.tolist())


def test_the_final_run_trains_on_all_60000_and_evaluates_on_test():
    s = split_indices("final", 60_000, 10_000)
    assert np.array_equal(s.train, np.arange(60_000))
    assert np.array_equal(s.evaluate, np.arange(10_000))
    assert s.eval_from == "test" and s.eval_name == "test"


def test_limits_keep_the_first_images_of_each_part():
    s = split_indices("select", 60_000, 10_000, limit=2000, eval_limit=300)
    assert np.array_equal(s.train, np.arange(2000))
    assert np.array_equal(s.evaluate, np.arange(50_000, 50_300))
    s = split_indices("final", 60_000, 10_000, limit=70_000, eval_limit=300)
    assert len(s.train) == 60_000 and np.array_equal(s.evaluate, np.arange(300))


def test_split_refuses_an_unknown_stage_and_bad_limits():
    with pytest.raises(ValueError, match="stage"):
        split_indices("test", 60_000, 10_000)
    with pytest.raises(ValueError, match="limit"):
        split_indices("select", 60_000, 10_000, limit=0)
    with pytest.raises(ValueError, match="holdout"):
        split_indices("select", 5_000, 10_000)


class _Untouchable:
    """A test set that fails the test if anything reads it (its length is known)."""

    def __len__(self):
        return 10_000

    def __getitem__(self, item):
        raise AssertionError("selection read the test set")


def _fake_training_set():
    x = np.arange(60_000, dtype=np.float32).reshape(-1, 1)
    return x, (np.arange(60_000) % 10).astype(np.int64)


def test_the_split_dataset_never_reads_the_test_set_during_selection():
    x, y = _fake_training_set()
    ds = SplitDataset("select", loader=lambda: ((x, y), (_Untouchable(), _Untouchable())))
    (xt, yt), (xv, yv) = ds()
    assert np.array_equal(xt[:, 0], np.arange(50_000)) and np.array_equal(yt, y[:50_000])
    assert np.array_equal(xv[:, 0], np.arange(50_000, 60_000)) and np.array_equal(yv, y[50_000:])
    assert xt.flags["C_CONTIGUOUS"] and xv.flags["C_CONTIGUOUS"]


def test_the_split_dataset_of_the_final_run_evaluates_on_test():
    x, y = _fake_training_set()
    x_test = np.full((10_000, 1), -1.0, np.float32)
    y_test = np.zeros(10_000, np.int64)
    (xt, _), (xe, ye) = SplitDataset("final", loader=lambda: ((x, y), (x_test, y_test)))()
    assert len(xt) == 60_000 and np.all(xe == -1.0) and len(ye) == 10_000


# -- crossing the target -------------------------------------------------------------------------


def _pts(*triples):
    return [{"epoch": e, "train_s": t, "accuracy": a, "loss": 0.5} for e, t, a in triples]


def test_the_first_evaluation_at_or_above_the_target_counts_with_no_interpolation():
    pts = _pts((0.25, 10.0, 0.70), (0.5, 20.0, 0.849), (0.75, 30.0, 0.86), (1.0, 40.0, 0.90))
    hit = first_crossing(pts, 0.85)
    # 0.849 -> 0.86 between 20 and 30 s: charged the whole interval, not ~20.9 s.
    assert (hit.epoch, hit.train_s, hit.accuracy) == (0.75, 30.0, 0.86)
    assert first_crossing(_pts((1.25, 7.0, 0.85)), 0.85).epoch == 1.25   # equal counts
    assert first_crossing(pts, 0.95) is None


def test_a_later_dip_does_not_move_the_first_crossing_and_nan_never_crosses():
    pts = _pts((0.25, 5.0, float("nan")), (0.5, 9.0, 0.88), (0.75, 13.0, 0.80))
    hit = first_crossing(pts, 0.85)
    assert (hit.epoch, hit.train_s) == (0.5, 9.0)
    assert first_crossing(_pts((1.0, 1.0, float("nan"))), 0.1) is None


def test_divergence_is_a_nan_loss_or_accuracy_at_chance():
    ok = _pts((1.0, 1.0, 0.8))
    assert divergence(ok) is None
    assert "loss" in divergence([{**ok[0], "loss": float("nan")}])
    assert "chance" in divergence(_pts((1.0, 1.0, 0.11)))
    assert "training loss" in divergence(ok, [0.5, float("inf")])


# -- interleaving, median and range --------------------------------------------------------------


def test_runs_interleave_seed_by_seed_across_columns_and_candidates():
    a1, a2, b1 = {"optimizer": "adam", "lr": 1}, {"optimizer": "adam", "lr": 2}, {"x": 1}
    jobs = interleave("final", ["a", "b", "c"], [1, 2], {"a": [a1, a2], "b": [b1]})
    assert [(j.seed, j.column, j.candidate) for j in jobs] == [
        (1, "a", a1), (1, "a", a2), (1, "b", b1), (2, "a", a1), (2, "a", a2), (2, "b", b1)]
    assert all(j.stage == "final" for j in jobs)
    assert protocol.Job.from_json(json.loads(json.dumps(jobs[1].to_json()))) == jobs[1]


def test_median_and_range_with_seeds_that_never_reach_the_target():
    s = summarize([3.0, 1.0, 2.0])
    assert (s.median, s.lo, s.hi, s.missing) == (2.0, 1.0, 3.0, 0)
    assert summarize([4.0, 1.0, 2.0, 3.0]).median == 2.5
    s = summarize([3.0, None, 1.0])
    assert (s.median, s.lo, s.missing) == (3.0, 1.0, 1) and math.isinf(s.hi)
    assert math.isinf(summarize([None, None, 1.0]).median)
    assert summarize([]) is None
    assert protocol.fmt_summary(summarize([3.0, None, 1.0])) == "3.0 [1.0-never]"
    assert protocol.fmt_summary(summarize([None, None, 1.0])) == "never (1/3)"
    assert s.to_json() == {"median": 3.0, "min": 1.0, "max": None, "n": 3, "missing": 1}


# -- ratios --------------------------------------------------------------------------------------


def test_the_headline_ratios_each_compare_columns_that_differ_in_one_thing():
    kinds = {(p.a, p.b): p.kind for p in protocol.HEADLINE_PAIRS}
    assert kinds == {("ddlf-default", "ray-rounds"): "framework",
                     ("ddlf-default", "ddlf-default@ray"): "framework",
                     ("ddlf-alg6", "ray"): "framework", ("ddlf-alg6", "spark"): "framework",
                     ("ddlf-default", "ddlf-alg6"): "algorithm",
                     ("ddlf-default", "keras"): "algorithm",
                     ("ddlf-default", "raytrain"): "end-to-end"}


@pytest.mark.parametrize("kind, a, b", [
    ("framework", "ddlf-default", "ray"),        # framework and algorithm both differ
    ("framework", "ddlf-default", "spark"),
    ("framework", "ddlf-default", "ddlf-alg6"),  # same framework: nothing to compare
    ("algorithm", "ddlf-default", "ray"),        # two differences
    ("algorithm", "ddlf-default", "ray-rounds"),  # same algorithm
    ("end-to-end", "ddlf-default", "ddlf-alg6"),  # one difference: say which
])
def test_a_ratio_between_columns_that_differ_in_two_things_or_none_is_refused(kind, a, b):
    with pytest.raises(RatioRefused):
        pair(kind, a, b)


def test_ratio_pairing_refuses_unknown_kinds_and_columns_and_pairs_seeds():
    with pytest.raises(ValueError, match="kind"):
        pair("speed", "ddlf-default", "ray")
    with pytest.raises(ValueError, match="unknown column"):
        pair("framework", "ddlf-default", "horovod")
    assert pair("algorithm", "ray-rounds", "ray").kind == "algorithm"
    assert protocol.per_seed_ratios({1: 2.0, 2: 3.0, 3: None}, {1: 4.0, 2: 1.0, 4: 1.0}) == [0.5, 3.0]


def test_ratio_lines_label_their_kind_and_give_the_range_per_seed():
    def run(column, seed, spe, hit_t):
        return {"column": column, "seed": seed, "status": "ok", "train_s": spe * 2,
                "epochs_done": 2, "settings": "", "load_1min": 1.0,
                "evals": _pts((1.0, hit_t, 0.86), (2.0, spe * 2, 0.9))}

    results = [run("ddlf-default", 1, 20.0, 20.0), run("ray-rounds", 1, 25.0, 25.0),
               run("ddlf-default", 2, 22.0, 22.0), run("ray-rounds", 2, 20.0, 20.0)]
    rows = protocol.headline_rows(results, 0.85)
    text = protocol.ratio_lines(rows, 0.85)
    assert "[framework] ddlf-default / ray-rounds, s/epoch: 0.93x" in text
    assert "per seed 0.80-1.10" in text
    assert "keras" not in text.split("kinds:")[0]   # a column that did not run: no ratio


# -- selection and the choices file --------------------------------------------------------------


def _run(seed, times_accs, status="ok", loss=0.5):
    pts = [{"epoch": (i + 1) / 4, "train_s": t, "accuracy": a, "loss": loss}
           for i, (t, a) in enumerate(times_accs)]
    return {"seed": seed, "status": status, "evals": pts, "reason": "boom"}


def test_selection_chooses_the_least_time_to_target_then_the_best_accuracy():
    slow = candidate_row({"lr": 1}, [_run(1, [(10, 0.80), (20, 0.86), (30, 0.88)])], 0.85)
    fast = candidate_row({"lr": 2}, [_run(1, [(10, 0.86), (20, 0.87), (30, 0.87)])], 0.85)
    never = candidate_row({"lr": 3}, [_run(1, [(10, 0.80), (20, 0.84), (30, 0.849)])], 0.85)
    assert fast["time_to_target"]["median"] == 10 and fast["epochs_to_target"]["median"] == 0.25
    assert choose([slow, fast, never]) == 1
    # Nobody reaches the target: the best validation accuracy after the selection epochs.
    low = candidate_row({"lr": 4}, [_run(1, [(10, 0.70), (20, 0.80)])], 0.85)
    assert choose([low, never]) == 1
    # Equal times: the better accuracy wins.
    tie = candidate_row({"lr": 5}, [_run(1, [(10, 0.86), (20, 0.90)])], 0.85)
    assert choose([fast, tie]) == 1


def test_selection_uses_the_median_over_seeds():
    row = candidate_row({"lr": 1}, [_run(1, [(10, 0.9)]), _run(2, [(30, 0.9)]),
                                    _run(3, [(40, 0.80)])], 0.85)
    assert row["time_to_target"] == {"median": 30, "min": 10, "max": None, "n": 3, "missing": 1}


def test_a_candidate_that_diverged_or_failed_is_marked_and_never_chosen():
    nan = candidate_row({"lr": 9}, [_run(1, [(5, 0.99)], loss=float("nan"))], 0.85)
    failed = candidate_row({"lr": 8}, [_run(1, [], status="error")], 0.85)
    ok = candidate_row({"lr": 1}, [_run(1, [(50, 0.80)])], 0.85)
    assert nan["diverged"] and not failed["diverged"] and failed["problems"]
    assert choose([nan, failed, ok]) == 2
    assert choose([nan, failed]) is None


def test_choices_round_trip_and_the_final_run_refuses_without_them(tmp_path):
    path = str(tmp_path / "choices.json")
    with pytest.raises(ChoicesMissing, match="--select --columns keras"):
        read_choices(path, ["keras"])
    a = candidate_row({"optimizer": "sgd", "lr": 0.03, "momentum": 0.9},
                      [_run(1, [(10, 0.86)])], 0.85)
    b = candidate_row({"optimizer": "adam", "lr": 1e-3}, [_run(1, [(20, 0.86)])], 0.85)
    bad = candidate_row({"optimizer": "adam", "lr": 3e-3}, [_run(1, [], status="error")], 0.85)
    write_choices(path, {"keras": [b, a], "raytrain": [bad]}, {"target": 0.85, "limit": None})
    assert read_choices(path, ["keras"]) == {"keras": a["candidate"]}
    with pytest.raises(ChoicesMissing, match="raytrain .every candidate diverged or failed"):
        read_choices(path, ["keras", "raytrain"])
    with pytest.raises(ChoicesMissing, match="(?s)ray-rounds .not selected.*--select --columns ray-rounds"):
        read_choices(path, ["ray-rounds"])
    # A later selection of one column keeps the other columns' choices.
    write_choices(path, {"ray-rounds": [b]}, {"target": 0.85})
    assert read_choices(path, ["keras", "ray-rounds"]) == {"keras": a["candidate"],
                                                          "ray-rounds": b["candidate"]}
    with open(path) as f:
        doc = json.load(f)
    assert [r["chosen"] for r in doc["columns"]["keras"]["selection"]] == [False, True]


def _script(*args, timeout=60):
    return subprocess.run([sys.executable, os.path.join(_BENCH, "training", "train_compare.py"), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_the_script_refuses_the_final_run_without_choices_and_unknown_columns(tmp_path):
    out = _script("--columns", "keras,ray", "--choices", str(tmp_path / "none.json"))
    assert out.returncode != 0
    assert "--select --columns keras" in out.stderr and "none.json" in out.stderr
    out = _script("--columns", "keras,horovod")
    assert out.returncode != 0 and "horovod" in out.stderr and "ddlf-default@ray" in out.stderr


def test_columns_without_a_grid_need_no_choice_and_ddlf_on_ray_takes_ddlf_defaults():
    assert not protocol.COLUMNS["ray"].chooses and protocol.COLUMNS["ray"].fixed
    assert protocol.COLUMNS["ddlf-default@ray"].choice_from == "ddlf-default"
    assert len(protocol.COLUMNS["raytrain"].grid) == 12
    assert protocol.COLUMNS["ddlf-default"].grid[0] == protocol.MODEL_DEFAULT
    assert protocol.COLUMNS["keras"].grid == protocol.INNER_GRID


# -- DDLF's history as evaluation points ---------------------------------------------------------


def test_ddlf_rows_become_points_with_startup_and_evaluation_taken_out():
    history = [
        {"epoch": 0.5, "time_s": 12.0, "test_accuracy": None, "eval_s": 0.0},
        {"epoch": 1.0, "time_s": 14.0, "test_accuracy": 0.7, "test_loss": 0.9, "eval_s": 0.0},
        {"epoch": 1.5, "time_s": 17.0, "test_accuracy": None, "eval_s": 1.0},  # evaluates 1.0
        {"epoch": 2.0, "time_s": 19.0, "test_accuracy": 0.9, "test_loss": 0.3, "eval_s": 0.0},
    ]
    points, train_s, eval_s = ddlf_points(history, startup_s=10.0)
    assert [(p["epoch"], p["train_s"], p["accuracy"]) for p in points] == [(1.0, 4.0, 0.7),
                                                                          (2.0, 8.0, 0.9)]
    assert (train_s, eval_s) == (8.0, 1.0)
    assert protocol.evals_per_epoch(points) == 1.0


def test_a_real_ddlf_run_read_as_points_is_evaluated_between_rounds(train_cluster):
    from helpers_modules.numpy_trainer import NumpyTrainer, hard_blobs_dataset, softmax_model_fn

    from ddlf_actors.apps import train_sync

    r = train_sync(softmax_model_fn(64, 4), hard_blobs_dataset, workers=2, master_epochs=2,
                   rounds_per_epoch=8, eval_every=2, trainer_cls=NumpyTrainer, progress=False,
                   seed=3)
    points, train_s, eval_s = ddlf_points(r.history, r.startup_s)
    assert [p["epoch"] for p in points] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    assert protocol.evals_per_epoch(points) == 4.0
    times = [p["train_s"] for p in points]
    assert all(0 < a < b for a, b in zip(times, times[1:])) and times[-1] <= train_s + 1e-9
    assert eval_s > 0
    hit = first_crossing(points, 0.3)
    assert hit is not None and hit.epoch in [p["epoch"] for p in points]
    # The DDLF column labels its settings from the run's resolved scheme options (a
    # column's whole selection once failed on a setting read from TrainConfig instead),
    # and names the scheme the run was (issue 30: say which scheme the defaults ran).
    text = protocol.ran.describe_settings(r.options)
    assert text.startswith("8 rounds/epoch"), text
    assert protocol.ran.describe_run(r).startswith("sync: 8 rounds/epoch"), \
        protocol.ran.describe_run(r)
    assert protocol.ran.scheme_ran(r) == "sync"


def test_the_tables_mark_once_per_epoch_columns_failed_runs_and_the_choice():
    ok = {"column": "ray", "seed": 1, "status": "ok", "train_s": 30.0, "epochs_done": 2,
          "settings": "alg6", "load_1min": 2.5, "evals": _pts((1.0, 15.0, 0.8), (2.0, 30.0, 0.86))}
    failed = {"column": "spark", "seed": 1, "status": "error", "reason": "no Java",
              "load_1min": 3.0}
    table = protocol.headline_table(protocol.headline_rows([ok, failed], 0.85), 0.85, 2, "test")
    ray_line = next(line for line in table.splitlines() if line.startswith("ray "))
    assert "1.0*" in ray_line and "2.00" in ray_line and "30.0" in ray_line and "2.5-2.5" in ray_line
    assert "seed 1: error: no Java" in table
    rows = [candidate_row({"optimizer": "adam", "lr": 1e-3}, [_run(1, [(10, 0.86)])], 0.85),
            candidate_row({"optimizer": "sgd", "lr": 0.1, "momentum": 0.9},
                          [_run(1, [(10, 0.1)])], 0.85)]
    rows[0]["chosen"], rows[1]["chosen"] = True, False
    text = protocol.selection_table("keras", rows, 0.85, 2)
    assert "CHOSEN" in text.splitlines()[3] and "never chosen: seed 1: diverged: accuracy 0.100" in text


def test_the_harness_asks_round_schemes_for_evaluations_per_epoch():
    """auto picks its steps per round after start-up, so the harness asks for evaluations
    per epoch, not for a count of rounds predicted before the probe; a scheme without
    rounds (async) keeps what it had."""
    from benchmarks.protocol import cadence

    assert cadence.evaluations(None, {}, 4, 60000, 8) == {"evals_per_epoch": 8}
    assert cadence.evaluations("allreduce", {}, 4, 60000, 8) == {"evals_per_epoch": 8}
    assert cadence.evaluations("async", {}, 4, 60000, 8) == \
        cadence.eval_every("async", {}, 4, 60000, 8)


def test_a_setting_that_halves_the_batch_is_counted_in_the_predicted_rounds():
    """emu_streaming's auto+batch16 gives train() batch_size=16: the harness's prediction
    of the rounds (reported beside the rounds run) must count with it, not with 32."""
    from benchmarks.emulation.emu_streaming import options_for
    from benchmarks.protocol import cadence

    scheme, opts = options_for("auto+batch16", "int8:ef", 1)
    assert opts == {"batch_size": 16}
    # About 16 local steps a round: 7,500 samples per trainer are 234 steps of 32, 469 of 16.
    assert cadence.rounds_per_epoch("allreduce", {}, 8, 60000) == round(7500 / 32 / 16) == 15
    assert cadence.rounds_per_epoch("allreduce", opts, 8, 60000) == round(7500 / 16 / 16) == 29
