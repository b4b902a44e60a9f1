"""A run's history as files: CSV, JSON, a PNG like the paper's Figure 4.1, a text table."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence

__all__ = ["write_history", "plot_history", "format_table", "epoch_rows"]


def write_history(history: list, out_dir: str) -> tuple[str, str]:
    """Write ``history.csv`` and ``history.json`` into ``out_dir``; return both paths."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "history.csv")
    json_path = os.path.join(out_dir, "history.json")
    fields = list(history[0]) if history else []
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in history:
            writer.writerow(row)
    with open(json_path, "w") as f:
        json.dump(history, f, indent=1)
    return csv_path, json_path


def plot_history(history: list, path: str, title: str = "DDLF training") -> str:
    """Accuracy and loss against epochs and against time (2 x 2 panels) as a PNG; for a
    text run (rows with ``tokens``), loss and bits per byte against tokens and time."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster machines
    import matplotlib.pyplot as plt

    if history and "tokens" in history[0]:
        return _plot_text(plt, history, path, title)
    # Test curves at the evaluated rows only; the train loss of every round (a sync run
    # evaluates once per epoch by default but reports a train loss each round).
    rows = [r for r in history if r.get("test_accuracy") is not None]
    trained = [r for r in history if r.get("train_loss") is not None]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, key in enumerate(("epoch", "time_s")):
        xs = [r[key] for r in rows]
        axes[0][col].plot(xs, [r["test_accuracy"] for r in rows], marker="o", label="test")
        axes[0][col].set_ylabel("accuracy")
        axes[1][col].plot(xs, [r["test_loss"] for r in rows], marker="o", label="test")
        axes[1][col].plot([r[key] for r in trained], [r["train_loss"] for r in trained],
                          marker="x" if len(trained) <= 50 else None, label="train")
        axes[1][col].set_ylabel("loss")
    return _finish(plt, fig, axes, ("epoch", "time (s)"), title, path)


def _finish(plt, fig, axes, xlabels, title: str, path: str) -> str:
    """Label, grid and legend each panel of the 2x2 figure, title it and write ``path``."""
    for col, xlabel in enumerate(xlabels):
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_text(plt, history: list, path: str, title: str) -> str:
    """A text run: validation and training loss (top) and bits per byte (bottom) against
    tokens trained and against time."""
    rows = [r for r in history if r.get("test_loss") is not None]
    trained = [r for r in history if r.get("train_loss") is not None]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, key in enumerate(("tokens", "time_s")):
        axes[0][col].plot([r[key] for r in rows], [r["test_loss"] for r in rows], marker="o",
                          label="validation")
        axes[0][col].plot([r[key] for r in trained], [r["train_loss"] for r in trained],
                          marker="x" if len(trained) <= 50 else None, label="train")
        axes[0][col].set_ylabel("loss (nats per token)")
        axes[1][col].plot([r[key] for r in rows], [r["bits_per_byte"] for r in rows],
                          marker="o", label="validation")
        axes[1][col].set_ylabel("bits per byte")
    return _finish(plt, fig, axes, ("tokens trained", "time (s)"), title, path)


def epoch_rows(history: list) -> list:
    """The last row of each whole epoch (sync runs have several rows per epoch)."""
    out = {}
    for row in history:
        out[int(-(-row["epoch"] // 1))] = row
    return [out[k] for k in sorted(out)]


def format_table(history: list, events: Sequence = ()) -> str:
    """A text table: epoch, time, trainers, test accuracy and loss, train loss, and what
    happened to the trainers during the epoch (losses and joins; the column is there only
    when something happened). A text run's shows the validation loss, bits per byte and
    tokens/s instead of the accuracy."""
    text = bool(history) and "tokens" in history[0]
    lines = [f"{'epoch':>5}  {'time (s)':>9}  {'K':>3}  "
             + (f"{'val loss':>8}  {'bits/B':>6}  {'tokens/s':>9}  " if text else
                f"{'test acc':>8}  {'test loss':>9}  ")
             + f"{'train loss':>10}  trainers"]
    prev_time = float("-inf")
    for row in epoch_rows(history):
        acc, tl = row.get("test_accuracy"), row.get("test_loss")
        happened = [e for e in events if prev_time < e["time_s"] <= row["time_s"]
                    and e["kind"] in ("trainer_lost", "trainer_joined", "trainer_start_failed",
                                      "trainer_died_starting")]
        prev_time = row["time_s"]
        note = ", ".join(f"{e['trainer']} {e['kind'].split('_', 1)[1].replace('_', ' ')}"
                         for e in happened)
        if text:
            bpb, rate = row.get("bits_per_byte"), row.get("tokens_per_s")
            middle = (f"{'-' if tl is None else f'{tl:.4f}':>8}  "
                      f"{'-' if bpb is None else f'{bpb:.3f}':>6}  "
                      f"{'-' if not rate else f'{rate:,.0f}':>9}  ")
        else:
            middle = (f"{'-' if acc is None else f'{acc:.4f}':>8}  "
                      f"{'-' if tl is None else f'{tl:.4f}':>9}  ")
        lines.append(f"{row['epoch']:>5g}  {row['time_s']:>9.1f}  {row.get('workers', '-'):>3}  "
                     f"{middle}{row['train_loss']:>10.4f}  {note}".rstrip())
    if not any(len(line) > len(lines[0]) - len("  trainers") for line in lines[1:]):
        lines[0] = lines[0][:-len("  trainers")]
    return "\n".join(lines)
