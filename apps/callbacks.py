"""Hooks the training loop calls, as in Keras: history, progress bar, early stop, CSV,
TensorBoard.

The schemes only call hooks; everything that watches a run is a callback. A callback
sets ``run.stop = True`` to end training after the current row.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import socket
import sys
import uuid
from typing import Any

__all__ = ["Callback", "History", "ProgressBar", "EventLog", "EarlyStopping", "CsvLogger",
           "TensorBoard", "DashboardPublisher", "describe_event"]

log = logging.getLogger("ddlf_actors.train")

# Events worth a line on the terminal as they happen (checkpoints are only recorded).
_SHOWN = {"trainer_lost", "trainer_joined", "trainer_start_failed", "trainer_died_starting",
          "waiting_for_trainers", "resumed"}


def describe_event(event: dict) -> str:
    """One line for a run event, as the progress bar and the CLI print it."""
    who = "" if event.get("trainer") is None else f"trainer {event['trainer']} "
    where = f" on node {event['node']}" if event.get("node") else ""
    what = event["kind"].replace("_", " ")
    if who and what.startswith("trainer "):
        what = what[len("trainer "):]
    return (f"[{event['time_s']:8.1f} s, round {event['round']}] {who}{what}{where}: "
            f"{event['detail']}")


class Callback:
    def on_train_begin(self, run) -> None:
        """``run`` has ``.config``, ``.scheme``, ``.total_rows``, ``.rows_done``, ``.events``
        and a writable ``.stop``."""

    def on_row(self, row: dict, run) -> None:
        """A history row is complete (its evaluation included)."""

    def on_event(self, event: dict, run) -> None:
        """Something happened to the run (a trainer lost or joined, a resume, a checkpoint
        written; every kind of ``records.EventKind``): see ``records.RunEvent``. It is in
        ``run.events`` already."""

    def on_train_end(self, result) -> None:
        pass


class History(Callback):
    def __init__(self):
        self.rows: list[dict] = []

    def on_row(self, row, run):
        self.rows.append(row)


class ProgressBar(Callback):
    """A tqdm bar on stderr: round, epoch, test accuracy and samples per second; for a
    text run (rows with ``tokens_per_s``) the training and test loss and tokens per
    second instead."""

    def __init__(self, file=None):
        self.file = file or sys.stderr
        self.bar = None

    def on_train_begin(self, run):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=run.total_rows, initial=run.rows_done, file=self.file,
                        unit="round", desc=f"ddlf {run.scheme}", dynamic_ncols=True, leave=True)

    def on_row(self, row, run):
        if self.bar is None:
            return
        acc = row.get("test_accuracy")
        rate = row.get("samples_per_s")
        where = f"round {row['round']} epoch {row['epoch']:g} K={row.get('workers', '-')}"
        if "tokens_per_s" in row:
            tokens, loss, test = row["tokens_per_s"], row.get("train_loss"), row.get("test_loss")
            self.bar.set_postfix_str(
                f"{where} loss {'-' if loss is None else f'{loss:.3f}'} "
                f"val {'-' if test is None else f'{test:.3f}'} "
                f"{'-' if not tokens else f'{tokens:,.0f}'} tokens/s", refresh=False)
        else:
            self.bar.set_postfix_str(
                f"{where} acc {'-' if acc is None else f'{acc:.4f}'} "
                f"{'-' if not rate else f'{rate:,.0f}'} samples/s", refresh=False)
        self.bar.update(1)

    def on_event(self, event, run):
        if event["kind"] not in _SHOWN:
            return
        if self.bar is None:
            print(describe_event(event), file=self.file)
        else:
            self.bar.write(describe_event(event), file=self.file)

    def on_train_end(self, result):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class EventLog(Callback):
    """Log losses, rejoins and resumes to the ``ddlf_actors.train`` logger (what a run
    without a progress bar does): a loss is a warning, a rejoin or resume is info."""

    def on_event(self, event, run):
        if event["kind"] not in _SHOWN:
            return
        level = logging.INFO if event["kind"] in ("trainer_joined", "resumed") else logging.WARNING
        log.log(level, "%s", describe_event(event))


class EarlyStopping(Callback):
    """Stop at ``target_accuracy`` or at ``target_loss`` (a test loss at or below it), or
    after ``patience`` rows without a new best test loss."""

    def __init__(self, target_accuracy=None, patience=None, target_loss=None):
        self.target_accuracy = target_accuracy
        self.target_loss = target_loss
        self.patience = patience
        self.best = math.inf
        self.waited = 0
        self.reason = None

    def on_row(self, row, run):
        acc, loss = row.get("test_accuracy"), row.get("test_loss")
        if acc is None:
            return
        if self.target_accuracy is not None and acc >= self.target_accuracy:
            self.reason = f"test accuracy {acc:.4f} reached the target {self.target_accuracy}"
            run.stop = True
        if self.target_loss is not None and loss is not None and loss <= self.target_loss:
            self.reason = f"test loss {loss:.4f} reached the target {self.target_loss}"
            run.stop = True
        if self.patience is not None:
            if loss < self.best:
                self.best, self.waited = loss, 0
            else:
                self.waited += 1
                if self.waited >= self.patience:
                    self.reason = f"no better test loss in {self.patience} evaluations"
                    run.stop = True


class CsvLogger(Callback):
    """Write each row to ``path`` as it completes (so a crashed run keeps its history)."""

    def __init__(self, path: str):
        self.path = path
        self._file: Any = None
        self._writer: Any = None   # a csv.DictWriter once the first row names the columns

    def on_row(self, row, run):
        if self._writer is None:
            self._file = open(self.path, "w", newline="")
            self._writer = csv.DictWriter(self._file, fieldnames=list(row))
            self._writer.writeheader()
        self._writer.writerow({k: row.get(k) for k in self._writer.fieldnames})
        self._file.flush()

    def on_train_end(self, result):
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoard(Callback):
    """Write each history row's scalars to TensorBoard event files in ``log_dir``
    (``tensorboard --logdir log_dir``), through ``tf.summary``.

    Per row: ``test_accuracy``, ``test_loss``, ``train_loss``, ``bytes_sent``,
    ``bytes_received``, ``wall_s`` (the round's time) and ``workers`` (when the row has
    it), and for a text run ``bits_per_byte``, ``perplexity`` and ``tokens_per_s``, each
    twice: ``by_round/<key>`` with the row's ``round`` as the step, and
    ``by_time/<key>`` with the row's ``time_s`` (seconds since training began) in whole
    milliseconds as the step; a text run's rows also go to ``by_tokens/<key>``, the
    tokens trained as the step. Milliseconds, because steps are integers and rounds of a
    small model are milliseconds apart (whole seconds would put several rows on one
    step); and the row's own time, because TensorBoard's built-in wall-time axis is the
    time each event was written, which lags a row by one round (its evaluation arrives
    during the next round). Keys a row lacks or holds as None are skipped.

    TensorFlow is imported when training begins, in the driver, not when this is made.
    Events are flushed after each row, so a TensorBoard open during the run follows it.
    """

    KEYS = ("test_accuracy", "test_loss", "train_loss", "bytes_sent", "bytes_received",
            "wall_s", "workers")
    # A text run's rows also have these (lm/metrics.py).
    TEXT_KEYS = ("bits_per_byte", "perplexity", "tokens_per_s")

    def __init__(self, log_dir: str):
        self.log_dir = str(log_dir)
        self._tf: Any = None       # TensorFlow, imported on the first row
        self._writer: Any = None

    def on_train_begin(self, run):
        from . import tf_startup

        self._tf = tf_startup.import_tensorflow()
        self._writer = self._tf.summary.create_file_writer(self.log_dir)

    def on_row(self, row, run):
        if self._writer is None:
            return
        scalar = self._tf.summary.scalar
        step_ms = int(round(float(row.get("time_s") or 0.0) * 1000))
        tokens = row.get("tokens")
        with self._writer.as_default():
            for key in self.KEYS + (self.TEXT_KEYS if tokens is not None else ()):
                value = row.get(key)
                if value is None or isinstance(value, bool):
                    continue
                scalar(f"by_round/{key}", float(value), step=int(row["round"]))
                scalar(f"by_time/{key}", float(value), step=step_ms)
                if tokens is not None:
                    scalar(f"by_tokens/{key}", float(value), step=int(tokens))
        self._writer.flush()

    def on_train_end(self, result):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class DashboardPublisher(Callback):
    """Publish the run to the head's web dashboard (``ddlf_actors.util.dashboard``): what
    it is when it begins, each history row and event as it comes, and how it ended.

    The driver adds one to every run whose backend publishes runs
    (``Backend.publishes_runs``: DDLF's, whose head has the dashboard; not Ray's, whose
    dashboard does not take DDLF's runs). Sending never waits for the head; if it fails
    (the cluster went away) the run goes on and this stops publishing, with one warning.
    """

    def __init__(self):
        self.run_id = uuid.uuid4().hex[:10]
        self._sent = 0      # how many of run.events went out
        self._run = None
        self._off = False

    def on_train_begin(self, run):
        self._run = run
        cfg = run.config
        info = {"scheme": run.scheme, "workers": cfg.workers, "min_workers": cfg.min_workers,
                "total_rows": run.total_rows, "rows_done": run.rows_done,
                "model": getattr(run, "model", None), "dataset": getattr(run, "dataset", None),
                "driver": f"{socket.gethostname()}:{os.getpid()}"}
        self._send(info=info, events=self._new_events())

    def on_row(self, row, run):
        self._send(rows=[row], events=self._new_events())

    def on_event(self, event, run):
        self._send(events=self._new_events())

    def on_train_end(self, result):
        self._send(events=self._new_events(), status="finished" if result is not None else "failed")

    def _new_events(self) -> list:
        events = self._run.events if self._run is not None else []
        new = [dict(e) for e in events[self._sent:]]
        self._sent += len(new)
        return new

    def _send(self, **parts) -> None:
        if self._off or self._run is None:
            return
        from ddlf_actors.util import dashboard

        try:
            dashboard.publish_run(self.run_id, **parts)
        except Exception as e:   # the dashboard is for watching: never fail the run for it
            self._off = True
            log.warning("not publishing run %s to the dashboard any more: %s", self.run_id, e)
