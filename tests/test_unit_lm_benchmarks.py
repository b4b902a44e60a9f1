"""benchmarks/training/lm_compare.py's (its table: lm_report.py) and
benchmarks/emulation/lm_emu.py's bookkeeping (issue 32 §4), without torch or a cluster:
the figures of a run (a target *loss*, reached going down), the ratios the issue's
targets are judged by, the budget's steps and the tables."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def bench(monkeypatch):
    # The scripts set OMP_NUM_THREADS on import (before numpy and torch load): keep ours.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    from benchmarks.emulation import lm_emu
    from benchmarks.training import lm_compare, lm_report

    return lm_compare, lm_report, lm_emu


def _run(column, seed, losses, train_s, tokens=1000):
    rows = [{"epoch": (i + 1) / len(losses), "train_s": train_s * (i + 1) / len(losses),
             "test_loss": loss, "test_accuracy": 0.1} for i, loss in enumerate(losses)]
    return {"column": column, "seed": seed, "lr": 1e-3, "loadavg": 1.0, "timeline": rows,
            "train_s": train_s, "tokens_per_epoch": tokens, "startup_s": 2.0}


def test_the_target_is_a_loss_reached_from_above(bench):
    _, lm_report, _ = bench
    f = lm_report.figures(_run("torch-1p", 0, [3.0, 2.2, 1.9, 1.8], 40.0), 2.0)
    assert f["epochs_to_target"] == 0.75 and f["time_to_target"] == 30.0
    assert f["s_per_epoch"] == 40.0 and f["tokens_per_s"] == 25.0 and f["final_loss"] == 1.8
    assert lm_report.figures(_run("torch-1p", 0, [3.0, 2.5], 10.0), 2.0)["time_to_target"] \
        is None


def test_ratios_are_per_seed_against_the_single_process_and_ddp(bench):
    _, lm_report, _ = bench
    results = [_run("torch-1p", 0, [3.0, 1.9], 100.0), _run("torch-ddp", 0, [3.0, 1.9], 200.0),
               _run("ddlf-default", 0, [3.0, 1.9], 80.0), _run("torch-1p", 1, [3.0, 1.9], 90.0),
               {"column": "ddlf-default", "seed": 1, "lr": 1e-3, "loadavg": 1.0,
                "error": "boom"}]
    lines = lm_report.ratio_lines(results, 2.0)
    assert lines[0] == "ddlf-default / torch-1p, time to the target: 0.80x (target <= 1.0x)"
    assert "+0.0 %" in lines[1]
    assert lines[2].startswith("ddlf-default / torch-ddp, time to the target: 0.40x")
    table = lm_report.report_table(results, 2.0, "t")
    assert "| ddlf-default | 0.001 | 80.0 |" in table and "1 failed: boom" in table
    assert "epochs to 2.0000" in table


def test_the_budget_in_steps_and_an_estimate(bench):
    lm_compare, _, lm_emu = bench
    assert lm_compare.steps_for(1000, 32, 1.0) == (31, 31)
    assert lm_compare.steps_for(1000, 64, 0.5) == (15, 8)
    args = type("A", (), {"size": "small", "epochs": 1.0, "select": False})()
    hours = lm_compare.estimate(args, list(lm_compare.COLUMNS), [0, 1, 2]) / 3600
    assert 3 < hours < 8
    plan = {"size": "small", "rates": ["100mbit"], "settings": ["sync"], "seeds": [1],
            "epochs": 1.0, "context": 128}
    assert lm_emu.estimate(plan, [4]) < lm_emu.estimate(plan, [1])


def test_the_emulated_table_gives_efficiency_against_k_1(bench):
    _, _, lm_emu = bench

    def run(k, times_losses):
        rows = [{"round": i + 1, "epoch": (i + 1) / len(times_losses), "time_s": t,
                 "test_loss": loss, "compute_total_s": k * t / (i + 1), "bytes_sent": 10,
                 "bytes_received": 10, "ring_bytes": 0}
                for i, (t, loss) in enumerate(times_losses)]
        return {"rate": "100mbit", "codec": "sync", "k": k, "seed": 1, "rows": rows,
                "load": [1.0, 1.2]}

    table = lm_emu.table([run(1, [(100, 2.5), (200, 1.9)]), run(4, [(40, 2.2), (70, 1.95)])],
                         2.0)
    assert "| 100mbit | sync | 1 | 1 | 200.0 | 1.000 | 1/1 |" in table
    assert "| 100mbit | sync | 4 | 1 | 70.0 | 1.000 | 1/1 | 71% |" in table
    # A run's training seconds (its evaluations taken out) count when recorded.
    timed = run(4, [(40, 2.2), (70, 1.95)])
    for row, train_s in zip(timed["rows"], (30.0, 50.0)):
        row["train_s"] = train_s
    assert lm_emu.time_to(timed, 2.0) == 50.0
    assert "| 100mbit | sync | 4 | 1 | 50.0 | 1.000 | 1/1 | 100% |" in lm_emu.table(
        [run(1, [(100, 2.5), (200, 1.9)]), timed], 2.0)
    # Without its own K = 1 a setting is against the defaults' K = 1, on any link.
    alone = {**run(1, [(100, 2.5), (200, 1.9)]), "codec": "defaults"}
    dp = {**run(4, [(100, 1.9)]), "codec": "dataparallel", "rate": "1gbit"}
    assert "| 1gbit | dataparallel | 4 | 1 | 100.0 | 1.000 | 1/1 | 50% |" in lm_emu.table(
        [alone, dp], 2.0)
    # torchft's DiLoCo reports its evaluations only: no compute or driver bytes to show.
    diloco = {"rate": "1gbit", "codec": lm_emu.DILOCO, "k": 4, "seed": 1, "load": [1.0, 1.0],
              "rows": [{"epoch": 0.5, "train_s": 80.0, "time_s": 80.0, "test_loss": 1.9}]}
    assert "| 1gbit | torchft-diloco | 4 | 1 | 80.0 | 0.500 | 1/1 | 62% | - | 1.9000 | 160.0 | - |" \
        in lm_emu.table([alone, diloco], 2.0)


def test_the_emulated_table_prints_from_raw_files(bench, tmp_path, capsys):
    import gzip
    import json

    _, _, lm_emu = bench
    rows = [{"epoch": 0.25, "train_s": 30.0, "time_s": 31.0, "test_loss": 1.9}]
    one = {"rate": "1gbit", "codec": "defaults", "k": 1, "seed": 1, "load": [1, 1], "rows": rows}
    with gzip.open(tmp_path / "a.json.gz", "wt") as f:
        json.dump({"plan": {}, "results": [one]}, f)
    (tmp_path / "b.json").write_text(json.dumps({"plan": {}, "results": [{**one, "k": 2}]}))
    assert lm_emu.main(["--from", f"{tmp_path / 'a.json.gz'},{tmp_path / 'b.json'}",
                        "--target", "2.0"]) == 0
    out = capsys.readouterr().out
    assert "| 1gbit | defaults | 2 | 1 | 30.0 | 0.250 | 1/1 | 50% |" in out
    with pytest.raises(SystemExit, match="--target or --choices"):
        lm_emu.main(["--from", str(tmp_path / "b.json")])


def test_the_split_batch_column_is_ddlf_on_half_the_batch_and_only_when_named(bench,
                                                                               monkeypatch):
    lm_compare, _, _ = bench
    seen = []
    monkeypatch.setattr(lm_compare, "run_ddlf",
                        lambda args, batch=lm_compare.BATCH, **given:
                        seen.append((batch, given)) or {})
    lm_compare.RUNNERS["ddlf-split-batch"](None)
    # Half the batch per trainer, which auto must not split again.
    assert seen == [(lm_compare.BATCH // 2, {"split_batch": False})]
    assert "ddlf-split-batch" not in lm_compare.COLUMNS   # not in the table
    with pytest.raises(SystemExit) as e:
        lm_compare.main(["--columns", "ddlf-spilt-batch", "--estimate"])
    assert e.value.code == 2


def test_a_diagnostic_ddlf_column_gets_its_own_ratios_after_the_defaults(bench):
    _, lm_report, _ = bench
    results = [_run("ddlf-split-batch", 0, [3.0, 1.9], 50.0),
               _run("torch-1p", 0, [3.0, 1.9], 100.0),
               _run("ddlf-default", 0, [3.0, 1.9], 80.0)]
    lines = lm_report.ratio_lines(results, 2.0)
    assert lines[0] == "ddlf-default / torch-1p, time to the target: 0.80x (target <= 1.0x)"
    assert "ddlf-split-batch / torch-1p, time to the target: 0.50x (target <= 1.0x)" in lines


def test_the_emulated_defaults_are_what_train_runs_given_nothing(bench):
    import inspect

    from ddlf_actors.apps import train

    _, _, lm_emu = bench
    assert lm_emu.setting("defaults", "int4:ef") == (
        inspect.signature(train).parameters["scheme"].default, {})
    assert lm_emu.setting("allreduce+overlap+codec", "int4:ef") == (
        "allreduce", {"overlap": True, "compression": "int4:ef"})
    with pytest.raises(SystemExit, match="unknown setting"):
        lm_emu.setting("defualts", "int4:ef")
    assert lm_emu.main(["--settings", "defaults", "--estimate", "--size", "tiny"]) == 0


def test_diloco_across_k_hosts_puts_replica_r_in_its_host_with_the_world_size(bench,
                                                                             monkeypatch):
    """lm_emu.py's torchft-diloco column (``torchft_diloco.linked_diloco``): the lighthouse
    in host 0 sized for K replicas, replica r in host r + 1 on that host's address, each
    with the run's flags; replica 0's line is the result. Stand-in processes, no torch."""
    import subprocess
    import sys
    import types

    from benchmarks.peers import torchft_diloco

    monkeypatch.setitem(sys.modules, "torchft", types.ModuleType("torchft"))
    started = []

    class Hosts:
        ips = [f"10.9.0.{i + 1}" for i in range(5)]

        def popen(self, i, cmd, **kw):
            if "--lighthouse-server" in cmd:
                code = ("import json, sys; print(json.dumps({'lighthouse_port': 7, "
                        "'barrier_port': 8}), flush=True); sys.stdin.read()")
            else:
                rank = cmd[cmd.index("--diloco-replica") + 1]
                code = (f"import json; print(json.dumps({{'rank': {rank}, 'timeline': [], "
                        "'train_s': 1.0, 'startup_s': 0.5}))")
            proc = subprocess.Popen([sys.executable, "-c", code], **kw)
            started.append((i, cmd, proc))
            return proc

    args = type("A", (), {"timeout": 60})()
    try:
        got = torchft_diloco.linked_diloco(args, Hosts(), "lm_compare.py",
                                           replica_hosts=range(1, 5), flags=["--seed", "3"])
    finally:
        for _, _, proc in started:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(10)
    assert got == {"rank": 0, "timeline": [], "train_s": 1.0, "startup_s": 0.5}
    lighthouse = started[0][1]
    assert started[0][0] == 0 and lighthouse[lighthouse.index("--diloco-world") + 1] == "4"
    for r, (host, cmd, _) in enumerate(started[1:]):
        assert host == r + 1 and cmd[cmd.index("--diloco-replica") + 1] == str(r)
        assert cmd[cmd.index("--host-ip") + 1] == Hosts.ips[r + 1]
        assert cmd[cmd.index("--lighthouse") + 1] == "http://10.9.0.1:7"
        assert cmd[cmd.index("--diloco-world") + 1] == "4" and cmd[-2:] == ["--seed", "3"]
