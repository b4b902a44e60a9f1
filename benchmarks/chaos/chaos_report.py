"""``train_chaos.py``'s analysis of a run against its fault-free baseline (reconfiguration
time, accuracy lost, checkpoint cost, wasted compute) and its report: the runs, the
faults, and the issue's targets met or missed.
"""

from __future__ import annotations

import statistics

# The targets of the issue (section 1 and 4).
TARGET_RECONFIG_S = 3.0
TARGET_ACC_POINTS = 0.5
TARGET_CKPT_FRACTION = 0.02
TARGET_WASTE_SHARES = 1.0


# -- analysis ----------------------------------------------------------------------------------


def _planned(round_no: int, n: int, R: int) -> int:
    r = (round_no - 1) % R
    return n * (r + 1) // R - n * r // R


def analyse(run: dict, base: dict | None, spec: dict) -> dict:
    """Per-fault timings and waste, accuracy and checkpoint cost of one run."""
    events = run.get("events", [])
    calls = run.get("calls", [])
    pid_slot = {c["pid"]: c["slot"] for c in calls}
    durations = _call_durations(calls)
    median_call = statistics.median(durations) if durations else None
    rows = {r["round"]: r for r in run.get("rows", [])}
    out = []
    faults = run.get("faults", [])
    for i, f in enumerate(faults):
        nxt = faults[i + 1]["t"] if i + 1 < len(faults) else float("inf")
        m = {"kind": f["kind"], "t": f["t"] - (run.get("t_begin") or f["t"])}
        if f["kind"] in ("trainer", "node"):
            slot = pid_slot.get(f["pid"])
            m["slot"] = slot
            m["spare"] = f.get("spare", False)
            lost = next((e for e in events if e["kind"] == "trainer_lost" and e["wall"] >= f["t"]
                         and (slot is None or e["trainer"] == slot)), None)
            if lost is None:
                m["undetected"] = True   # the run ended first (or missed it: see below)
                out.append(m)
                continue
            m["detect_s"] = lost["wall"] - f["t"]
            m["round"] = lost["round"]
            start = next((c for c in calls if c["e"] in ("start", "eval")
                          and c["t"] >= lost["wall"] and c["pid"] != f["pid"]), None)
            if start is not None:
                m["resume_s"] = start["t"] - f["t"]
            joined = next((e for e in events if e["kind"] == "trainer_joined"
                           and e["trainer"] == lost["trainer"] and e["wall"] >= lost["wall"]),
                          None)
            if joined is not None:
                m["replace_s"] = joined["wall"] - f["t"]
                m["replace_after_join"] = joined["wall"] > nxt
            m["wasted_compute"] = _wasted_compute(calls, f, median_call)
            if spec["scheme"] == "sync" and lost["round"] in rows:
                row = rows[lost["round"]]
                planned = _planned(lost["round"], spec["train_size"], spec["rounds_per_epoch"])
                share = planned / (row["workers"] + 1)
                m["wasted_samples"] = max(0, planned - row["samples"]) / share
        else:
            joined = next((e for e in events if e["kind"] == "trainer_joined"
                           and e["wall"] >= f["t"] and e["wall"] < nxt), None)
            m["started_s"] = f.get("started_s")
            if joined is not None:
                m["replace_s"] = joined["wall"] - f["t"]
        out.append(m)
    result = {"faults": out}
    if run.get("status") == "ok":
        result["checkpoint_frac"] = run["checkpoint_s"] / run["train_s"]
        if run.get("checkpoint_write_s") is not None:
            result["writer_frac"] = run["checkpoint_write_s"] / run["train_s"]
            result["writer_cpu_frac"] = run["checkpoint_cpu_s"] / run["train_s"]
        if base is not None and base.get("final_accuracy") is not None:
            result["acc_diff"] = 100 * (run["final_accuracy"] - base["final_accuracy"])
    # Rows trained by fewer than K trainers (sync: rounds; async: epochs).
    result["short_rows"] = sum(1 for w in run.get("workers", []) if w < spec["nodes"])
    lost_events = [e for e in events if e["kind"] == "trainer_lost"]
    result["unexplained_losses"] = max(0, len(lost_events) - sum(
        1 for m in out if "detect_s" in m))
    return result


