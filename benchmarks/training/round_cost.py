"""What an allreduce round costs a trainer besides its steps: CPU per round per trainer.

    python benchmarks/training/round_cost.py                        # this checkout
    python benchmarks/training/round_cost.py --old /path/to/old/venv/bin/python --pairs 3

K trainers with ``wide_cnn``'s weights (8 arrays, 5.1 M float32 parameters, 20.4 MB)
run ``train(..., "allreduce", workers=K)`` with the defaults' outer step (rate 0.7,
Nesterov 0.8) and each codec, on the in-process fake backend
(``apps/backends/fake.py``: actors on threads; a call's arguments, the ring's chunks
among them, are handed over without the pickling and socket copies of a real runtime,
which are not counted here). Each round is one step that costs next to nothing (it moves the
weights by a constant), so what the process spends is the round's own work on the whole
model: the delta, the copies of the weights in and out, the ring's chunks and codec, the
outer step and the digest. Measured as the process CPU of a run of ``--long`` rounds
minus one of ``--short`` (start-up cancels), divided by the extra rounds and by K.

On a trainer node of half a CPU, each millisecond here is two of the round's wall time:
at K = 4 and 1 Gbit/s a ``wide_cnn`` round of 16 steps takes about 1.7 s of steps
(docs/benchmarks/emulation.md). With ``--old``, each measurement runs alternately on the
old checkout's interpreter and this one (each must import its own checkout: a venv with
``pip install -e OLD --no-deps``; run from outside either checkout), and the table gives
the new/old ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

_CHILD = r'''
import json, os, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, sys.argv[1])                # the test helpers (numpy trainer)
k, rounds, codec = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import numpy as np
from helpers_modules.numpy_trainer import NumpyTrainer, SoftmaxModel
from ddlf_actors.apps import train
from ddlf_actors.apps.backends.fake import FakeBackend

SHAPES = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (7744, 656), (656,), (656, 10), (10,)]

class WideModel(SoftmaxModel):
    """wide_cnn's arrays; a step moves them by a constant (no real compute)."""
    def __init__(self):
        rng = np.random.default_rng(0)
        self.w = [rng.normal(0, 0.05, s).astype(np.float32) for s in SHAPES]
        self.lr = 1e-3
    def probs(self, x):
        return np.full((len(x), 10), 0.1, np.float32)
    def step(self, x, y):
        for a in self.w:
            a -= np.float32(self.lr)

def data():
    x = np.zeros((k * 32, 4), np.float32)
    y = np.zeros(k * 32, np.int64)
    return (x, y), (x[:8], y[:8])

opts = dict(workers=k, master_epochs=rounds, batch_size=32, rounds_per_epoch=1,
            outer_lr=0.7, outer_momentum=0.8, nesterov=True, eval_every=10**6, seed=0,
            progress=False, trainer_cls=NumpyTrainer, backend=FakeBackend())
if codec != "none":
    opts["compression"] = codec
t0 = time.process_time()
r = train(WideModel, data, "allreduce", **opts)
print("RESULT " + json.dumps({"cpu_s": time.process_time() - t0, "rounds": len(r.history)}))
'''


def measure(python: str, k: int, rounds: int, codec: str) -> float:
    """Process CPU seconds of one run of ``rounds`` rounds (a fresh process)."""
    p = subprocess.run([python, "-c", _CHILD, os.path.join(ROOT, "tests"), str(k),
                        str(rounds), codec], stdout=subprocess.PIPE, text=True, cwd="/",
                       timeout=900, check=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    if out["rounds"] != rounds:
        raise RuntimeError(f"{out['rounds']} rounds ran, {rounds} asked")
    return out["cpu_s"]


def per_round_ms(python: str, k: int, codec: str, short: int, long: int) -> float:
    """CPU milliseconds per round per trainer: (long run − short run) / extra rounds / K."""
    extra = measure(python, k, long, codec) - measure(python, k, short, codec)
    return 1000 * extra / (long - short) / k


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--codecs", default="none,fp16,int8:ef")
    p.add_argument("--short", type=int, default=3)
    p.add_argument("--long", type=int, default=23)
    p.add_argument("--pairs", type=int, default=3, help="measurements per interpreter")
    p.add_argument("--old", help="the old checkout's interpreter (omit: this one only)")
    a = p.parse_args(argv)
    pythons = {"new": sys.executable}
    if a.old:
        pythons = {"old": a.old, "new": sys.executable}
    print(f"K = {a.k}, wide_cnn's weights (20.4 MB), rounds {a.long} − {a.short}; "
          "ms of CPU per round per trainer, medians over "
          f"{a.pairs} (runs alternate {' and '.join(pythons)})", flush=True)
    head = "| codec | " + " | ".join(pythons) + (" | new/old |" if a.old else " |")
    lines = [head, "|---|" + "---:|" * (len(pythons) + (1 if a.old else 0))]
    for codec in a.codecs.split(","):
        got: dict = {name: [] for name in pythons}
        for _ in range(a.pairs):
            for name, py in pythons.items():
                got[name].append(per_round_ms(py, a.k, codec, a.short, a.long))
        med = {name: statistics.median(v) for name, v in got.items()}
        cells = [f"{med[n]:.1f} [{min(got[n]):.1f}–{max(got[n]):.1f}]" for n in pythons]
        ratio = [f"{med['new'] / med['old']:.2f}"] if a.old else []
        lines.append(f"| {codec} | " + " | ".join(cells + ratio) + " |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
