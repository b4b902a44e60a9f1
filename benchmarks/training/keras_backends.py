"""Seconds per epoch of the paper CNN on Fashion-MNIST with Keras 3 on each backend.

    python benchmarks/training/keras_backends.py [--backends tensorflow,jax,torch] [--threads 1,2]
                                        [--loops adapter,fit] [--reps 3] [--limit 60000]

One process per measurement (``KERAS_BACKEND`` has to be set before keras is first
imported, and thread pools are fixed at first use), started by this script with
``--child``; the measurements are interleaved: repetition 1 of every (backend, threads,
loop), then repetition 2, ... The load average is printed beside each, so a change of
load shows up as spread.

What each child does, in this order:

1. Sets the threads before anything imports its framework. ``tensorflow``:
   ``TF_NUM_INTRAOP_THREADS=n``, one inter-op thread (``tf.config.threading`` too), as
   DDLF's trainers do. ``torch``: ``torch.set_num_threads(n)`` and one inter-op thread.
   ``jax``: XLA has no "n threads" setting for the CPU; with n = 1,
   ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``; with
   n > 1 the process is pinned to n CPUs (``sched_setaffinity``; XLA sizes its pool from
   the CPUs it may use), which on a 2-core machine is every core. The ``cores`` column
   (CPU seconds / wall seconds of the timed epoch) shows what each really used.
2. Loads Fashion-MNIST (``datasets.load``), builds ``models.paper_cnn()`` (SGD 0.01,
   batch 32) after ``keras.utils.set_random_seed(0)``, and runs 2 warm-up steps (tracing,
   jit compilation): the ``startup`` column, from the process start.
3. Trains one epoch over the first ``--limit`` training images, in order:
   ``adapter`` is DDLF's ``KerasAdapter.fit`` (one ``train_on_batch`` per batch, what the
   trainers run); ``fit`` is ``model.fit(..., epochs=1, shuffle=False)`` (Keras' compiled
   loop, what a single process runs). Seconds per epoch are scaled to 60,000 images when
   ``--limit`` is smaller (marked ``*``).
4. Evaluates on the test set (not timed) as a check that every backend learns alike.

Prints one table: median seconds per epoch and range over the repetitions, each backend's
ratio to TensorFlow at the same threads and loop, cores used, start-up, test accuracy,
the load average at each repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

FULL_EPOCH = 60_000
BATCH = 32


# -- the child: one measurement ---------------------------------------------------------------


def _set_threads(backend: str, n: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(n)
    if backend == "tensorflow":
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(n)
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    elif backend == "jax":
        if n == 1:
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_"
                                       "eigen=false intra_op_parallelism_threads=1").strip()
        cpus = sorted(os.sched_getaffinity(0))
        if n < len(cpus):
            os.sched_setaffinity(0, cpus[:n])


def _configure_after_import(backend: str, n: int) -> None:
    if backend == "tensorflow":
        from ddlf_actors.apps.frameworks.keras import KerasAdapter

        KerasAdapter.configure_threads(n)
    elif backend == "torch":
        from ddlf_actors.apps.frameworks.torch import TorchAdapter

        TorchAdapter.configure_threads(n)


def child(args) -> None:
    t0 = time.perf_counter()
    backend, n = args.backend, args.n
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _set_threads(backend, n)
    import numpy as np

    from ddlf_actors.apps import datasets, models, tf_startup

    (x, y), (x_test, y_test) = datasets.load("fashion-mnist")
    x, y = np.ascontiguousarray(x[:args.limit]), np.ascontiguousarray(y[:args.limit])
    with tf_startup.quiet_startup():   # keras on TF imports TF: keep its start-up quiet
        import keras
    _configure_after_import(backend, n)
    assert keras.backend.backend() == backend, keras.backend.backend()
    # keras.utils.set_random_seed imports TensorFlow whenever it is installed, on every
    # backend (to seed TF too): quietly, and it counts in the start-up.
    with tf_startup.quiet_startup():
        keras.utils.set_random_seed(0)
    model = models.paper_cnn()
    from ddlf_actors.apps.frameworks.keras import KerasAdapter

    adapter = KerasAdapter(model)
    # Warm-up on a copy of the weights: tracing / jit compilation, outside the timing.
    w0 = adapter.get_weights()
    if args.loop == "adapter":
        adapter.fit(x[:2 * BATCH], y[:2 * BATCH], 1, BATCH)
    else:
        model.fit(x[:2 * BATCH], y[:2 * BATCH], batch_size=BATCH, epochs=1, shuffle=False,
                  verbose=0)
    adapter.set_weights(w0)
    startup = time.perf_counter() - t0

    cpu0, wall0 = time.process_time(), time.perf_counter()
    if args.loop == "adapter":
        loss = adapter.fit(x, y, 1, BATCH)
    else:
        hist = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        loss = float(hist.history["loss"][-1])
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    _, acc = adapter.evaluate(x_test, y_test)
    print(json.dumps({
        "backend": backend, "threads": n, "loop": args.loop, "samples": int(len(x)),
        "epoch_s": wall * FULL_EPOCH / len(x), "cores": cpu / wall if wall else 0.0,
        "startup_s": startup, "train_loss": float(loss), "test_accuracy": float(acc),
        "imports": sorted(m for m in ("tensorflow", "jax", "torch") if m in sys.modules),
        "loadavg": os.getloadavg()[0]}), flush=True)


# -- the parent: interleave, collect, print ---------------------------------------------------


def run_one(backend: str, n: int, loop: str, limit: int, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--backend", backend,
           "--n", str(n), "--loop", loop, "--limit", str(limit)]
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"backend": backend, "threads": n, "loop": loop, "error": "timeout",
                "loadavg": load}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"backend": backend, "threads": n, "loop": loop, "error": tail[:200],
                "loadavg": load}
    return json.loads(lines[-1])


def _available(backend: str) -> str | None:
    import importlib.util

    module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[backend]
    return None if importlib.util.find_spec(module) else f"{module} is not installed"


def format_table(results: list, limit: int) -> str:
    scaled = "*" if limit < FULL_EPOCH else ""
    rows = ["| backend | threads | loop | s/epoch" + scaled + " (median) | range | vs TF | "
            "cores | start-up s | test acc | load avg per rep | imports |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in results:
        groups.setdefault((r["backend"], r["threads"], r["loop"]), []).append(r)
    medians = {k: statistics.median(r["epoch_s"] for r in v if "epoch_s" in r)
               for k, v in groups.items() if any("epoch_s" in r for r in v)}
    for (backend, n, loop), runs in groups.items():
        ok = [r for r in runs if "epoch_s" in r]
        loads = " ".join(f"{r['loadavg']:.1f}" for r in runs)
        if not ok:
            rows.append(f"| {backend} | {n} | {loop} | error: {runs[0].get('error')} | | | | | | "
                        f"{loads} | |")
            continue
        med = medians[(backend, n, loop)]
        tf = medians.get(("tensorflow", n, loop))
        ratio = f"{med / tf:.2f}x" if tf else "-"
        rows.append(
            f"| {backend} | {n} | {loop} | {med:.1f} | {min(r['epoch_s'] for r in ok):.1f}-"
            f"{max(r['epoch_s'] for r in ok):.1f} | {ratio} | "
            f"{statistics.median(r['cores'] for r in ok):.2f} | "
            f"{statistics.median(r['startup_s'] for r in ok):.1f} | "
            f"{statistics.median(r['test_accuracy'] for r in ok):.4f} | {loads} | "
            f"{','.join(ok[0]['imports'])} |")
    note = (f"\n* seconds for {limit:,} images scaled to a 60,000-image epoch" if scaled else "")
    return "\n".join(rows) + note


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="tensorflow,jax,torch")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--loops", default="adapter,fit")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--limit", type=int, default=FULL_EPOCH, help="training images per epoch")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    p.add_argument("--json", help="also write every measurement here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--loop", default="adapter", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    backends = [b for b in args.backends.split(",") if b]
    threads = [int(t) for t in args.threads.split(",") if t]
    loops = [lp for lp in args.loops.split(",") if lp]
    results = []
    for b in backends:
        why = _available(b)
        if why:
            print(f"{b}: unavailable: {why}", file=sys.stderr)
    backends = [b for b in backends if not _available(b)]
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
    for rep in range(args.reps):
        for n in threads:
            for loop in loops:
                for b in backends:
                    r = run_one(b, n, loop, args.limit, args.timeout)
                    r["rep"] = rep
                    results.append(r)
                    what = (f"{r['epoch_s']:.1f} s/epoch, {r['cores']:.2f} cores"
                            if "epoch_s" in r else r.get("error"))
                    print(f"rep {rep + 1}: {b:10s} {n} thread(s) {loop:7s} {what} "
                          f"(load {r['loadavg']:.1f})", file=sys.stderr, flush=True)
    print(format_table(results, args.limit))
    print(f"\nload average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