def _call_durations(calls: list) -> list:
    starts: dict = {}
    out = []
    for c in calls:
        if c["e"] == "start":
            starts[c["pid"]] = c["t"]
        elif c["pid"] in starts:
            out.append(c["t"] - starts.pop(c["pid"]))
    return out


def _wasted_compute(calls: list, fault: dict, median_call: float | None) -> float:
    """The lost trainer's unfinished call at the fault, in shares (median calls)."""
    mine = [c for c in calls if c["pid"] == fault["pid"] and c["t"] <= fault["t"]
            and c["e"] != "eval"]
    if not mine or mine[-1]["e"] != "start" or not median_call:
        return 0.0
    return (fault["t"] - mine[-1]["t"]) / median_call


# -- the report --------------------------------------------------------------------------------


def _stat(values: list, spec: str = ".2f") -> str:
    if not values:
        return "-"
    return f"{format(statistics.median(values), spec)} / {format(max(values), spec)}"


def _mean_max(values: list, spec: str = ".2f") -> str:
    if not values:
        return "-"
    return f"{format(statistics.fmean(values), spec)} / {format(max(values), spec)}"


def format_runs(runs: list, analyses: list) -> str:
    head = (f"{'run':>4} {'scheme':<6} {'status':<7} {'train s':>8} {'faults':<22} "
            f"{'short':>5} {'acc':>7} {'Δ pts':>6} {'ckpt %':>7} {'writer %':>8} {'cpu %':>6} "
            f"{'load':>5}")
    lines = [head, "-" * len(head)]
    for run, a in zip(runs, analyses):
        kinds = [m["kind"] for m in a["faults"]]
        faults = " ".join(f"{k}x{kinds.count(k)}" for k in ("trainer", "node", "join")
                          if kinds.count(k)) or "-"
        acc = run.get("final_accuracy")
        lines.append(
            f"{run['run']:>4} {run['scheme']:<6} {run['status']:<7} "
            f"{run.get('train_s', 0):>8.1f} {faults:<22} {a.get('short_rows', 0):>5} "
            f"{'-' if acc is None else f'{acc:.4f}':>7} "
            f"{'-' if a.get('acc_diff') is None else format(a['acc_diff'], '+.2f'):>6} "
            f"{'-' if a.get('checkpoint_frac') is None else format(100 * a['checkpoint_frac'], '.2f'):>7} "
            f"{'-' if a.get('writer_frac') is None else format(100 * a['writer_frac'], '.2f'):>8} "
            f"{'-' if a.get('writer_cpu_frac') is None else format(100 * a['writer_cpu_frac'], '.2f'):>6} "
            f"{run.get('load_before', 0):>5.1f}")
        if run["status"] != "ok":
            lines.append(f"     {run.get('error', '')}")
    lines.append("short: history rows trained by fewer than K trainers (sync: rounds, async: "
                 "epochs); Δ pts: final test accuracy minus the fault-free run's; ckpt %: "
                 "time the loop waited on checkpoints; writer %, cpu %: the writer thread's "
                 "wall time (mostly fsync) and CPU time; load: 1-min load average at its start")
    return "\n".join(lines)


def format_faults(analyses: list, runs: list) -> str:
    head = (f"{'fault':<14} {'n':>3} {'detected':>8} {'detect s':>13} {'next call s':>13} "
            f"{'replaced s':>13} {'waste: compute':>15} {'samples':>13}")
    lines = ["times: median / max; waste: mean / max, in shares (one trainer's share of "
             "one round)", head, "-" * len(head)]
    groups: dict = {}
    for run, a in zip(runs, analyses):
        for m in a["faults"]:
            key = m["kind"]
            if m["kind"] == "node" and m.get("spare"):
                key = "node (spare)"
            groups.setdefault(f"{key} {run['scheme']}", []).append(m)
    for key in sorted(groups):
        ms = groups[key]
        det = [m for m in ms if "detect_s" in m]
        lines.append(
            f"{key:<14} {len(ms):>3} "
            f"{(f'{len(det)}/{len(ms)}' if not key.startswith('join') else '-'):>8} "
            f"{_stat([m['detect_s'] for m in det]):>13} "
            f"{_stat([m['resume_s'] for m in det if 'resume_s' in m]):>13} "
            f"{_stat([m['replace_s'] for m in ms if 'replace_s' in m]):>13} "
            f"{_mean_max([m['wasted_compute'] for m in det]):>15} "
            f"{_mean_max([m['wasted_samples'] for m in det if 'wasted_samples' in m]):>13}")
    lines.append("node: killed with no spare node, its trainer waits for a join (replaced s "
                 "includes that wait); join: from the node's start to a trainer joining on it")
    return "\n".join(lines)


