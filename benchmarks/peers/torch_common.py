"""What every column of ``torch_compare.py`` shares, in the training processes and in the
parent: the data split, the seeded paper CNN in PyTorch, the data order, evaluation, the
timeline (training time with evaluations taken out), and the plumbing of a column's
child processes (their flags, their one JSON line back, output to files, bounded waits).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time

import numpy as np

BATCH = 32


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- data, model, evaluation (in the training processes) --------------------------------------


def load_split(split: str, limit: int | None, eval_limit: int | None):
    """``(x, y, x_eval, y_eval)``: ``val`` trains on the first 50,000 training images and
    evaluates on the last 10,000; ``test`` trains on all 60,000 and evaluates on the test
    set. ``limit``/``eval_limit`` keep the first so many of each (smoke runs)."""
    from ddlf_actors.apps import datasets

    (x, y), (xt, yt) = datasets.load("fashion-mnist")
    if split == "val":
        x, y, xt, yt = x[:50_000], y[:50_000], x[50_000:], y[50_000:]
    if limit:
        x, y = x[:limit], y[:limit]
    if eval_limit:
        xt, yt = xt[:eval_limit], yt[:eval_limit]
    return (np.ascontiguousarray(x), np.ascontiguousarray(y, dtype=np.int64),
            np.ascontiguousarray(xt), np.ascontiguousarray(yt, dtype=np.int64))


def build(seed: int):
    import torch

    from ddlf_actors.apps import models

    torch.manual_seed(seed)
    return models.paper_cnn_torch()


def order(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def evaluate(model, x, y, threads: int | None = None) -> tuple[float, float]:
    """``(loss, accuracy)`` through the adapter (eval mode, no grad); with ``threads``,
    at that many intra-op threads for the while."""
    import torch

    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return TorchAdapter(model).evaluate(x, y)   # default loss: cross-entropy
    finally:
        torch.set_num_threads(before)


class Timeline:
    """Training time with evaluations taken out, and the evaluations' results."""

    def __init__(self):
        self.train_s = 0.0
        self.rows: list = []
        self._since = time.perf_counter()

    def pause(self) -> None:
        self.train_s += time.perf_counter() - self._since

    def resume(self) -> None:
        self._since = time.perf_counter()

    def record(self, epoch: float, loss: float, acc: float, eval_s: float) -> None:
        self.rows.append({"epoch": round(epoch, 4), "train_s": self.train_s,
                          "test_loss": loss, "test_accuracy": acc, "eval_s": eval_s})
        log(f"  epoch {epoch:6.3f}  train {self.train_s:7.1f} s  acc {acc:.4f}")


def eval_marks(steps_per_epoch: int, evals: int) -> set:
    """Steps (1-based, within an epoch) after which to evaluate: ``evals`` evenly spaced,
    the epoch's end included."""
    every = max(1, math.ceil(steps_per_epoch / evals))
    return set(range(every, steps_per_epoch, every)) | {steps_per_epoch}


def sgd(params, lr: float):
    import torch

    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def split_dataset(split: str, limit: int | None, eval_limit: int | None):
    """The trainers' dataset: ``load_split``'s arrays as ``((x, y), (x_eval, y_eval))``."""
    x, y, xe, ye = load_split(split, limit, eval_limit)
    return (x, y), (xe, ye)


# -- a column's child processes -------------------------------------------------------------


def child_flags(args) -> list:
    flags = ["--seed", str(args.seed), "--lr", repr(args.lr), "--epochs", str(args.epochs),
             "--split", args.split, "--evals-per-epoch", str(args.evals_per_epoch),
             "--sync-every", str(args.sync_every), "--timeout", str(args.timeout),
             "--eval-threads", str(args.eval_threads)]
    if args.limit:
        flags += ["--limit", str(args.limit)]
    if args.eval_limit:
        flags += ["--eval-limit", str(args.eval_limit)]
    return flags


def parse_child(proc, what: str, other=None) -> dict:
    lines = [ln for ln in (proc.stdout or "").splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    errs = [p for p in (proc, other) if p is not None and p.returncode != 0] or [proc]
    tail = "; ".join((p.stderr or "").strip().splitlines()[-1][:240] if (p.stderr or "").strip()
                     else f"exit {p.returncode}, no output" for p in errs)
    return {"error": f"{what}: {tail}"}


def wait_all(procs: list, files: list, timeout: float, names: list) -> list:
    """Wait for every process (bounded by ``timeout`` in all); their outputs, read from
    the temporary files they wrote, as ``CompletedProcess``es. A process still running
    at the deadline is reported as timed out (its caller ends it: ``run_diloco``'s
    ``finally``, ``LinkHosts.end_run``)."""
    deadline = time.monotonic() + timeout
    outs = []
    for p, (fo, fe), name in zip(procs, files, names):
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
            code = p.returncode
        except subprocess.TimeoutExpired:
            code = -1
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(errors="replace"), fe.read().decode(errors="replace")
        if code != 0:   # its last words in the parent's log; the table gets the last line
            tail = err.strip().splitlines()[-15:]
            log(f"{name} exited {code}; its last lines:\n" + "\n".join("    " + ln
                                                                      for ln in tail))
            if code == -1:
                err += f"\ntimeout after {timeout:.0f} s (last: {tail[-1] if tail else '-'})"
        outs.append(subprocess.CompletedProcess(p.args, code, out, err))
    return outs


def relay_epochs(err: str) -> None:
    for line in err.splitlines():
        if line.startswith("  epoch"):
            log(line)


def start_to_files(popen, cmd: list, **kw):
    """``popen(cmd)`` with its stdout and stderr in temporary files (no pipe to drain, so
    no child blocks on a full one while another is waited on): ``(process, files)``, the
    files as :func:`wait_all` reads them."""
    fo, fe = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    return popen(cmd, stdout=fo, stderr=fe, **kw), (fo, fe)


def start_in(hosts, i: int, cmd: list, **kw):
    """``cmd`` in host i, its output in temporary files."""
    return start_to_files(lambda c, **k: hosts.popen(i, c, **k), cmd, **kw)
