"""benchmarks/report.py: the results page's headline tables come from benchmarks/results/
and nowhere else. Generation is deterministic, the page in the repository is what the
results give, and --check fails when either side changes without the other."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import report  # noqa: E402

sys.path.remove(ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "report.py")


@pytest.fixture
def copies(tmp_path):
    """Copies of the results folder, the results page and the front page, to change freely."""
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS, results)
    page = tmp_path / "README.md"
    shutil.copy(report.PAGE, page)
    shutil.copy(report.FRONT, tmp_path / "FRONT.md")
    shutil.copy(report.ARCHIVE, tmp_path / "EARLIER.md")
    return results, page


def _run(page, results, *flags) -> subprocess.CompletedProcess:
    """report.py on the copies only (never the repository's pages)."""
    return subprocess.run([sys.executable, SCRIPT, *flags, "--page", str(page), "--front",
                           str(page.parent / "FRONT.md"), "--archive",
                           str(page.parent / "EARLIER.md"), "--results", str(results)],
                          capture_output=True, text=True, timeout=120, cwd=os.sep)


def _check(page, results) -> subprocess.CompletedProcess:
    return _run(page, results, "--check")


def test_generation_is_deterministic_and_reads_only_the_results_folder(copies):
    results, _page = copies
    once = report.generate()
    assert report.generate() == once
    assert report.generate(str(results)) == once   # the same files elsewhere: the same page
    assert once.startswith(report.BEGIN) and once.endswith(report.END)


def test_the_pages_in_the_repository_are_what_the_results_give():
    proc = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True,
                          timeout=120, cwd=os.sep)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_fails_when_a_number_on_the_page_is_edited_by_hand(copies):
    results, page = copies
    text = page.read_text()
    assert "| 7.5 [7.1–7.6] |" in text   # ddlf-torch-default's s/epoch, from its three runs
    page.write_text(text.replace("| 7.5 [7.1–7.6] |", "| 6.5 [6.1–6.6] |", 1))
    proc = _check(page, results)
    assert proc.returncode == 1
    assert "-| **ddlf-torch-default** | 0.01 | 6.5 [6.1–6.6]" in proc.stdout
    assert "python benchmarks/report.py" in proc.stderr


def test_check_fails_when_a_raw_result_changes_and_the_page_follows_it(copies):
    results, page = copies
    name = results / "torch_compare_final_2026-11-27c.json"
    runs = json.loads(name.read_text())
    for r in runs:
        if r["column"] == "torch-ddp":
            r["train_s"] *= 2          # every DDP run took twice as long
    name.write_text(json.dumps(runs))
    assert _check(page, results).returncode == 1
    # Rewriting the page from the changed results puts the new median in the table.
    proc = _run(page, results)
    assert proc.returncode == 0, proc.stderr
    assert "| torch-ddp (2 × 1 thread, gloo) | 0.03 | 23.3 [23.3–23.5] |" in page.read_text()
    assert _check(page, results).returncode == 0


def test_gzipped_grids_are_read_as_they_are(copies):
    results, page = copies
    name = results / "streaming_k4_100mbit_5ep_2026-11-27.json.gz"
    with gzip.open(name, "rt") as f:
        data = json.load(f)
    for r in data["results"]:
        if r["codec"] == "sync+codec":
            r["rows"] = r["rows"][:2]   # cut short: it never reaches the target
    with gzip.open(name, "wt") as f:
        json.dump(data, f)
    part = report.generate(str(results))
    assert "| sync+codec (blocking, `int4:ef`) | 3 |" in part
    assert "216.0, 3/3" not in part and _check(page, results).returncode == 1


def test_a_transcribed_table_says_so_and_headlines_must_be_newest_first(copies):
    results, _page = copies
    part = report.generate(str(results))
    micro = part[part.index("The runtime against Ray"):]
    assert "**Transcribed, not raw:**" in micro
    assert "**Transcribed, not raw:**" not in part[:part.index("The runtime against Ray")]
    manifest = results / "headlines.json"
    doc = json.loads(manifest.read_text())
    doc["headlines"].reverse()
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="newest first"):
        report.generate(str(results))


