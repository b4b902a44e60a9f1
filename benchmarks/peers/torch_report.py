"""``torch_compare.py``'s figures (seconds per epoch, epochs and time to the target, the
link's bytes) and tables, and the choice of a learning rate per column."""

from __future__ import annotations

import math
import statistics

from benchmarks.emulation.link_hosts import link_figures


def figures(r: dict, target: float) -> dict:
    rows = r.get("timeline") or []
    if not rows:
        return {}
    epochs = rows[-1]["epoch"]
    hit = next((row for row in rows if row["test_accuracy"] >= target), None)
    return {"s_per_epoch": r["train_s"] / epochs if epochs else None,
            "epochs_to_target": hit["epoch"] if hit else None,
            "time_to_target": hit["train_s"] if hit else None,
            "final_acc": rows[-1]["test_accuracy"], "epochs": epochs,
            "replicas_differ": sum(1 for row in rows if row.get("replicas_equal") is False),
            "startup_s": r.get("startup_s"), "link_mb": link_mb(r.get("link_total")),
            **link_figures(r.get("link"), r.get("link_rate"))}


def link_mb(totals: list | None) -> float | None:
    """MB host A's link carried over a whole run, both directions, start-up included (two
    hosts: B's link carries the same bytes); None for a run not across the hosts."""
    return (totals[0]["tx"] + totals[0]["rx"]) / 1e6 if totals else None


def _med(values: list, fmt: str, missing_text: str = "not reached") -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return missing_text if values else "-"
    med = statistics.median(vals)
    missing = f" ({len(values) - len(vals)} not)" if len(vals) < len(values) else ""
    if len(vals) == 1:
        return format(med, fmt) + missing
    return f"{format(med, fmt)} [{format(min(vals), fmt)}-{format(max(vals), fmt)}]{missing}"


def report_table(results: list, target: float, title: str) -> str:
    """The medians [min-max] per (column, lr); with ``--link``, also host A's link: the MB
    it carried over the whole run, and over the timed training the MB per local step and
    per exchange (all-reduce, sync or round), both directions, and the seconds per step
    its busier direction needs at the rate (a lower bound)."""
    linked = any(r.get("link_rate") for r in results)
    lines = [title, "",
             f"| column | lr | s/epoch | epochs to {target} | time to {target} (s) | "
             "acc after last epoch | epochs | start-up (s) | "
             + ("link | link MB (run) | MB/step | MB/exchange | wire s/step | "
                if linked else "")
             + "load avg per run |",
             "|---|---|---|---|---|---|---|---|" + ("---|" * 5 if linked else "") + "---|"]
    by_col: dict = {}
    for r in results:
        by_col.setdefault((r["column"], r.get("lr")), []).append(r)
    for (column, lr), runs in by_col.items():
        loads = " ".join(f"{r['loadavg']:.1f}" for r in runs)
        bad = [r for r in runs if "timeline" not in r]
        if bad and len(bad) == len(runs):
            why = bad[0].get("unavailable") or bad[0].get("error")
            lines.append(f"| {column} | {lr if lr is not None else '-'} | {why} | | | | | | "
                         + ("| | | | | " if linked else "") + f"{loads} |")
            continue
        figs = [figures(r, target) for r in runs if "timeline" in r]
        lines.append(
            f"| {column} | {lr} | {_med([f['s_per_epoch'] for f in figs], '.1f')} | "
            f"{_med([f['epochs_to_target'] for f in figs], '.2f')} | "
            f"{_med([f['time_to_target'] for f in figs], '.1f')} | "
            f"{_med([f['final_acc'] for f in figs], '.4f')} | "
            f"{_med([f['epochs'] for f in figs], '.2f')} | "
            f"{_med([f['startup_s'] for f in figs], '.1f')} | "
            + (f"{runs[0].get('link_rate') or '-'} | "
               f"{_med([f['link_mb'] for f in figs], '.1f', '-')} | "
               f"{_med([f.get('mb_per_step') for f in figs], '.3f', '-')} | "
               f"{_med([f.get('mb_per_exchange') for f in figs], '.2f', '-')} | "
               f"{_med([f.get('wire_s_per_step') for f in figs], '.3f', '-')} | "
               if linked else "")
            + f"{loads} |"
            + (f" ({len(bad)} failed: {bad[0].get('error')})" if bad else "")
            + (f" (replicas differed at {sum(f['replicas_differ'] for f in figs)} "
               "evaluations)" if any(f["replicas_differ"] for f in figs) else ""))
    return "\n".join(lines)


def choose(results: list, target: float) -> dict:
    """Per column, the rate that reached ``target`` on validation in the fewest epochs
    (ties and no crossing: the best accuracy after the last epoch)."""
    best: dict = {}
    for r in results:
        if "timeline" not in r:
            continue
        f = figures(r, target)
        key = (f["epochs_to_target"] if f["epochs_to_target"] is not None else math.inf,
               -f["final_acc"])
        if r["column"] not in best or key < best[r["column"]][0]:
            best[r["column"]] = (key, r["lr"])
    return {c: {"lr": lr} for c, (_, lr) in best.items()}
