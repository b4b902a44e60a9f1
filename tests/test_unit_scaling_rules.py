"""benchmarks/training/scaling_rules.py: what its table groups, and its --stage."""

from __future__ import annotations

import json

import pytest

from benchmarks.training import scaling_rules


def _run(config, seed, hit, stage=None, single=False):
    rows = [[0.25, 0.80, 1.0], [hit, 0.88, 2.0]]
    run = {"k": 1 if single else 4, "config": config, "seed": seed, "rows": rows}
    if stage:
        run["stage"] = stage
    if single:
        run["single"] = True
    return run


def test_runs_on_the_final_split_are_tabled_apart_from_validation(tmp_path):
    path = tmp_path / "runs.jsonl"
    runs = [_run("in=adam:2e-3", 0, 0.5), _run("in=adam:2e-3", 1, 0.5, stage="select"),
            _run("in=adam:2e-3", 0, 0.75, stage="final"),
            _run("opt=adam:1e-3", 0, 0.4, single=True)]
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    lines = scaling_rules.table([str(path)], 0.875).splitlines()
    # Files written before --stage existed ran on validation: they join the "select" rows.
    assert "| 4 | DDLF, in=adam:2e-3 | 2 | 0.50 [0.50-0.50] |" in lines
    assert "| 4 | DDLF, in=adam:2e-3 (final split) | 1 | 0.75 [0.75-0.75] |" in lines
    assert "| 1 | one process, opt=adam:1e-3 | 1 | 0.40 [0.40-0.40] |" in lines


def test_the_stage_is_checked_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        scaling_rules.main(["ddlf", "4", "in=adam:2e-3", "--stage", "test"])
    assert "invalid choice: 'test'" in capsys.readouterr().err
