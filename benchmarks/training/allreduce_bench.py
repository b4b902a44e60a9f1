"""Driver bytes and round time per round: ``sync`` against ``allreduce``, K = 2, 4, 8.

    python benchmarks/training/allreduce_bench.py                      # K = 2, 4, 8, tiny model
    python benchmarks/training/allreduce_bench.py --ks 2,4 --features 4096 --classes 10 --repeats 5

For each K, one embedded cluster with K numpy trainers (softmax regression,
``tests/helpers_modules/numpy_trainer.py``; ``num_cpus = 2 / K`` each, so 8 trainers fit
this 2-core machine), started once; both schemes run on the same trainers, alternately,
``--repeats`` times, and the table reports medians. Columns:

- **driver wire B/round**: the bytes through the driver's sockets per round, frame headers
  and control messages included (``tests/helpers_modules/wire_meter.py``), measured as
  what ``--long − --short`` more rounds add to a run, so start-up and the final fetch
  cancel out. ``DDLF_SHM=0`` is set, so nothing bypasses the sockets;
- **payload B/round**: the arrays the driver ships per round (the history's
  ``bytes_sent + bytes_received``: weights, deltas, indices);
- **round ms**: the median ``wall_s`` of the longer run's rounds after the first;
- **ring ms / ring B/trainer**: allreduce only, the collective's time and the bytes each
  trainer sent its neighbour in it (``2 (K − 1) / K`` of the model; it receives as much).

On one host the ring's 2 (K − 1) sequential hops cost latency and no bandwidth is saved
(every link is loopback); the bytes are what a real network carries. Import
:func:`measure` to run the same measurement elsewhere (e.g. on an emulated cluster with
real link limits).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, os.path.join(ROOT, "tests")):   # a source checkout, and the test helpers
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers_modules.numpy_trainer import NumpyTrainer, blobs, softmax_model_fn  # noqa: E402
from helpers_modules.wire_meter import metering  # noqa: E402

import ddlf_actors as ddlf  # noqa: E402
from ddlf_actors.apps import TrainConfig, train_sync  # noqa: E402
from ddlf_actors.apps.schemes import train_allreduce  # noqa: E402
from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers  # noqa: E402

__all__ = ["SCHEMES", "measure", "Workload", "run"]

SCHEMES = {"sync": train_sync, "allreduce": train_allreduce}


class Workload:
    """A softmax model of ``features × classes`` on ``samples`` training rows (picklable:
    trainers build the model and the data from it)."""

    def __init__(self, features: int = 256, classes: int = 10, samples: int = 8000):
        side = int(round(features ** 0.5))
        if side * side != features:
            raise ValueError(f"features must be a square (images are side × side), got {features}")
        self.features, self.classes, self.samples, self.side = features, classes, samples, side
        self.model_fn = softmax_model_fn(features, classes)

    def dataset(self):
        return blobs(n_train=self.samples, n_test=200, num_classes=self.classes, side=self.side)

    @property
    def model_bytes(self) -> int:
        return (self.features * self.classes + self.classes) * 4


def measure(scheme: str, trainers, workload: Workload, short: int = 2, long: int = 6,
            **options) -> dict:
    """Run ``scheme`` on ``trainers`` for ``short`` and then ``long`` rounds; return the
    driver's wire and payload bytes per round, the median round time and, for allreduce,
    the collective's time and bytes. ``options`` go to the training function."""
    train = SCHEMES[scheme]
    options.setdefault("rounds_per_epoch", 1)   # a round per epoch: rounds = epochs here
    totals, result = {}, None
    for rounds in (short, long):
        with metering() as meter:
            result = train(workload.model_fn, workload.dataset, trainers=trainers,
                           master_epochs=rounds, trainer_cls=NumpyTrainer, progress=False,
                           **options)
        totals[rounds] = meter.total
    rows = result.history[1:]
    return {
        "scheme": scheme, "k": len(trainers),
        "wire": (totals[long] - totals[short]) / (long - short),
        "payload": statistics.median(r["bytes_sent"] + r["bytes_received"] for r in rows),
        "round_s": statistics.median(r["wall_s"] for r in rows),
        "ring_s": statistics.median(r.get("collective_s", 0.0) for r in rows),
        "ring_bytes": statistics.median(r.get("ring_bytes", 0) for r in rows),
    }


