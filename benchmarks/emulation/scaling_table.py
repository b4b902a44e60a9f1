"""The scaling table (issue 30 section 5) from the runs of ``cluster_emu.py scaling``:
what ``--from`` prints and what ``benchmarks/report.py`` (kind ``scaling_columns``)
writes into the results page.

Per CPU cap, K, link and column, medians over the seeds with their range:

- **time to the target**: training seconds to the first evaluation at or above it
  (start-up and every evaluation taken out: ``protocol.metrics``);
- **epochs to the target** and **s/epoch** (training seconds per epoch), apart;
- **throughput efficiency** ``S1 / (K · SK)``: the column's own s/epoch at K = 1 (same
  cap, same link) over K times its s/epoch at K (the single process's for ``single``);
- **time-to-target efficiency** ``T1 / (K · TK)``, T1 the ``single`` column's time at
  K = 1 and the same cap: the tuned single process, never an untuned default;
- **vs dataparallel**: the column's time to the target over data-parallel's at the same
  K and link;
- **accuracy after the fixed epochs** (runs stopped early, by ``--stop-at-target`` or
  ``--max-rounds``, have none) and its difference to the single process in points;
- the evaluations per epoch the runs made, their start-up, and the CPU the head and the
  driver took over each run (CPU seconds over wall seconds, from /proc) beside what the
  nodes took.

Efficiencies are ratios of the medians as printed (a reader can check them by
dividing).
"""

from __future__ import annotations

import math
import statistics

from benchmarks.protocol import metrics, summarize

__all__ = ["figures", "rows", "markdown", "COLUMN_ORDER"]

COLUMN_ORDER = ("single", "dataparallel", "defaults")
RATE_NAME = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", None: "–"}


def figures(r: dict, target: float) -> dict:
    """One run's figures: ``protocol.metrics`` (s/epoch, epochs and time to the target,
    the last accuracy, evaluations per epoch), the accuracy after the fixed epochs (None
    for a run stopped before them), and the CPU shares of the run's processes."""
    m = metrics(r, target)
    whole = (r.get("epochs_done") or 0) >= r.get("epochs", 0) - 1e-6
    m["fixed_accuracy"] = m["final_accuracy"] if whole else None
    cpu = r.get("cpu") or {}
    wall = cpu.get("wall_s") or 0.0
    took = [cpu.get("head_cpu_s"), cpu.get("driver_cpu_s")]
    m["head_driver_cpu"] = sum(took) / wall if wall and None not in took else None
    nodes = [c for c in cpu.get("nodes_cpu_s") or () if c is not None]
    m["nodes_cpu"] = sum(nodes) / wall if wall and nodes else None
    m["startup_s"] = r.get("startup_s")
    return m


def _order(key: tuple) -> tuple:
    cap, k, rate, col = key
    rank = COLUMN_ORDER.index(col) if col in COLUMN_ORDER else len(COLUMN_ORDER)
    return (-cap, k, rate or "", rank, col)


def _median(values) -> float | None:
    s = summarize(list(values))
    return None if s is None or s.missing * 2 >= s.n else s.median


def _ratio(a: float | None, b: float | None, k: int = 1) -> float | None:
    return a / (k * b) if a is not None and b else None