def test_splice_replaces_only_the_generated_part_and_needs_the_markers():
    page = f"# Title\nbefore\n{report.BEGIN}\nold\n{report.END}\nafter\n"
    new = report.splice(page, f"{report.BEGIN}\nnew\n{report.END}")
    assert new == f"# Title\nbefore\n{report.BEGIN}\nnew\n{report.END}\nafter\n"
    with pytest.raises(ValueError, match="marker"):
        report.splice("# no markers\n", "x")


def test_the_front_page_summary_is_filled_from_the_tables_and_checked_too(copies):
    results, page = copies
    summary = report.generate_summary(str(results))
    assert "**0.40×** the time" in summary            # DDLF-torch / DDP, from the torch table
    assert "{{" not in summary
    front = page.parent / "FRONT.md"
    front.write_text(front.read_text().replace("**0.40×** the time", "**0.30×** the time", 1))
    proc = _check(page, results)
    assert proc.returncode == 1 and "FRONT.md differs" in proc.stderr
    # A summary line naming a figure no table computes is an error, not a blank.
    manifest = results / "headlines.json"
    doc = json.loads(manifest.read_text())
    doc["summary"].append("{{torch-2core.no-such-ratio}}")
    manifest.write_text(json.dumps(doc))
    with pytest.raises(KeyError, match="no-such-ratio"):
        report.generate_summary(str(results))


def test_anchors_are_github_s():
    assert report.anchor("Slow links: 4 nodes of half a CPU at 100 Mbit/s (2026-11-27)") == \
        "slow-links-4-nodes-of-half-a-cpu-at-100-mbits-2026-11-27"


