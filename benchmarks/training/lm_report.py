"""``lm_compare.py``'s table and ratios, in the parent: a run's figures against a target
*loss* (reached going down), the table of medians per column and rate, and DDLF's
defaults against the single process and DDP per seed (the issue's targets)."""

from __future__ import annotations

from benchmarks.peers.torch_report import _med


def figures(r: dict, target: float | None) -> dict:
    rows = r.get("timeline") or []
    if not rows:
        return {}
    epochs = rows[-1]["epoch"]
    hit = None if target is None else next((x for x in rows if x["test_loss"] <= target),
                                           None)
    per_epoch = r["train_s"] / epochs if epochs else None
    return {"s_per_epoch": per_epoch,
            "tokens_per_s": r["tokens_per_epoch"] / per_epoch if per_epoch else None,
            "epochs_to_target": hit["epoch"] if hit else None,
            "time_to_target": hit["train_s"] if hit else None,
            "final_loss": rows[-1]["test_loss"], "epochs": epochs,
            "startup_s": r.get("startup_s")}


def report_table(results: list, target: float | None, title: str) -> str:
    med = _med
    goal = "the target" if target is None else f"{target:.4f}"
    lines = [title, "", f"| column | lr | s/epoch | tokens/s | epochs to {goal} | "
             f"time to {goal} (s) | loss after the budget | epochs | start-up (s) | "
             "load avg per run |", "|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in results:
        groups.setdefault((r["column"], r["lr"]), []).append(r)
    for (column, lr), runs in groups.items():
        loads = " ".join(f"{r['loadavg']:.1f}" for r in runs)
        ok = [r for r in runs if "timeline" in r]
        if not ok:
            why = runs[0].get("unavailable") or runs[0].get("error")
            lines.append(f"| {column} | {lr} | {why} | | | | | | | {loads} |")
            continue
        figs = [figures(r, target) for r in ok]
        lines.append(
            f"| {column} | {lr} | {med([f['s_per_epoch'] for f in figs], '.1f')} | "
            f"{med([f['tokens_per_s'] for f in figs], ',.0f')} | "
            f"{med([f['epochs_to_target'] for f in figs], '.3f')} | "
            f"{med([f['time_to_target'] for f in figs], '.1f')} | "
            f"{med([f['final_loss'] for f in figs], '.4f')} | "
            f"{med([f['epochs'] for f in figs], '.3f')} | "
            f"{med([f['startup_s'] for f in figs], '.1f')} | {loads} |"
            + (f" ({len(runs) - len(ok)} failed: {runs[-1].get('error')})"
               if len(ok) < len(runs) else ""))
    return "\n".join(lines)


def ratio_lines(results: list, target: float | None) -> list:
    """DDLF's defaults (and any other ``ddlf-*`` column run) against the single process and
    DDP, per seed: the issue's targets (time to the target loss <= 1.0x and <= 0.7x; the
    loss after the budget within 2 %)."""
    by = {(r["column"], r["seed"]): figures(r, target) for r in results if "timeline" in r}
    ours = sorted({c for c, _ in by if c.startswith("ddlf-")}, key=lambda c: c != "ddlf-default")
    out = []
    for mine in ours:
        for other, goal in (("torch-1p", 1.0), ("torch-ddp", 0.7)):
            ratios, losses = [], []
            for (column, seed), f in by.items():
                g = by.get((other, seed))
                if column != mine or not g:
                    continue
                if f["time_to_target"] and g["time_to_target"]:
                    ratios.append(f["time_to_target"] / g["time_to_target"])
                losses.append(f["final_loss"] / g["final_loss"] - 1)
            if ratios:
                out.append(f"{mine} / {other}, time to the target: "
                           f"{', '.join(f'{x:.2f}x' for x in ratios)} (target <= {goal}x)")
            if losses:
                out.append(f"{mine} / {other}, loss after the budget: "
                           f"{', '.join(f'{100 * x:+.1f} %' for x in losses)}")
    return out