def run(ks, workload: Workload, repeats: int, short: int, long: int) -> list[dict]:
    """For each K: an embedded cluster, K trainers, both schemes ``repeats`` times each
    (alternating); medians per scheme and K."""
    out = []
    cpus = os.cpu_count() or 2
    for k in ks:
        ddlf.init(num_cpus=cpus)
        try:
            trainers = start_trainers(workload.model_fn, workload.dataset, TrainConfig(
                workers=k, num_cpus=cpus / k, trainer_cls=NumpyTrainer))
            try:
                runs: dict = {s: [] for s in SCHEMES}
                for _ in range(repeats):
                    for scheme in SCHEMES:
                        runs[scheme].append(measure(scheme, trainers, workload, short, long))
                for scheme, got in runs.items():
                    row = {key: statistics.median(g[key] for g in got)
                           for key in ("wire", "payload", "round_s", "ring_s", "ring_bytes")}
                    out.append({"scheme": scheme, "k": k, **row})
                    print(f"K={k} {scheme}: done ({repeats} runs)", file=sys.stderr)
            finally:
                stop_trainers(trainers)
        finally:
            ddlf.shutdown()
    return out


def table(rows: list[dict], workload: Workload, load: str = "") -> str:
    lines = [f"numpy softmax {workload.features}x{workload.classes} "
             f"({workload.model_bytes:,} B of weights), {workload.samples:,} samples per round "
             f"({workload.samples * 4:,} B of indices), {os.cpu_count()} CPUs; medians{load}",
             f"{'K':>2} {'scheme':<10} {'driver wire B/round':>20} {'payload B/round':>16} "
             f"{'round ms':>9} {'ring ms':>8} {'ring B/trainer':>15}"]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        ring = r["scheme"] == "allreduce"
        lines.append(f"{r['k']:>2} {r['scheme']:<10} {r['wire']:>20,.0f} {r['payload']:>16,.0f} "
                     f"{r['round_s'] * 1e3:>9.1f} "
                     f"{(r['ring_s'] * 1e3 if ring else 0):>8.1f} "
                     f"{(r['ring_bytes'] / r['k'] if ring else 0):>15,.0f}")
    by = {(r["scheme"], r["k"]): r for r in rows}
    ks = sorted({r["k"] for r in rows})
    for k in ks:
        a, s = by[("allreduce", k)], by[("sync", k)]
        lines.append(f"K={k}: allreduce/sync driver wire {a['wire'] / s['wire']:.2f}x, "
                     f"round time {a['round_s'] / s['round_s']:.2f}x")
    wires = [by[("allreduce", k)]["wire"] for k in ks]
    lines.append(f"allreduce driver wire across K: max/min {max(wires) / min(wires):.3f} "
                 "(target: within 10 %)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="2,4,8", help="trainer counts, comma-separated")
    ap.add_argument("--features", type=int, default=256, help="a square: images are side x side")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--samples", type=int, default=8000, help="training rows: one epoch = one round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--short", type=int, default=2, help="rounds of the shorter run")
    ap.add_argument("--long", type=int, default=6, help="rounds of the longer run")
    a = ap.parse_args(argv)
    os.environ["DDLF_SHM"] = "0"   # every byte through a socket, where the meter sees it
    workload = Workload(a.features, a.classes, a.samples)
    t0 = time.perf_counter()
    before = os.getloadavg()[0]
    rows = run([int(k) for k in a.ks.split(",")], workload, a.repeats, a.short, a.long)
    # Round times on a shared machine depend on what else runs: say how busy it was.
    load = f"; load average {before:.1f} before, {os.getloadavg()[0]:.1f} after"
    print(table(rows, workload, load))
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
