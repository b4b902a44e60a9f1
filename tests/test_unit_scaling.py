"""benchmarks/emulation's scaling table (issue 30 section 5), with no cluster: the
efficiencies and ratios from made-up runs, which runs a grid makes and in what order, the
caps per K, the final run's refusal without the tuned columns' choices, and that every
column of a seed starts from the same weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMU = os.path.join(ROOT, "benchmarks", "emulation", "cluster_emu.py")
sys.path.insert(0, ROOT)
from benchmarks import protocol  # noqa: E402
from benchmarks.emulation import scaling_plan, scaling_table  # noqa: E402
from benchmarks.emulation.tuned_model import GRID, MODEL_DEFAULT, parse_optimizer  # noqa: E402

sys.path.remove(ROOT)
TARGET = 0.875


def _run(column, k, seed, hit_s, s_per_epoch, final=0.90, *, rate="1gbit", cpus=0.5,
         epochs=2, evals=8, stopped=False, head=1.0, driver=2.0, wall=100.0, ran="sync"):
    """One run's record as the driver keeps it: ``evals`` points an epoch and one more
    where the target is first reached, after ``hit_s`` training seconds (None: never),
    ``s_per_epoch``; ``final`` the last accuracy."""
    n = epochs * evals
    done = epochs * (0.5 if stopped else 1.0)
    times = [s_per_epoch * i / evals for i in range(1, int(n * done / epochs) + 1)]
    if hit_s is not None:
        times = sorted(set(times) | {hit_s})
    points = [{"epoch": t / s_per_epoch, "train_s": t, "loss": 0.3,
               "accuracy": 0.8 if hit_s is None or t < hit_s else TARGET + 0.001}
              for t in times]
    if hit_s is not None:
        points[-1]["accuracy"] = final
    return {"column": column, "k": k, "cpus": cpus, "rate": None if column == "single" else rate,
            "seed": seed, "status": "ok", "evals": points, "epochs_done": done,
            "train_s": s_per_epoch * done, "epochs": epochs, "evals_per_epoch": evals,
            "startup_s": 9.0, "scheme_ran": ran, "settings": f"{ran}: 29 rounds/epoch",
            "load": [1.0, 1.5], "machine_cpus": 2,
            "cpu": {"wall_s": wall, "head_cpu_s": head, "driver_cpu_s": driver,
                    "nodes_cpu_s": [0.5 * wall * 0.9] * k}}


def _row(table, k, column, rate="1gbit", cpus=0.5):
    rate = None if column == "single" else rate
    return next(r for r in table if (r["k"], r["column"], r["rate"], r["cpus"]) ==
                (k, column, rate, cpus))


def test_efficiencies_are_ratios_of_the_medians_against_the_single_process():
    runs = []
    for seed, jitter in ((1, 0.0), (2, 2.0), (3, -2.0)):
        runs += [_run("single", 1, seed, 40.0 + jitter, 80.0),        # T1 = 40, S1 = 80
                 _run("defaults", 1, seed, 50.0 + jitter, 100.0),     # its own K = 1: 100
                 _run("defaults", 4, seed, 25.0 + jitter, 40.0, final=0.885),
                 _run("dataparallel", 4, seed, 50.0 + jitter, 30.0, final=0.89)]
    table = scaling_table.rows(runs, TARGET)
    d4 = _row(table, 4, "defaults")
    # T1 / (K·TK) = 40 / (4 · 25) = 40 %; throughput 100 / (4 · 40) = 62.5 %.
    assert d4["ttt_eff"] == pytest.approx(0.40)
    assert d4["throughput_eff"] == pytest.approx(100 / (4 * 40))
    assert d4["vs_dataparallel"] == pytest.approx(25 / 50)
    assert d4["vs_single_points"] == pytest.approx(100 * (0.885 - 0.90))
    assert d4["time_to_target"].lo == pytest.approx(23.0) and d4["time_to_target"].hi == 27.0
    # Data-parallel's throughput has no K = 1 of its own here: not made up from another's.
    assert _row(table, 4, "dataparallel")["throughput_eff"] is None
    single = _row(table, 1, "single")
    assert single["ttt_eff"] == pytest.approx(1.0) and single["throughput_eff"] == 1.0
    # The CPU the head and driver took: (1 + 2) CPU seconds over 100 s of wall.
    assert d4["head_driver_cpu_median"] == pytest.approx(0.03)
    assert d4["nodes_cpu_median"] == pytest.approx(4 * 0.45)
    lines = "\n".join(scaling_table.markdown(table, TARGET))
    k4 = next(line for line in lines.splitlines() if "| 4 |" in line and "defaults" in line)
    assert "| 25.0 [23.0–27.0] |" in k4 and "| 40% |" in k4 and "| 62% |" in k4
    assert "| 0.50× |" in k4 and "| -1.50 |" in k4 and "| 1.80 of 2 |" in k4
    assert "a machine of 2 CPUs" in lines and "DDLF's defaults at K = 4, 1 Gbit/s: sync" in lines


def test_efficiencies_are_per_cap_and_per_link():
    runs = [_run("single", 1, 1, 40.0, 80.0), _run("single", 1, 1, 80.0, 160.0, cpus=0.25),
            _run("defaults", 8, 1, 20.0, 40.0, cpus=0.25),
            _run("defaults", 1, 1, 90.0, 170.0, cpus=0.25),
            _run("defaults", 1, 1, 90.0, 300.0, cpus=0.25, rate="100mbit"),
            _run("defaults", 8, 1, 40.0, 75.0, cpus=0.25, rate="100mbit")]
    table = scaling_table.rows(runs, TARGET)
    fast, slow = _row(table, 8, "defaults", cpus=0.25), \
        _row(table, 8, "defaults", "100mbit", cpus=0.25)
    assert fast["ttt_eff"] == pytest.approx(80 / (8 * 20))      # T1 at 0.25 CPU, not 0.5
    assert fast["throughput_eff"] == pytest.approx(170 / (8 * 40))
    assert slow["throughput_eff"] == pytest.approx(300 / (8 * 75))   # its own link's K = 1
    assert [r["cpus"] for r in table] == sorted((r["cpus"] for r in table), reverse=True)


def test_a_target_never_reached_or_runs_stopped_early_are_said_not_guessed():
    coarse = _run("best:allreduce+codec", 2, 1, 30.0, 45.0, stopped=True, evals=2)
    coarse["evals_per_epoch"] = 8   # asked for 8, evaluated twice an epoch
    runs = [_run("single", 1, s, 40.0, 80.0) for s in (1, 2)]
    runs += [_run("defaults", 2, 1, None, 50.0), _run("defaults", 2, 2, None, 50.0), coarse,
             {"column": "best:allreduce+codec", "k": 2, "cpus": 0.5, "rate": "1gbit",
              "seed": 2, "status": "error", "reason": "RuntimeError: boom"}]
    table = scaling_table.rows(runs, TARGET)
    never = _row(table, 2, "defaults")
    assert never["ttt_eff"] is None and never["time_to_target_median"] is None
    best = _row(table, 2, "best:allreduce+codec")
    assert best["fixed_accuracy"] is None and best["stopped_early"] == 1
    text = "\n".join(scaling_table.markdown(table, TARGET))
    assert "never (0/2)" in text
    assert "failed: best (allreduce+codec) at K = 2, 1 Gbit/s, 0.5 CPU, seed 2: error: " \
        "RuntimeError: boom" in text
    assert "No accuracy after the fixed epochs" in text and "(!)" in text


def test_caps_per_k_and_a_k1_baseline_for_every_cap():
    assert scaling_plan.default_cpus(4) == 0.5 and scaling_plan.default_cpus(8) == 0.25
    assert scaling_plan.clusters([1, 2, 4, 8], {}) == [(1, 0.5), (2, 0.5), (4, 0.5),
                                                        (1, 0.25), (8, 0.25)]
    assert scaling_plan.clusters([4], {4: 0.4}) == [(1, 0.4), (4, 0.4)]
    assert scaling_plan.clusters([2, 4], {}, node_cpus=1.0) == [(1, 1.0), (2, 1.0), (4, 1.0)]
    assert scaling_plan.parse_cpus("1:0.5, 8:0.25") == {1: 0.5, 8: 0.25}
    for bad in ("8=0.25", "8:zero", "8:0"):
        with pytest.raises(ValueError, match="--cpus"):
            scaling_plan.parse_cpus(bad)


def _grid(**kw):
    g = {"columns": ["single", "dataparallel", "defaults", "best:allreduce+codec"],
         "rates": ["1gbit", "100mbit"], "seeds": [1, 2, 3], "epochs": 5, "target": TARGET,
         "model": "wide_cnn", "codec": "int4:ef", "fragments": 4, "evals_per_epoch": 8}
    return {**g, **kw}


def test_final_runs_interleave_seeds_and_the_single_process_runs_once_per_seed():
    chosen = {"single": GRID[1], "dataparallel@K1": GRID[0], "dataparallel@K4": GRID[5]}
    k1 = scaling_plan.final_jobs(1, 0.5, _grid(), chosen)
    assert [(j["rate"], j["seed"], j["column"]) for j in k1[:5]] == [
        (None, 1, "single"), ("1gbit", 1, "dataparallel"), ("1gbit", 1, "defaults"),
        ("1gbit", 1, "best:allreduce+codec"), (None, 2, "single")]
    assert sum(j["column"] == "single" for j in k1) == 3        # no link: not per rate
    k4 = scaling_plan.final_jobs(4, 0.5, _grid(), chosen)
    assert not any(j["column"] == "single" for j in k4) and len(k4) == 2 * 3 * 3
    by = {j["column"]: j for j in k4}
    assert by["dataparallel"]["candidate"] == GRID[5]           # chosen for its own K
    assert by["defaults"]["candidate"] == MODEL_DEFAULT         # never tuned
    assert (by["defaults"]["scheme"], by["defaults"]["options"]) == (None, {})
    assert by["best:allreduce+codec"]["options"] == {"compression": "int4:ef"}
    assert len({j["run_id"] for j in k1 + k4}) == len(k1 + k4)
    stop = scaling_plan.final_jobs(4, 0.5, _grid(stop_at=["dataparallel"]), chosen)
    assert {j["column"]: j["stop_at_target"] for j in stop} == {
        "dataparallel": TARGET, "defaults": None, "best:allreduce+codec": None}


def test_a_k1_only_added_as_the_baseline_runs_no_best_setting_and_no_data_parallel():
    chosen = {"single": GRID[1], "dataparallel@K1": GRID[0], "dataparallel@K4": GRID[5]}
    # --ks 4: K = 1 is there for T1 and the defaults' own K = 1, not for the best settings
    # or data-parallel (a ring of one), which then need no choice at K = 1 either.
    added = scaling_plan.final_jobs(1, 0.5, _grid(ks=[4]), chosen)
    assert {j["column"] for j in added} == {"single", "defaults"}
    assert {j["column"] for j in scaling_plan.select_jobs(
        1, 0.5, _grid(ks=[4], seeds=[1001]), GRID)} == {"single"}
    asked = scaling_plan.final_jobs(1, 0.5, _grid(ks=[1, 4]), chosen)
    assert {"best:allreduce+codec", "dataparallel"} <= {j["column"] for j in asked}
    assert {j["column"] for j in scaling_plan.select_jobs(
        1, 0.5, _grid(ks=[1, 4], seeds=[1001]), GRID)} == {"single", "dataparallel"}
    # The settings on top of auto name auto, and their one setting.
    assert scaling_plan.column_spec("best:auto+sqrt", "int4:ef", 4) == (
        "auto", {"lr_scaling": "sqrt"})


def test_selection_tries_the_grid_defined_once_on_validation():
    assert [(c["optimizer"], c["lr"]) for c in GRID] == [
        ("adam", 3e-4), ("adam", 1e-3), ("adam", 2e-3), ("adam", 4e-3),
        ("sgd", 0.01), ("sgd", 0.03), ("sgd", 0.1)]
    assert all(c.get("momentum", 0.9) == 0.9 for c in GRID)
    jobs = scaling_plan.select_jobs(2, 0.5, _grid(seeds=[1001]), GRID)
    assert {j["column"] for j in jobs} == {"dataparallel"}      # single only at K = 1
    assert [j["candidate"] for j in jobs] == list(GRID)
    assert {(j["stage"], j["rate"]) for j in jobs} == {("select", "1gbit")}
    one = scaling_plan.select_jobs(1, 0.5, _grid(seeds=[1001]), GRID)
    assert [j["column"] for j in one].count("single") == len(GRID)


def test_the_final_run_refuses_without_the_tuned_columns_choices(tmp_path):
    path = str(tmp_path / "choices.json")
    keys = scaling_plan.needed_choices(["single", "dataparallel", "defaults"], [1, 2, 4])
    assert keys == ["single", "dataparallel@K1", "dataparallel@K2", "dataparallel@K4"]
    with pytest.raises(protocol.ChoicesMissing) as e:
        protocol.read_choices(path, keys, command=scaling_plan.select_command)
    assert ("cluster_emu.py scaling --select --columns single,dataparallel --ks 1,2,4 "
            f"--choices {path}") in str(e.value)
    row = protocol.candidate_row(GRID[1], [{"seed": 1001, "status": "ok", "label": "x",
                                            "evals": [{"epoch": 0.5, "train_s": 9.0,
                                                       "accuracy": 0.88}]}], TARGET)
    protocol.write_choices(path, {"single": [row], "dataparallel@K1": [row]}, {"target": TARGET})
    with pytest.raises(protocol.ChoicesMissing) as e:   # names only what is missing
        protocol.read_choices(path, keys, command=scaling_plan.select_command)
    assert "--columns dataparallel --ks 2,4 " in str(e.value)
    assert "dataparallel@K2 (not selected)" in str(e.value)
    # DDLF's defaults and best setting are never tuned: they need no choice.
    assert scaling_plan.needed_choices(["defaults", "best:allreduce"], [1, 4]) == []


def test_the_script_refuses_before_building_anything_and_names_the_command(tmp_path):
    path = tmp_path / "none.json"
    out = subprocess.run([sys.executable, EMU, "scaling", "--ks", "1,4", "--choices", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=os.sep)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "scaling --select --columns single" in out.stderr and str(path) in out.stderr
    assert "emu: namespaces" not in out.stderr          # nothing was built
    # The command it names parses with the script's own parser.
    cmd = out.stderr.split("Run first:\n")[1].split()
    from test_unit_benchmarks import parse_only

    got = parse_only([[cmd[2], cmd[3:]]])
    assert got == [{"ok": True}], got


def test_the_estimate_needs_no_choices_and_counts_every_run(tmp_path):
    out = subprocess.run([sys.executable, EMU, "scaling", "--estimate", "--ks", "1,2,4,8",
                          "--choices", str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=120, cwd=os.sep)
    assert out.returncode == 0, out.stderr
    assert "K=8 at 0.25 CPU" in out.stdout and "K=1 at 0.25 CPU" in out.stdout
    assert "5 cluster(s), 5 epochs: about" in out.stdout


def test_from_prints_the_table_of_a_partial_file(tmp_path):
    runs = [_run("single", 1, 1, 40.0, 80.0), _run("defaults", 2, 1, 30.0, 45.0)]
    path = tmp_path / "scaling.json.partial.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    out = subprocess.run([sys.executable, EMU, "scaling", "--from", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=os.sep)
    assert out.returncode == 0, out.stderr
    k2 = next(line for line in out.stdout.splitlines() if "| 2 |" in line)
    assert f"| {40 / (2 * 30):.0%} |" in k2 and "| **defaults** | sync |" in k2


def test_optimizers_from_the_command_line():
    assert parse_optimizer("model") == MODEL_DEFAULT
    assert parse_optimizer("adam:0.002") == {"optimizer": "adam", "lr": 0.002}
    assert parse_optimizer("sgdm:0.03") == {"optimizer": "sgd", "lr": 0.03, "momentum": 0.9}
    for bad in ("adam", "adam:-1", "rmsprop:0.01"):
        with pytest.raises(ValueError, match="sgdm:RATE"):
            parse_optimizer(bad)


@pytest.mark.timeout(300)
def test_every_column_of_a_seed_starts_from_the_same_weights():
    """The weights depend on the seed alone: the single process, data-parallel with its
    chosen optimizer and DDLF's defaults with the model's own start from the same point
    (a small wide_cnn, so the test builds in a second)."""
    code = """