def rows(results: list, target: float) -> list[dict]:
    """One dict per (cap, K, link, column), in table order, with the medians, the
    summaries and the efficiencies; failed runs are listed in ``errors``."""
    groups: dict = {}
    for r in results:
        key = (r["cpus"], r["k"], r.get("rate"), r["column"])
        groups.setdefault(key, []).append(r)
    out: dict = {}
    for key, runs in groups.items():
        ok = [r for r in runs if r.get("status") == "ok"]
        fig = [figures(r, target) for r in ok]
        row = {"cpus": key[0], "k": key[1], "rate": key[2], "column": key[3],
               "seeds": len(ok), "runs": ok,
               "errors": [f"seed {r['seed']}: {r.get('status')}: {r.get('reason', '')}"
                          for r in runs if r.get("status") != "ok"],
               "ran": ", ".join(dict.fromkeys(_ran(r) for r in ok)) or "-",
               "settings": list(dict.fromkeys(r.get("settings", "") for r in ok)),
               "evals_wanted": runs[0].get("evals_per_epoch"),
               "epochs": runs[0].get("epochs")}
        for name in ("time_to_target", "epochs_to_target", "s_per_epoch", "fixed_accuracy",
                     "evals_per_epoch", "startup_s", "head_driver_cpu", "nodes_cpu"):
            values = [f[name] for f in fig]
            if name not in ("time_to_target", "epochs_to_target"):
                values = [v for v in values if v is not None]   # None: not measured
            row[name] = summarize(values) if values else None
            row[name + "_median"] = _median(values) if values else None
        row["stopped_early"] = sum(f["fixed_accuracy"] is None for f in fig)
        row["rounds"] = _rounds(ok)
        row["head_driver_cpu_max"] = max((f["head_driver_cpu"] for f in fig
                                          if f["head_driver_cpu"] is not None), default=None)
        out[key] = row
    for (cap, k, rate, col), row in out.items():
        one = out.get((cap, 1, None, "single"))
        t1 = one["time_to_target_median"] if one else None
        base = one if col == "single" else out.get((cap, 1, rate, col))
        row["t1"] = t1
        row["throughput_eff"] = _ratio(base and base["s_per_epoch_median"],
                                       row["s_per_epoch_median"], k)
        row["ttt_eff"] = _ratio(t1, row["time_to_target_median"], k)
        dp = out.get((cap, k, rate, "dataparallel"))
        row["vs_dataparallel"] = None if col == "dataparallel" or not dp else _ratio(
            row["time_to_target_median"], dp["time_to_target_median"])
        acc, acc1 = row["fixed_accuracy_median"], one and one["fixed_accuracy_median"]
        row["vs_single_points"] = None if col == "single" or acc is None or acc1 is None \
            else 100 * (acc - acc1)
    return [out[key] for key in sorted(out, key=_order)]


def _rounds(runs: list) -> tuple[float | None, float | None]:
    """(rounds per epoch the runs made, as predicted before them): a DDLF run is
    evaluated between rounds, so it cannot be evaluated more often than that."""
    made = [max(x["round"] for x in r["rows"]) / r["epochs_done"] for r in runs
            if r.get("rows") and r.get("epochs_done")]
    predicted = [r["rounds_predicted"] for r in runs if r.get("rounds_predicted")]
    return (_median(made) if made else None, _median(predicted) if predicted else None)


def _ran(r: dict) -> str:
    """The scheme a run ran, with its codec: ``sync``, ``allreduce int8:ef``."""
    ran = r.get("scheme_ran") or "-"
    codec = r.get("compression")
    return f"{ran} {codec}" if codec and codec != "none" else ran


