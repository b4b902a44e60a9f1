"""OpenMP's wait policy for a PyTorch trainer with more than one thread: steps per second.

    python benchmarks/training/omp_wait_policy.py [--reps 4] [--steps 200]

Each measurement is its own process (libgomp reads ``OMP_WAIT_POLICY`` once, when it
loads): the paper CNN in PyTorch (``models.paper_cnn_torch``), batch 32, SGD 0.01, on the
first ``32 * steps`` Fashion-MNIST images, after 2 warm-up steps. Three settings,
interleaved per repetition: 1 thread; 2 threads with libgomp's default (spinning between
parallel regions); 2 threads with ``OMP_WAIT_POLICY=PASSIVE``, what DDLF's trainers use
(``apps/frameworks/threads.py``). The load average is printed beside each run: on a
shared machine the spinning threads take CPU from the threads they wait for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = ((1, None), (2, None), (2, "PASSIVE"))


def child(threads: int, steps: int) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from ddlf_actors.apps import datasets, models

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    n = 32 * steps
    (x, y), _ = datasets.load("fashion-mnist")
    x = torch.from_numpy(np.ascontiguousarray(x[:n]))
    y = torch.from_numpy(np.asarray(y[:n], np.int64))
    torch.manual_seed(0)
    model = models.paper_cnn_torch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        opt.zero_grad()
        F.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
        opt.step()

    for i in (0, 32):
        step(i)
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(0, n, 32):
        step(i)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(json.dumps({"steps_per_s": steps / wall, "cores": cpu / wall}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    results: dict = {s: [] for s in SETTINGS}
    for rep in range(args.reps):
        for threads, policy in SETTINGS:
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            env.pop("OMP_WAIT_POLICY", None)
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            load = os.getloadavg()[0]
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                   str(threads), str(args.steps)], env=env,
                                  capture_output=True, text=True, timeout=900)
            if proc.returncode:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results[(threads, policy)].append((r["steps_per_s"], r["cores"], load))
            print(f"rep {rep + 1}: {threads} thread(s) {policy or 'default':8s} "
                  f"{r['steps_per_s']:6.1f} steps/s (load {load:.1f})", file=sys.stderr)
    print("| threads | OMP_WAIT_POLICY | steps/s per rep | median | cores used | load avg |")
    print("|---|---|---|---|---|---|")
    for (threads, policy), runs in results.items():
        print(f"| {threads} | {policy or '(default: spin)'} | "
              f"{' '.join(f'{s:.1f}' for s, _, _ in runs)} | "
              f"{statistics.median(s for s, _, _ in runs):.1f} | "
              f"{statistics.median(c for _, c, _ in runs):.2f} | "
              f"{' '.join(f'{ld:.1f}' for _, _, ld in runs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
