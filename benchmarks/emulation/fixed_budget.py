"""Accuracy after a fixed budget of epochs: DDLF's defaults on K trainers against the tuned
single process (issue 30: 5 epochs at K = 4, within 0.3 points).

    python benchmarks/emulation/fixed_budget.py --k 4 --epochs 5 --seeds 0,1,2 \\
        --choices benchmarks/results/scaling_choices_dp_k4_2026-11-29.json --json out.json
    python benchmarks/emulation/fixed_budget.py --from out.json      # the table again

The same runs as ``cluster_emu.py scaling``'s ``single`` and ``defaults`` columns (the
same model, choices file, split, seeds and code: ``single_column.run`` and
``train(model_fn, data, workers=K)`` with nothing else), on this machine's own cores
instead of capped nodes behind emulated links. Accuracy after a number of epochs does not
depend on how fast they run, and five epochs on four 0.5-CPU nodes, with the single
process's five at the same cap beside them, take over two hours of this 2-core machine;
here they take about half an hour. What the links decide is auto's codec: on loopback it
sees fast links, where on the emulated 1 Gbit/s ones it chose fp16 or int8:ef. Each run
prints what auto chose. The single processes run together, one TensorFlow thread each,
then the DDLF runs one at a time (an embedded cluster of K one-thread trainers each).

Printed: test accuracy after each epoch for both columns, seed by seed, and the median
difference in points after the last.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

__all__ = ["main", "table", "summary"]

HERE = os.path.dirname(os.path.abspath(__file__))


def _jobs(seed: int, a, choice: dict) -> tuple[dict, dict]:
    """The seed's ``single`` and ``defaults`` jobs, as the scaling harness writes them."""
    from benchmarks.emulation.scaling_plan import _job
    from benchmarks.emulation.tuned_model import MODEL_DEFAULT

    g = {"model": a.model, "epochs": a.epochs, "evals_per_epoch": 1, "limit": a.limit,
         "eval_limit": a.eval_limit, "max_rounds": 0, "target": None, "stop_at": (),
         "codec": None, "fragments": 1}
    single = _job("single", 1, None, None, seed, "final", choice, g)
    ddlf = {**_job("defaults", a.k, None, None, seed, "final", MODEL_DEFAULT, g),
            "run_id": f"fixed-budget-K{a.k}-{seed}"}
    return single, ddlf


def _result(text: str, prefix: str, returncode: int | None) -> dict:
    """The last ``prefix`` line's record, or an error naming the exit code."""
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    if not lines:
        return {"status": "error", "reason": f"exit {returncode}, no result line"}
    return json.loads(lines[-1][len(prefix):])


def _timed_out(a) -> dict:
    return {"status": "error", "reason": f"no result within --timeout {a.timeout} s"}


def _singles(jobs: list[dict], a) -> list[dict]:
    """The single process of every seed, all at once (each its own process)."""
    from benchmarks.emulation.single_column import PREFIX

    procs = [(job, subprocess.Popen([sys.executable, os.path.join(HERE, "single_column.py"),
                                     "--job", json.dumps(job)],
                                    stdout=subprocess.PIPE, text=True)) for job in jobs]
    out = []
    for job, p in procs:
        try:
            text, _ = p.communicate(timeout=a.timeout)
            res = _result(text, PREFIX, p.returncode)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            res = _timed_out(a)
        out.append({**job, **res})
    return out


def _ddlf(job: dict, a) -> dict:
    """DDLF's defaults on an embedded cluster of K trainers, in a fresh process
    (``--ddlf-job``: ``scaling.run_ddlf``, the scaling harness's own run)."""
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--ddlf-job",
                            json.dumps(job)], stdout=subprocess.PIPE, text=True,
                           timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {**job, **_timed_out(a)}
    return {**job, **_result(p.stdout, "RESULT ", p.returncode)}


def _run_ddlf_job(job: dict) -> None:
    import ddlf_actors as ddlf
    from benchmarks.emulation.scaling import run_ddlf

    ddlf.init(num_cpus=job["k"])
    try:
        out = run_ddlf(job, ask=lambda line: None)
    finally:
        ddlf.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def _by_epoch(run: dict, epochs: int) -> list:
    """The run's accuracy at the evaluation nearest each whole epoch (None if missing)."""
    out = []
    for e in range(1, epochs + 1):
        near = [p for p in run.get("evals", []) if abs(p["epoch"] - e) < 0.02]
        out.append(near[-1]["accuracy"] if near else None)
    return out


