"""One copy of the dataset per node: trainers' memory with the shared cache and without.

    python benchmarks/runtime/dataset_sharing.py [--dataset fashion-mnist] [--workers 2]

Starts an embedded cluster, creates ``--workers`` trainers (a numpy model, so only the
dataset's memory shows) that map the dataset through ``datasets.load_shared``, has each
read every page, and reports each trainer's USS (pages only it maps) and RSS. Then the
same trainers replace the mapping with a private copy (what loading the dataset in each
trainer would give) and are measured again. Both rows come from the same processes.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import ddlf_actors as ddlf
from ddlf_actors.apps import TrainerActor, datasets

MB = 2**20


class _Model:
    def get_weights(self):
        return [np.zeros(1, np.float32)]

    def set_weights(self, weights):
        pass


def _model():
    return _Model()


class MemoryProbe(TrainerActor):
    """A trainer that only holds data: no framework, so its memory is the dataset's."""

    def configure_threads(self, n):
        pass

    def memory(self, private: bool = False) -> dict:
        import psutil

        if private:
            self.x, self.x_test = np.array(self.x), np.array(self.x_test)
        checksum = float(self.x.sum(dtype=np.float64)) + float(self.x_test.sum(dtype=np.float64))
        mem = psutil.Process(os.getpid()).memory_full_info()
        return {"uss": mem.uss, "rss": mem.rss, "checksum": checksum}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    datasets.ensure(args.dataset)
    (x, _), (xt, _) = datasets.load(args.dataset)
    data_mb = (x.nbytes + xt.nbytes) / MB
    ddlf.init(num_cpus=args.workers)
    try:
        cls = ddlf.remote(num_cpus=1)(MemoryProbe)
        trainers = [cls.remote(_model, args.dataset, j) for j in range(args.workers)]
        # A mapped page counts as one trainer's own until the other has read it too:
        # read everything everywhere first, then measure.
        ddlf.get([t.memory.remote() for t in trainers])
        shared = ddlf.get([t.memory.remote() for t in trainers])
        ddlf.get([t.memory.remote(True) for t in trainers])
        private = ddlf.get([t.memory.remote() for t in trainers])
    finally:
        ddlf.shutdown()
    print(f"{args.dataset}: {data_mb:.0f} MB of float32 arrays, {args.workers} trainers on "
          "one node")
    print(f"{'how trainers hold it':<28} | {'USS per trainer (MB)':>22} | {'sum of USS':>10} | "
          f"{'RSS per trainer (MB)':>22}")
    for label, rows in (("load_shared (memory map)", shared), ("private copy each", private)):
        uss = ", ".join(f"{r['uss'] / MB:.0f}" for r in rows)
        rss = ", ".join(f"{r['rss'] / MB:.0f}" for r in rows)
        print(f"{label:<28} | {uss:>22} | {sum(r['uss'] for r in rows) / MB:>10.0f} | "
              f"{rss:>22}")
    saved = (sum(r["uss"] for r in private) - sum(r["uss"] for r in shared)) / MB
    print(f"private copies cost {saved:.0f} MB more USS in all "
          f"({saved / data_mb:.2f}x the dataset)")


if __name__ == "__main__":
    main()
