"""The tables: selection (per candidate, on validation) and the headline (per column,
median and range over seeds, on test), and the ratios between columns."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from .columns import COLUMNS
from .curves import evals_per_epoch, first_crossing
from .ratios import HEADLINE_PAIRS, KINDS, RatioPair, per_seed_ratios
from .stats import Summary, fmt_summary, summarize

__all__ = ["metrics", "selection_table", "headline_rows", "headline_table", "ratio_lines"]


def metrics(r: dict, target: float) -> dict:
    """The three numbers of one column-run, apart: seconds per epoch (training time per
    epoch, evaluation excluded), epochs to the target and training seconds to it (None if
    never reached), plus the accuracy after the last epoch and evaluations per epoch."""
    hit = first_crossing(r["evals"], target)
    epochs = r.get("epochs_done") or 0
    return {"s_per_epoch": r["train_s"] / epochs if epochs else None,
            "epochs_to_target": None if hit is None else hit.epoch,
            "time_to_target": None if hit is None else hit.train_s,
            "final_accuracy": r["evals"][-1]["accuracy"] if r["evals"] else None,
            "evals_per_epoch": evals_per_epoch(r["evals"])}


def _acc(s: dict | None) -> str:
    return "-" if not s or s["median"] is None else f"{s['median']:.4f}"


def _js(s: dict | None, spec=".1f") -> str:
    if not s:
        return "-"
    summary = Summary(math.inf if s["median"] is None else s["median"],
                      math.inf if s["min"] is None else s["min"],
                      math.inf if s["max"] is None else s["max"], s["n"], s["missing"])
    return fmt_summary(summary, spec)


def selection_table(column: str, rows: Sequence[dict], target: float, epochs: int) -> str:
    """One column's selection table (validation figures, median over selection seeds)."""
    head = (f"{'candidate':<34} {'val acc e' + str(epochs):>10} {'epochs to ' + str(target):>14} "
            f"{'train s to ' + str(target):>15}  status")
    lines = [f"{column}: selection on validation (first 50,000 train / last 10,000 validation)",
             head, "-" * len(head)]
    for row in rows:
        status = "CHOSEN" if row.get("chosen") else ""
        if row["problems"]:
            status = "never chosen: " + "; ".join(row["problems"])
        lines.append(f"{(row.get('label') or str(row['candidate'])):<34} "
                     f"{_acc(row['final_accuracy']):>10} {_js(row['epochs_to_target'], '.2f'):>14} "
                     f"{_js(row['time_to_target']):>15}  {status}")
    return "\n".join(lines)


def headline_rows(results: Sequence[dict], target: float) -> dict[str, dict]:
    """Per column: the runs' metrics by seed and their summaries."""
    out: dict[str, dict] = {}
    for r in results:
        col = out.setdefault(r["column"], {"runs": {}, "errors": [], "loads": [],
                                           "settings": r.get("settings", "")})
        if r.get("load_1min") is not None:
            col["loads"].append(r["load_1min"])
        if r.get("status") != "ok":
            col["errors"].append(f"seed {r.get('seed')}: {r.get('status')}: {r.get('reason', '')}")
            continue
        col["settings"] = r.get("settings", col["settings"])
        col["runs"][r["seed"]] = metrics(r, target)
    for col in out.values():
        runs = list(col["runs"].values())
        for key in ("s_per_epoch", "epochs_to_target", "time_to_target", "final_accuracy",
                    "evals_per_epoch"):
            col[key] = summarize([m[key] for m in runs]) if runs else None
    return out


def headline_table(rows: Mapping[str, dict], target: float, epochs: int, eval_name: str) -> str:
    head = (f"{'column':<17} {'s/epoch':>18} {'epochs to ' + str(target):>19} "
            f"{'train s to ' + str(target):>21} {eval_name + ' acc e' + str(epochs):>24} "
            f"{'evals/ep':>8} {'load 1m':>9}  settings")
    lines = [head, "-" * len(head)]
    for name, col in rows.items():
        loads = col["loads"]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        gran = COLUMNS[name].granularity if name in COLUMNS else ""
        evals = fmt_summary(col["evals_per_epoch"], ".1f")
        if gran == "epochs":
            evals += "*"
        lines.append(f"{name:<17} {fmt_summary(col['s_per_epoch'], '.1f', 18)} "
                     f"{fmt_summary(col['epochs_to_target'], '.2f', 19)} "
                     f"{fmt_summary(col['time_to_target'], '.1f', 21)} "
                     f"{fmt_summary(col['final_accuracy'], '.4f', 24)} {evals:>8} {load:>9}  "
                     f"{col['settings']}")
        for e in col["errors"]:
            lines.append(f"{'':<17} {e}")
    lines.append("median [min-max] over seeds. s/epoch: training time per epoch, evaluation "
                 "and start-up excluded (the framework). epochs to: the first evaluation at or "
                 f"above {target} (the algorithm). train s to: training time to it (both).")
    lines.append("* a global model exists only once per epoch in this column (one average "
                 "per epoch), so it is evaluated once per epoch; the others between steps or "
                 "rounds.")
    return "\n".join(lines)


def _ratio(rows: Mapping[str, dict], p: RatioPair, key: str) -> str | None:
    a, b = rows.get(p.a), rows.get(p.b)
    if not a or not b or a[key] is None or b[key] is None:
        return None
    ma, mb = a[key].median, b[key].median
    if math.isinf(ma) or math.isinf(mb) or mb == 0:
        return f"not computed ({p.a} {fmt_summary(a[key])}, {p.b} {fmt_summary(b[key])})"
    seeds = per_seed_ratios({s: m[key] for s, m in a["runs"].items()},
                            {s: m[key] for s, m in b["runs"].items()})
    spread = f", per seed {min(seeds):.2f}-{max(seeds):.2f}" if len(seeds) > 1 else ""
    return f"{ma / mb:.2f}x ({ma:.2f} / {mb:.2f}{spread})"


def ratio_lines(rows: Mapping[str, dict], target: float,
                pairs: Sequence[RatioPair] = HEADLINE_PAIRS) -> str:
    """Every headline ratio whose two columns ran, labelled with its kind."""
    what = {"framework": (("s_per_epoch", "s/epoch"),),
            "algorithm": (("epochs_to_target", f"epochs to {target}"),
                          ("time_to_target", f"train s to {target}")),
            "end-to-end": (("time_to_target", f"train s to {target}"),)}
    lines = []
    for p in pairs:
        for key, name in what[p.kind]:
            text = _ratio(rows, p, key)
            if text is None:
                continue
            extra = ""
            if p.kind == "end-to-end" and rows[p.b][key] is not None:
                extra = f"; {p.b} range {fmt_summary(rows[p.b][key])} s"
            lines.append(f"[{p.kind}] {p.a} / {p.b}, {name}: {text}{extra}")
    if lines:
        lines.append("kinds: " + "; ".join(f"{k}: {v}" for k, v in KINDS.items()))
    return "\n".join(lines)
