"""torch_compare.py's bookkeeping, without torch."""

from __future__ import annotations

import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # benchmarks.* from here


def test_a_ddlf_timeline_is_round_time_without_evaluation_and_start_up_is_not_taken_twice(
        monkeypatch):
    # The script sets OMP_NUM_THREADS on import (before numpy and torch load): keep ours.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    monkeypatch.syspath_prepend(_ROOT)
    from benchmarks.peers import torch_compare

    history = [
        {"epoch": 0.5, "wall_s": 2.0, "eval_s": 0.0, "test_accuracy": 0.80, "test_loss": 0.5},
        {"epoch": 0.75, "wall_s": 1.0, "eval_s": 0.0, "test_accuracy": None, "test_loss": None},
        {"epoch": 1.0, "wall_s": 2.5, "eval_s": 0.5, "test_accuracy": 0.86, "test_loss": 0.4},
    ]
    # Rows' wall times start when training does; the start-up is reported apart.
    tl = torch_compare.ddlf_timeline(history)
    assert [(r["epoch"], r["train_s"]) for r in tl.rows] == [(0.5, 2.0), (1.0, 5.0)]
    assert tl.train_s == 5.0
    from benchmarks.peers.torch_report import figures

    got = figures({"timeline": tl.rows, "train_s": tl.train_s}, 0.85)
    assert got["epochs_to_target"] == 1.0 and got["time_to_target"] == 5.0
    assert got["s_per_epoch"] == 5.0


def test_each_ddlf_column_trains_with_its_own_setting(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    monkeypatch.syspath_prepend(_ROOT)
    import argparse

    from benchmarks.peers import torch_compare

    seen = {}
    monkeypatch.setattr(torch_compare, "run_ddlf",
                        lambda args, model_fn, **options: seen.update({args.column: options}))
    for column in ("ddlf-torch-default", "ddlf-torch-alg6", "ddlf-torch-ring",
                   "ddlf-torch-ring-int4"):
        torch_compare.run_ddlf_column(argparse.Namespace(column=column, lr=0.02, seed=0), column)
    assert set(seen["ddlf-torch-default"]) == {"optimizer"}   # every scheme setting at default
    assert {k: v for k, v in seen["ddlf-torch-alg6"].items() if k != "optimizer"} == \
        torch_compare.ALG6
    assert {k: v for k, v in seen["ddlf-torch-ring"].items() if k != "optimizer"} == \
        {"scheme": "allreduce"}
    ring = seen["ddlf-torch-ring-int4"]
    assert (ring["scheme"], ring["overlap"], ring["compression"]) == ("allreduce", True, "int4:ef")
    assert all(s["optimizer"].keywords == {"lr": 0.02} for s in seen.values())


def test_without_torch_the_script_says_so_once_before_any_run(monkeypatch, capsys):
    """A fresh ``.[train,test]`` install has no torch: every column's child would fail on
    its own and the table would be a column of errors (or, with ``--link``, two hosts
    built for ranks that never start)."""
    import importlib.util

    import pytest

    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    monkeypatch.syspath_prepend(_ROOT)
    from benchmarks.peers import torch_compare

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else find_spec(name, *a))
    ran = []
    monkeypatch.setattr(torch_compare, "run_all", lambda *a: ran.append(a))
    with pytest.raises(SystemExit) as exit_:
        torch_compare.main(["--columns", "torch-ddp", "--seeds", "0"])
    assert exit_.value.code == 2 and ran == []
    assert "pip install -e '.[torch]'" in capsys.readouterr().err
