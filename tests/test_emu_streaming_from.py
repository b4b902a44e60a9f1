"""``cluster_emu.py streaming|scaling --from FILE`` prints the table of runs already made,
from a ``--json`` file or from the ``.partial.jsonl`` a grid writes as each run ends (a
grid of hours cut short keeps what it measured). No namespaces needed: nothing runs."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMU = os.path.join(ROOT, "benchmarks", "emulation", "cluster_emu.py")


def _run(setting: str, k: int, seed: int, accs: list, step_s: float) -> dict:
    """One run's record as the driver prints it: a row per evaluation."""
    rows = [{"round": i + 1, "epoch": (i + 1) / 4, "time_s": step_s * (i + 1), "wall_s": step_s,
             "compute_s": step_s / 2, "compute_total_s": k * step_s / 2, "eval_s": 0.0,
             "overhead_s": 0.0, "bytes_sent": 1_000_000, "bytes_received": 1_000_000,
             "ring_bytes": None, "test_accuracy": a, "workers": k}
            for i, a in enumerate(accs)]
    return {"rate": "100mbit", "codec": setting, "k": k, "seed": seed, "scheme": "sync",
            "options": {}, "rows": rows, "total_s": rows[-1]["time_s"], "load": [1.0, 1.5]}


def _table(args: list) -> str:
    out = subprocess.run([sys.executable, EMU, *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_streaming_table_from_a_partial_file(tmp_path):
    runs = [_run("sync", 4, s, [0.80, 0.86, 0.88, 0.89], 10.0) for s in (0, 1)]
    runs += [_run("overlap+frag+codec", 4, s, [0.81, 0.88, 0.89, 0.895], 4.0) for s in (0, 1)]
    path = tmp_path / "streaming.json.partial.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    out = _table(["streaming", "--from", str(path)])
    assert "4 run(s)" in out
    sync = next(line for line in out.splitlines() if "| sync |" in line)
    fast = next(line for line in out.splitlines() if "| overlap+frag+codec |" in line)
    # sync reaches 0.875 at its third row (30 s); the other at its second (8 s): 8/30.
    assert "| 30.0 |" in sync and "| 2/2 |" in sync
    assert "| 8.0 |" in fast and f"{8 / 30:.2f}x" in fast
    # accuracy after the run: 0.895 against 0.89, +0.50 points; utilization half.
    assert "+0.50" in fast and "| 50% |" in fast


def test_scaling_table_from_a_json_file(tmp_path):
    runs = [_run("overlap+frag+codec", 1, 0, [0.80, 0.88], 20.0),
            _run("overlap+frag+codec", 4, 0, [0.80, 0.88], 8.0)]
    path = tmp_path / "scaling.json"
    path.write_text(json.dumps({"plan": {}, "results": runs}))
    out = _table(["scaling", "--from", str(path)])
    k4 = next(line for line in out.splitlines() if "| 4 |" in line and "overlap" in line)
    # T1 = 40 s, T4 = 16 s: 40 / (4 * 16) = 62 %.
    assert f"{40 / (4 * 16):.0%}" in k4


def test_an_explicit_value_equal_to_another_modes_default_is_kept():
    """``--epochs 5`` is the accuracy mode's default; streaming's is 3. Given on the
    command line it must stay 5 (it once became 3 silently)."""
    assert "5 epochs" in _table(["streaming", "--epochs", "5", "--estimate"])
    assert "3 epochs" in _table(["streaming", "--estimate"])


def test_the_target_given_is_the_target_used(tmp_path):
    """``--target 0.85`` (the accuracy mode's default) is kept for streaming too."""
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(_run("sync", 4, 0, [0.80, 0.86, 0.88], 10.0)) + "\n")
    out = _table(["streaming", "--from", str(path), "--target", "0.85"])
    assert "time to 0.85 s" in out and "| 20.0 |" in out


def test_gzipped_results_read_as_they_are_kept(tmp_path):
    """benchmarks/results/ keeps the grids gzipped; --from reads them as they are."""
    import gzip

    runs = [_run("sync", 4, 0, [0.80, 0.86, 0.88], 10.0)]
    path = tmp_path / "streaming.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"plan": {}, "results": runs}, f)
    out = _table(["streaming", "--from", str(path)])
    assert "1 run(s)" in out and "| 30.0 |" in out