import json, numpy as np
from benchmarks.emulation.tuned_model import TunedModel, GRID, MODEL_DEFAULT
from benchmarks.training.column_process import describe_optimizer
ms = [TunedModel("wide_cnn:4-8-16", 7, c)() for c in (MODEL_DEFAULT, GRID[0], GRID[6])]
other = TunedModel("wide_cnn:4-8-16", 8, MODEL_DEFAULT)()
same = all(np.array_equal(a, b) for m in ms[1:] for a, b in zip(ms[0].get_weights(), m.get_weights()))
differ = any(not np.array_equal(a, b) for a, b in zip(ms[0].get_weights(), other.get_weights()))
print(json.dumps([same, differ, [describe_optimizer(m.optimizer) for m in ms]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=280, env={**os.environ, "OMP_NUM_THREADS": "1",
                                           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-3000:]
    same, differ, optimizers = json.loads(out.stdout.strip().splitlines()[-1])
    assert same and differ
    assert optimizers[1:] == ["Adam lr 0.0003", "SGD m0.9 lr 0.1"]


def test_a_selection_grid_from_the_command_line_is_checked_before_anything_runs():
    from benchmarks.emulation.scaling import select_grid

    assert select_grid(None) == list(GRID)
    assert select_grid("adam:0.001, adam:0.002,sgdm:0.03") == [
        GRID[1], GRID[2], GRID[5]]
    for bad, why in ((",", "at least one"), ("adam:0.001,adam:1e-3", "named twice"),
                     ("model", "not a candidate"), ("adam:x", "adam:RATE")):
        with pytest.raises(ValueError, match=why):
            select_grid(bad)
