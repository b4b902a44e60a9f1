"""Selection on validation, and the choices file the final run reads.

Each candidate of a column's grid ran on the selection split (``split.py``) for the
selection epochs, once per selection seed. A candidate's row summarises its runs
(:func:`candidate_row`); the chosen one (:func:`choose`) reaches the target on
validation in the least training time (median over seeds; a seed that never reaches it
counts as infinite), ties broken by the validation accuracy after the selection epochs.
A candidate that diverged or failed in any seed is never chosen.

The choices file (:func:`write_choices`) holds, per column, the chosen candidate and the
whole selection table; :func:`read_choices` gives the final run its settings and
refuses, naming the ``--select`` command, a column it has no choice for.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Mapping, Sequence

from .curves import divergence, first_crossing
from .stats import summarize

__all__ = ["ChoicesMissing", "candidate_row", "choose", "write_choices", "read_choices",
           "select_command", "FORMAT"]

FORMAT = 1


class ChoicesMissing(RuntimeError):
    """The final run has no selected setting for a column that has a grid."""


def select_command(columns: Sequence[str], path: str) -> str:
    return (f"python benchmarks/training/train_compare.py --select --columns {','.join(columns)} "
            f"--choices {path}")


def candidate_row(candidate: dict, runs: Sequence[dict], target: float) -> dict:
    """One row of the selection table: ``runs`` are the candidate's column-run results
    (one per selection seed)."""
    times, epochs, accs, problems = [], [], [], []
    for r in runs:
        if r.get("status") != "ok":
            problems.append(f"seed {r.get('seed')}: {r.get('status')}: {r.get('reason', '')}")
            continue
        why = divergence(r["evals"], r.get("train_losses", ()))
        if why:
            problems.append(f"seed {r.get('seed')}: diverged: {why}")
        hit = first_crossing(r["evals"], target)
        times.append(None if hit is None else hit.train_s)
        epochs.append(None if hit is None else hit.epoch)
        accs.append(r["evals"][-1]["accuracy"] if r["evals"] else None)
    t, e = summarize(times), summarize(epochs)
    a = summarize([x for x in accs if x is not None])
    return {"candidate": dict(candidate), "label": runs[0].get("label") if runs else None,
            "seeds": [r.get("seed") for r in runs],
            "time_to_target": t.to_json() if t else None,
            "epochs_to_target": e.to_json() if e else None,
            "final_accuracy": a.to_json() if a else None,
            "diverged": any("diverged" in p for p in problems),
            "problems": problems}


def _key(row: dict) -> tuple:
    t = row["time_to_target"]
    median = math.inf if t is None or t["median"] is None else t["median"]
    acc = row["final_accuracy"]
    return (median, -(acc["median"] if acc and acc["median"] is not None else -math.inf))


def choose(rows: Sequence[dict]) -> int | None:
    """The index of the chosen row (see the module docstring), or None if every
    candidate diverged or failed."""
    eligible = [i for i, r in enumerate(rows) if not r["problems"]]
    if not eligible:
        return None
    return min(eligible, key=lambda i: (_key(rows[i]), i))


def write_choices(path: str, tables: Mapping[str, Sequence[dict]], meta: dict) -> dict:
    """Choose for every column of ``tables`` (column -> candidate rows) and write the file
    (merged into an existing one: columns selected earlier keep their choice unless
    selected again). Returns what was written."""
    doc = {"format": FORMAT, "columns": {}}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("format") == FORMAT:
            doc["columns"] = dict(old.get("columns", {}))
    for column, rows in tables.items():
        i = choose(rows)
        for j, row in enumerate(rows):
            row["chosen"] = j == i
        doc["columns"][column] = {"chosen": None if i is None else rows[i]["candidate"],
                                  "why_none": None if i is not None else
                                  "every candidate diverged or failed",
                                  "selection": list(rows), **meta}
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    return doc


def read_choices(path: str, columns: Sequence[str],
                 command: Callable[[Sequence[str], str], str] = select_command
                 ) -> dict[str, dict]:
    """``{column: chosen candidate}`` for ``columns`` (each of which has a grid).

    Raises :class:`ChoicesMissing` naming the ``--select`` command (``command(columns,
    path)``: ``train_compare.py``'s unless given) when the file is missing or has no
    usable choice for one of them."""
    cmd = command(columns, path)
    if not columns:
        return {}
    if not os.path.exists(path):
        raise ChoicesMissing(f"no choices file {path}: the final run trains each column with "
                             f"the settings selection chose on validation. Run first:\n  {cmd}")
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ChoicesMissing(f"{path} is not a choices file of format {FORMAT}; run:\n  {cmd}")
    out, missing = {}, []
    for c in columns:
        entry = doc.get("columns", {}).get(c)
        if not entry or not entry.get("chosen"):
            why = (entry or {}).get("why_none") or "not selected"
            missing.append(f"{c} ({why})")
        else:
            out[c] = entry["chosen"]
    if missing:
        raise ChoicesMissing(f"{path} has no choice for {', '.join(missing)}; run:\n  "
                             f"{command([m.split(' ')[0] for m in missing], path)}")
    return out