def targets(runs: list, analyses: list) -> list[tuple[str, str, bool]]:
    chaos = [(r, a) for r, a in zip(runs, analyses) if r["chaos"]]
    hangs = sum(1 for r, _ in chaos if r["status"] == "hang")
    failed = sum(1 for r, _ in chaos if r["status"] == "failed")
    out = [("0 hangs, 0 failed runs (K-1 of K lost, one at a time)",
            f"{hangs} hangs, {failed} failed of {len(chaos)}", hangs == 0 and failed == 0)]
    procs = [m for _, a in chaos for m in a["faults"] if m["kind"] == "trainer"]
    det = [m for m in procs if "detect_s" in m]
    if procs:
        reconf = [min(m.get("resume_s", float("inf")), m.get("replace_s", float("inf")))
                  for m in det]
        worst_det = max((m["detect_s"] for m in det), default=float("inf"))
        worst = max(reconf, default=float("inf"))
        out.append(("lost process detected and reconfigured <= 3 s",
                    f"{len(det)}/{len(procs)} detected; detect max {worst_det:.2f} s; "
                    f"reconfigured (first of next call, replacement) max {worst:.2f} s, "
                    f"median {statistics.median(reconf) if reconf else float('nan'):.2f} s",
                    len(det) == len(procs) and worst_det <= TARGET_RECONFIG_S
                    and worst <= TARGET_RECONFIG_S))
    diffs = [a["acc_diff"] for _, a in chaos if a.get("acc_diff") is not None]
    if diffs:
        worst = min(diffs, key=lambda d: -abs(d))
        out.append(("final accuracy within 0.5 points of the fault-free run",
                    f"mean {statistics.fmean(diffs):+.2f}, furthest {worst:+.2f}, "
                    f"largest drop {min(0.0, min(diffs)):+.2f} points",
                    round(abs(worst), 6) <= TARGET_ACC_POINTS))
    fracs = [a["checkpoint_frac"] for _, a in chaos if a.get("checkpoint_frac") is not None]
    writer = [a["writer_frac"] for _, a in chaos if a.get("writer_frac") is not None]
    cpu = [a["writer_cpu_frac"] for _, a in chaos if a.get("writer_cpu_frac") is not None]
    if fracs:
        # The cost to training: what the loop waited, plus the CPU the writer thread took
        # from the driver (its waits on fsync take nothing from anyone).
        cost = [f + c for f, c in zip(fracs, cpu)] if len(cpu) == len(fracs) else fracs
        text = (f"loop waits mean {100 * statistics.fmean(fracs):.2f} %, max "
                f"{100 * max(fracs):.2f} %")
        if writer:
            text += (f"; writer CPU mean {100 * statistics.fmean(cpu):.2f} %, max "
                     f"{100 * max(cpu):.2f} % (its wall time, mostly fsync: mean "
                     f"{100 * statistics.fmean(writer):.2f} %, max {100 * max(writer):.2f} %)")
        out.append(("checkpoint cost <= 2 % of wall time (waits + writer CPU)", text,
                    max(cost) <= TARGET_CKPT_FRACTION))
    waste = [max(m.get("wasted_compute", 0.0), m.get("wasted_samples", 0.0))
             for _, a in chaos for m in a["faults"] if "detect_s" in m]
    if waste:
        out.append(("wasted work per failure <= one trainer's share of one round",
                    f"mean {statistics.fmean(waste):.2f}, max {max(waste):.2f} shares",
                    max(waste) <= TARGET_WASTE_SHARES))
    return out


def format_targets(rows: list) -> str:
    head = f"{'target':<62} {'met':<4} measured"
    lines = [head, "-" * 100]
    for name, text, ok in rows:
        lines.append(f"{name:<62} {'yes' if ok else 'NO':<4} {text}")
    return "\n".join(lines)
