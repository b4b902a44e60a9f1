"""Tokens per second of the GPT (``gpt_tiny`` in Keras on TensorFlow, ``gpt_tiny_torch``)
on this machine's CPU: which framework a language model trains on by default.

    python benchmarks/training/lm_frameworks.py [--frameworks torch,keras] [--threads 1,2]
                                                [--size tiny] [--context 128] [--batch 32]
                                                [--steps 60] [--reps 3]

One process per measurement (thread pools are fixed at first use; TensorFlow and torch
in one process would share the cores), started by this script with ``--child``; the
measurements are interleaved (repetition 1 of every framework and thread count, then
repetition 2 ...) and the load average is printed beside each.

What each child does:

1. Sets ``n`` intra-op threads and one inter-op thread the way a DDLF trainer does
   (``frameworks.threads.limit_threads``: with n > 1, OpenMP's ``PASSIVE`` wait, and
   ``FrameworkAdapter.configure_threads``), before building the model.
2. Builds the model with ``lm.GptModelFn`` (the defaults: AdamW, warm-up and cosine
   decay, clipping), windows of ``--context`` tokens from the fortunes corpus when this
   machine has it (else random ids: the speed is the same), and trains 3 warm-up
   steps (TensorFlow's tracing) outside the timing.
3. Times ``--steps`` steps of ``--batch`` windows through the framework adapter's
   ``fit``: what a trainer runs each round (Keras: one compiled loop over the batches,
   ``keras_steps``; PyTorch: the adapter's loop).

Prints one table: median tokens/s and range over repetitions, each framework's ratio to
PyTorch at the same threads, tokens per CPU second received (on a shared machine the
wall-clock rate is also the other jobs' doing; this is the framework's own), CPU cores
used, start-up. ``--from JSON`` prints the table of an earlier ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(args) -> None:
    t0 = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from ddlf_actors.apps.frameworks.threads import limit_threads

    # As a trainer does before any framework loads: n threads, OpenMP's passive wait.
    limit_threads(args.n)
    import numpy as np

    from ddlf_actors.apps import datasets, frameworks, lm, tf_startup
    from ddlf_actors.apps.frameworks.keras import KerasAdapter
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    adapter_cls = TorchAdapter if args.framework == "torch" else KerasAdapter
    adapter_cls.configure_threads(args.n)   # TensorFlow imported quietly in there
    steps, batch, context = args.steps, args.batch, args.context
    need = (steps + 3) * batch
    try:
        ds = datasets.corpus("fortunes", context=context).prepare()
        (x, y), _ = ds.load_shared()
        idx = np.random.default_rng(0).permutation(len(x))[:need]
        xs, ys, source = x[idx], y[idx], "fortunes"
    except (FileNotFoundError, OSError, ValueError):
        rng = np.random.default_rng(0)
        xs = rng.integers(0, 256, (need, context)).astype(np.int32)
        ys = np.roll(xs, -1, axis=1)
        source = "random ids"
    fn = lm.GptModelFn(vocab_size=256, context=context, framework=args.framework,
                       size=args.size, total_steps=10 * need)
    with tf_startup.quiet_startup():
        model = fn()
    adapter = frameworks.for_model(model)(model, {})
    adapter.fit(xs[:3 * batch], ys[:3 * batch], 1, batch)   # tracing, outside the timing
    startup = time.perf_counter() - t0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    loss = adapter.fit(xs[3 * batch:], ys[3 * batch:], 1, batch)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    params = sum(int(np.prod(w.shape)) for w in adapter.get_weights())
    print(json.dumps({"framework": args.framework, "threads": args.n,
                      "tokens_per_s": steps * batch * context / wall, "step_s": wall / steps,
                      "cores": cpu / wall if wall else 0.0, "startup_s": startup,
                      "loss": float(loss), "params": params, "source": source,
                      "loadavg": os.getloadavg()[0]}), flush=True)


def run_one(framework: str, n: int, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--framework", framework,
           "--n", str(n), "--size", args.size, "--context", str(args.context),
           "--batch", str(args.batch), "--steps", str(args.steps)]
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"framework": framework, "threads": n, "error": "timeout", "loadavg": load}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"framework": framework, "threads": n, "error": tail[:200], "loadavg": load}
    return json.loads(lines[-1])


def format_table(results: list) -> str:
    rows = ["| framework | threads | tokens/s (median) | range | vs torch | tokens per CPU s | "
            "vs torch | s/step | cores | start-up s | params | data | load avg per rep |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in results:
        groups.setdefault((r["framework"], r["threads"]), []).append(r)
    med = {k: statistics.median(r["tokens_per_s"] for r in v if "tokens_per_s" in r)
           for k, v in groups.items() if any("tokens_per_s" in r for r in v)}
    # Per CPU second received: on a shared machine the wall-clock rate is also the other
    # jobs' doing; the CPU each process got is measured, so this is the framework's own.
    per_cpu = {k: statistics.median(r["tokens_per_s"] / r["cores"] for r in v
                                    if r.get("cores"))
               for k, v in groups.items() if any(r.get("cores") for r in v)}
    for (fw, n), runs in groups.items():
        ok = [r for r in runs if "tokens_per_s" in r]
        loads = " ".join(f"{r['loadavg']:.1f}" for r in runs)
        if not ok:
            rows.append(f"| {fw} | {n} | error: {runs[0].get('error')} | | | | | | | | | | "
                        f"{loads} |")
            continue
        base = med.get(("torch", n))
        ratio = f"{med[(fw, n)] / base:.2f}x" if base else "-"
        cpu_base = per_cpu.get(("torch", n))
        cpu_ratio = f"{per_cpu[(fw, n)] / cpu_base:.2f}x" if cpu_base else "-"
        rows.append(
            f"| {fw} | {n} | {med[(fw, n)]:,.0f} | {min(r['tokens_per_s'] for r in ok):,.0f}-"
            f"{max(r['tokens_per_s'] for r in ok):,.0f} | {ratio} | "
            f"{per_cpu[(fw, n)]:,.0f} | {cpu_ratio} | "
            f"{statistics.median(r['step_s'] for r in ok):.3f} | "
            f"{statistics.median(r['cores'] for r in ok):.2f} | "
            f"{statistics.median(r['startup_s'] for r in ok):.1f} | "
            f"{ok[0]['params']:,} | {ok[0]['source']} | {loads} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frameworks", default="torch,keras")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--size", default="tiny")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=60, help="timed steps per measurement")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", help="also write every measurement here")
    p.add_argument("--from", dest="from_file", help="print the table of a --json file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--framework", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.from_file:
        with open(args.from_file) as f:
            print(format_table(json.load(f)))
        return 0
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    threads = [int(t) for t in args.threads.split(",")]
    results = []
    for rep in range(args.reps):
        for n in threads:
            for fw in frameworks:
                r = run_one(fw, n, args)
                r["rep"] = rep
                results.append(r)
                shown = f"{r['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in r \
                    else r.get("error")
                print(f"rep {rep + 1}: {fw} {n} thread(s): {shown}", file=sys.stderr,
                      flush=True)
    print(f"GPT {args.size}, context {args.context}, batch {args.batch}, {args.steps} steps "
          f"per measurement, {args.reps} reps interleaved")
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