def test_a_scaling_columns_headline_is_built_from_its_raw_runs(tmp_path):
    """Kind ``scaling_columns`` (``cluster_emu.py scaling``, issue 30): the table
    ``--from`` prints, with the run's meta lines, and its efficiencies as facts the
    front page's summary can name."""
    from test_unit_scaling import _run

    runs = [_run("single", 1, s, 40.0 + s, 80.0) for s in (1, 2, 3)]
    runs += [_run("defaults", 4, s, 25.0 + s, 40.0, ran="allreduce") for s in (1, 2, 3)]
    runs += [_run("dataparallel", 4, s, 50.0 + s, 30.0) for s in (1, 2, 3)]
    results = tmp_path / "results"
    results.mkdir()
    with gzip.open(results / "scaling_columns_test.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in runs))
    (results / "headlines.json").write_text(json.dumps({"format": 1, "summary": [
        "K = 4 defaults: {{sc.K4.1gbit.defaults.ttt_eff}} of T1, "
        "{{sc.K4.1gbit.defaults.vs_dataparallel}} data-parallel's time, ran "
        "{{sc.K4.1gbit.defaults.ran}}"], "headlines": [{
            "id": "sc", "kind": "scaling_columns", "title": "Scaling against one node",
            "date": "2026-12-01", "machine": "a test", "about": "made-up runs",
            "commands": ["sudo python benchmarks/emulation/cluster_emu.py scaling"],
            "raw": ["scaling_columns_test.jsonl.gz"], "target": 0.875}]}))
    part = report.generate(str(results))
    row = next(line for line in part.splitlines() if "| 4 |" in line and "defaults" in line)
    # T1 = 42, T4 = 27: 42 / (4 · 27) = 39 %; 27 / 52 of data-parallel's time.
    assert "| 27.0 [26.0–28.0] |" in row and f"| {42 / (4 * 27):.0%} |" in row
    assert f"| {27 / 52:.2f}× |" in row and "| allreduce |" in row
    assert "(results/scaling_columns_test.jsonl.gz)" in part and "### Scaling against one node" in part
    summary = report.generate_summary(str(results))
    assert f"K = 4 defaults: {42 / (4 * 27):.0%} of T1, {27 / 52:.2f}× data-parallel's time, " \
        "ran allreduce" in summary


def test_a_superseded_headline_moves_to_the_earlier_results_with_working_links(copies):
    results, page = copies
    manifest = json.loads((results / "headlines.json").read_text())
    heads = manifest["headlines"]
    old, new = heads[-1], heads[0]
    title = f"### {old['title']} ({old['date']})"
    assert title in report.generate(str(results))
    assert title not in report.generate_archive(str(results))
    old["superseded_by"] = new["id"]
    (results / "headlines.json").write_text(json.dumps(manifest))
    current, earlier = report.generate(str(results)), report.generate_archive(str(results))
    assert title not in current and title in earlier
    assert f"Superseded by [{new['title']} ({new['date']})]" in earlier
    # Every relative link on the earlier page resolves from docs/benchmarks/.
    for target in re.findall(r"\]\((?!https?:|#)([^)\s#]+)", earlier):
        assert os.path.exists(os.path.join(ROOT, "docs", "benchmarks", target)), target
    # --check sees the page that did not follow.
    assert _run(page, results, "--check").returncode == 1
    assert _run(page, results).returncode == 0 and _run(page, results, "--check").returncode == 0
    assert title in (page.parent / "EARLIER.md").read_text()


def test_superseded_by_must_name_a_listed_run(copies):
    results, _page = copies
    manifest = json.loads((results / "headlines.json").read_text())
    manifest["headlines"][-1]["superseded_by"] = "no-such-run"
    (results / "headlines.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="superseded_by 'no-such-run'"):
        report.generate(str(results))


def test_a_loss_headline_reaches_its_target_going_down(tmp_path):
    # lm_compare.py's runs: the torch_compare kind with "metric": "loss".
    def run(column, seed, losses, train_s):
        rows = [{"epoch": (i + 1) / len(losses), "train_s": train_s * (i + 1) / len(losses),
                 "test_loss": x, "test_accuracy": 0.3} for i, x in enumerate(losses)]
        return {"column": column, "seed": seed, "lr": 1e-3, "split": "test", "loadavg": 1.0,
                "timeline": rows, "train_s": train_s, "tokens_per_epoch": 1000,
                "startup_s": 2.0}

    runs = [run("torch-1p", s, [3.0, 2.5, 2.2], 100.0) for s in range(3)]
    runs += [run("ddlf-default", s, [2.9, 2.6, 2.4], 60.0) for s in range(3)]
    (tmp_path / "lm.json").write_text(json.dumps(runs))
    h = {"id": "lm", "kind": "torch_compare", "metric": "loss", "title": "t",
         "date": "2026-11-29", "machine": "m", "about": "a", "commands": ["x"],
         "raw": ["lm.json"], "target": 2.5, "baseline": "torch-1p",
         "columns": {"torch-1p": "torch-1p", "ddlf-default": "ddlf-default"},
         "ratios": [{"id": "vs-1p", "a": "ddlf-default", "b": "torch-1p",
                     "figure": "s_per_epoch", "text": "s/epoch"}]}
    facts: dict = {}
    table = "\n".join(report.KINDS["torch_compare"](h, str(tmp_path), facts))
    assert "| tokens/s | epochs to 2.5 | time to 2.5 (s) | test loss after the budget |" in table
    assert "| torch-1p | 0.001 | 100.0 | 10 | 0.67 | 66.7 | 2.2000 | 2.0 |" in table
    # ddlf-default is above 2.5 until its last row (2.4): 1.00 epochs, 60 s.
    assert "| ddlf-default | 0.001 | 60.0 | 17 | 1.00 | 60.0 | 2.4000 | 2.0 |" in table
    assert facts["lm.ddlf-default.final_loss"] == "2.4000" and facts["lm.vs-1p"] == "0.60×"