def summary(runs: list[dict], epochs: int) -> dict | None:
    """After the last epoch, over the seeds both columns finished: ``{"seeds", "single",
    "defaults"}`` (medians) and ``"diffs"`` (defaults − single, in points, by seed) with
    their ``"median"``; None when no seed has both."""
    last: dict = {}
    for r in runs:
        if r.get("status") == "ok":
            acc = _by_epoch(r, epochs)[-1]
            if acc is not None:
                last.setdefault(r["column"], {})[r["seed"]] = acc
    single, ddlf = last.get("single", {}), last.get("defaults", {})
    both = sorted(set(single) & set(ddlf))
    if not both:
        return None
    diffs = [100 * (ddlf[s] - single[s]) for s in both]
    return {"seeds": both, "single": statistics.median(single[s] for s in both),
            "defaults": statistics.median(ddlf[s] for s in both), "diffs": diffs,
            "median": statistics.median(diffs)}


def table(runs: list[dict], epochs: int) -> str:
    """The accuracy after each epoch by seed, and the difference after the last."""
    ok = [r for r in runs if r.get("status") == "ok"]
    lines = [f"| column | seed | {' | '.join(f'epoch {e}' for e in range(1, epochs + 1))} |",
             "|---|---|" + "---:|" * epochs]
    for r in sorted(ok, key=lambda r: (r["column"] != "single", r["seed"])):
        cells = " | ".join("–" if x is None else f"{x:.4f}" for x in _by_epoch(r, epochs))
        lines.append(f"| {r['column']} | {r['seed']} | {cells} |")
    for r in runs:
        if r.get("status") != "ok":
            lines.append(f"\n{r['column']} seed {r['seed']}: {r.get('reason')}")
    s = summary(runs, epochs)
    if s is not None:
        lines.append("")
        lines.append(f"After {epochs} epochs (test accuracy, medians): the single process "
                     f"{s['single']:.4f}, DDLF's defaults {s['defaults']:.4f}; defaults − "
                     f"single by seed: {', '.join(f'{d:+.2f}' for d in s['diffs'])} points, "
                     f"median {s['median']:+.2f}.")
    for r in ok:
        if r["column"] == "defaults":
            lines.append(f"- defaults, seed {r['seed']}: {r.get('settings')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=4, help="DDLF's trainers (4)")
    p.add_argument("--epochs", type=int, default=5, help="the budget in epochs (5)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--model", default="wide_cnn")
    p.add_argument("--choices", help="the scaling choices file (its single column's choice)")
    p.add_argument("--limit", type=int, default=None, help="smoke runs: the first N images")
    p.add_argument("--eval-limit", type=int, default=None)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    p.add_argument("--json", help="also write the runs here")
    p.add_argument("--from", dest="from_file", help="print the table of a --json file")
    p.add_argument("--ddlf-job", help=argparse.SUPPRESS)   # one DDLF run, in its process
    a = p.parse_args(argv)
    if a.ddlf_job:
        _run_ddlf_job(json.loads(a.ddlf_job))
        return 0
    if a.from_file:
        with open(a.from_file) as f:
            saved = json.load(f)
        print(table(saved["runs"], saved["epochs"]))
        return 0
    if not a.choices:
        p.error("--choices is needed (the single column's chosen optimizer)")
    with open(a.choices) as f:
        choice = json.load(f)["columns"]["single"]["chosen"]
    jobs = [_jobs(int(s), a, choice) for s in a.seeds.split(",")]
    t0 = time.perf_counter()
    runs = _singles([single for single, _ in jobs], a)
    print(f"single: {len(runs)} runs in {time.perf_counter() - t0:.0f} s", flush=True)
    for _, job in jobs:
        seed = job["seed"]
        runs.append(_ddlf(job, a))
        print(f"defaults seed {seed}: {runs[-1].get('status')} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"k": a.k, "epochs": a.epochs, "model": a.model, "choice": choice,
                       "runs": runs}, f, indent=1)
    print(table(runs, a.epochs))
    return 0 if all(r.get("status") == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