def _fmt(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _span(s, spec: str) -> str:
    """``median [min–max]`` (one figure when the seeds agree as printed); ``never (n/m)``
    when fewer than half the seeds reached it, ``never`` as the top of a range."""
    if s is None:
        return "–"
    if s.missing * 2 >= s.n:
        return f"never ({s.n - s.missing}/{s.n})"
    med, lo = format(s.median, spec), format(s.lo, spec)
    hi = "never" if math.isinf(s.hi) else format(s.hi, spec)
    return med if lo == hi == med else f"{med} [{lo}–{hi}]"


def _label(col: str) -> str:
    return f"best ({col[5:]})" if col.startswith("best:") else col


def markdown(table: list[dict], target: float, epochs: int | None = None) -> list[str]:
    """The table's lines, then what each cap gave the nodes and what the head and the
    driver took, the settings DDLF's defaults ran, and any failed run."""
    epochs = epochs or max((r["epochs"] or 0 for r in table), default=0)
    head = ["CPU/node", "K", "link", "column", "ran", "seeds", f"time to {target} s",
            f"epochs to {target}", "s/epoch", "throughput eff.", "T1/(K·TK)",
            "vs dataparallel", f"accuracy after {epochs} epochs", "vs single, points",
            "evals/epoch", "start-up s", "head+driver CPU", "nodes CPU"]
    lines = ["| " + " | ".join(head) + " |",
             "|---:|---:|---|---|---|" + "---:|" * (len(head) - 5)]
    short = []
    for r in table:
        evals = _span(r["evals_per_epoch"], ".1f")
        got = r["evals_per_epoch_median"]
        if got is not None and r["evals_wanted"] and got < r["evals_wanted"] - 1e-6:
            evals += " (!)"
            made, predicted = r["rounds"]
            why = "" if made is None else (
                f": {made:.0f} rounds an epoch" + (
                    f", not the {predicted:.0f} predicted: the scheme chose its rounds as "
                    "the run started" if predicted and abs(made - predicted) > 0.5 else ""))
            short.append(f"{_label(r['column'])} at K = {r['k']}{why}")
        cap = r["cpus"] * r["k"]
        lines.append("| " + " | ".join([
            f"{r['cpus']:g}", str(r["k"]), RATE_NAME.get(r["rate"], r["rate"]),
            f"**{_label(r['column'])}**" if r["column"] == "defaults" else _label(r["column"]),
            r["ran"], str(r["seeds"]), _span(r["time_to_target"], ".1f"),
            _span(r["epochs_to_target"], ".2f"), _span(r["s_per_epoch"], ".1f"),
            _fmt(r["throughput_eff"], ".0%"), _fmt(r["ttt_eff"], ".0%"),
            _fmt(r["vs_dataparallel"], ".2f") + ("×" if r["vs_dataparallel"] else ""),
            _span(r["fixed_accuracy"], ".4f"), _fmt(r["vs_single_points"], "+.2f"), evals,
            _fmt(r["startup_s_median"], ".1f"), _fmt(r["head_driver_cpu_median"], ".3f"),
            (_fmt(r["nodes_cpu_median"], ".2f") + f" of {cap:g}")
            if r["nodes_cpu_median"] is not None else "–"]) + " |")
    lines.append("")
    lines.append("Medians over the seeds [min–max]; `never (n/m)`: fewer than half the "
                 "seeds reached the target. Times are training time: start-up and every "
                 "evaluation taken out, for every column the same way. Throughput "
                 "efficiency: the column's own s/epoch at K = 1 (same cap and link) over K "
                 "times its s/epoch; T1/(K·TK): T1 is the tuned single process's time at "
                 "the same cap. CPU: CPU seconds over the run's wall seconds.")
    lines += _caps(table) + _defaults(table)
    if short:
        lines.append("- (!) fewer evaluations per epoch than asked, so time to the target is "
                     "coarser there (a DDLF run is evaluated between rounds, at most once a "
                     f"round): {'; '.join(short)}.")
    stopped = [f"{_label(r['column'])} at K = {r['k']} ({r['stopped_early']})"
               for r in table if r["stopped_early"]]
    if stopped:
        lines.append("- No accuracy after the fixed epochs where runs stopped before them "
                     f"(--max-rounds, --stop-at-target): {', '.join(stopped)}.")
    for r in table:
        for e in r["errors"]:
            lines.append(f"- failed: {_label(r['column'])} at K = {r['k']}, "
                         f"{RATE_NAME.get(r['rate'], r['rate'])}, {r['cpus']:g} CPU, {e}")
    return lines


def _caps(table: list[dict]) -> list[str]:
    """What the nodes were given and what the head and the driver took beside them."""
    machine = {r.get("machine_cpus") for row in table for r in row["runs"]} - {None}
    cores = f"a machine of {'/'.join(map(str, sorted(machine)))} CPUs" if machine else \
        "a machine of unrecorded size"
    out = []
    for cap in sorted({r["cpus"] for r in table}, reverse=True):
        at = [r for r in table if r["cpus"] == cap]
        ks = sorted({r["k"] for r in at})
        hd = [v for r in at for v in [r["head_driver_cpu_median"]] if v is not None]
        top = [v for r in at for v in [r["head_driver_cpu_max"]] if v is not None]
        out.append(f"- Nodes capped at {cap:g} CPU each (K = {', '.join(map(str, ks))}: "
                   f"{', '.join(f'{k * cap:g}' for k in ks)} CPU in all, on {cores}); "
                   "the head and the driver, uncapped, took "
                   + (f"{statistics.median(hd):.3f} CPU (median of the rows' medians), "
                      f"{max(top):.3f} at most over a run" if hd else "– (not measured)")
                   + ".")
    return out


def _defaults(table: list[dict]) -> list[str]:
    """Which scheme and settings ``train(model_fn, dataset)`` ran, per K and link."""
    out = []
    for r in table:
        if r["column"] == "defaults" and r["settings"]:
            out.append(f"- DDLF's defaults at K = {r['k']}, "
                       f"{RATE_NAME.get(r['rate'], r['rate'])}: "
                       + " / ".join(s for s in r["settings"] if s))
    return out
