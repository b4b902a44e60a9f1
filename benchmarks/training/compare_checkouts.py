"""The same seeded training run on two checkouts of DDLF, alternated: does a change move
speed or results?

    python benchmarks/training/compare_checkouts.py --old /path/to/old/venv/bin/python \\
        [--new python] [--pairs 3] [--scheme sync] [--epochs 2] [--model paper_cnn|numpy]

Each interpreter must import its own checkout's ``ddlf_actors`` (a venv with
``pip install -e OLD_CHECKOUT --no-deps``). The runs alternate old, new, old, new ... so a
change in the machine's load shows up as spread in both columns, not as a ratio. Each
run is a fresh process: an embedded cluster, ``train(model_fn, "fashion-mnist",
scheme, workers=2, master_epochs=E, seed=0)`` with the model's initial weights fixed by
``keras.utils.set_random_seed(0)``, no options (each checkout's defaults).

Printed per run: seconds per epoch (history ``time_s`` of the last row, which counts from
when training starts; evaluation time excluded as ``eval_s``), test accuracy after the
last epoch, and a CRC of the final weights; then medians and the new/old ratio of seconds per epoch,
and whether the two checkouts' final weights are bit-equal (a seeded sync run is
deterministic on both).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_CHILD = r'''
import json, os, sys, time, zlib
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import ddlf_actors as ddlf
from ddlf_actors.apps import train

scheme, epochs, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class SeededCNN:
    def __call__(self):
        import keras
        from ddlf_actors.apps import models
        keras.utils.set_random_seed(0)
        return models.paper_cnn()

ddlf.init(num_cpus=2)
t0 = time.perf_counter()
try:
    r = train(SeededCNN(), "fashion-mnist", scheme, workers=2, master_epochs=epochs, seed=0,
              progress=False)
finally:
    ddlf.shutdown()
h = r.history
evals = sum(row.get("eval_s") or 0.0 for row in h)
# Rows' time_s starts when training does (8562c90): the start-up is not in it to take out.
train_s = h[-1]["time_s"] - evals
crc = 0
for w in r.weights:
    crc = zlib.crc32(np.ascontiguousarray(w).tobytes(), crc)
print("RESULT " + json.dumps({"train_s": train_s, "epochs": h[-1]["epoch"],
                              "accuracy": [row["test_accuracy"] for row in h
                                           if row.get("test_accuracy") is not None][-1],
                              "crc": crc, "wall_s": time.perf_counter() - t0}))
'''


def _run(python: str, args) -> dict:
    t = time.time()
    out = subprocess.run([python, "-c", _CHILD, args.scheme, str(args.epochs), args.model],
                         capture_output=True, text=True, timeout=args.timeout,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["load"] = os.getloadavg()[0]
            return result
    raise RuntimeError(f"{python} failed after {time.time() - t:.0f} s:\n{out.stderr[-3000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the baseline checkout's python")
    p.add_argument("--new", default=sys.executable, help="the changed checkout's python")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--scheme", default="sync")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--model", default="paper_cnn", choices=("paper_cnn",))
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    runs: dict = {"old": [], "new": []}
    print(f"{'run':>4} {'checkout':>8} {'s/epoch':>8} {'acc':>7} {'crc':>10} {'load':>5}")
    for i in range(args.pairs):
        for name in ("old", "new"):
            r = _run(getattr(args, name), args)
            r["s_per_epoch"] = r["train_s"] / r["epochs"]
            runs[name].append(r)
            print(f"{i + 1:>4} {name:>8} {r['s_per_epoch']:8.1f} {r['accuracy']:7.4f} "
                  f"{r['crc']:10x} {r['load']:5.1f}", flush=True)
    med = {k: statistics.median(r["s_per_epoch"] for r in v) for k, v in runs.items()}
    rng = {k: (min(r["s_per_epoch"] for r in v), max(r["s_per_epoch"] for r in v))
           for k, v in runs.items()}
    print(f"\nseconds per epoch, median [range]: old {med['old']:.1f} "
          f"[{rng['old'][0]:.1f}-{rng['old'][1]:.1f}], new {med['new']:.1f} "
          f"[{rng['new'][0]:.1f}-{rng['new'][1]:.1f}]; new/old {med['new'] / med['old']:.2f}x")
    same = {r["crc"] for r in runs["old"]} == {r["crc"] for r in runs["new"]} and \
        len({r["crc"] for r in runs["old"]}) == 1
    print(f"final weights: {'bit-equal on both checkouts' if same else 'DIFFERENT'} "
          f"(CRCs old {sorted({r['crc'] for r in runs['old']})}, "
          f"new {sorted({r['crc'] for r in runs['new']})})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
