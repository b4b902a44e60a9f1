"""Where DDLF-torch's Algorithm 6 loses time against one 1-thread process (issue 24's
target: seconds per epoch ≤ 1.05× half of ``torch_compare.py``'s ``torch-1p-1t``).

    python benchmarks/peers/torch_alg6_gap.py [--reps 3] [--limit N]

The paper CNN in PyTorch, SGD momentum 0.9, batch 32, one epoch of the validation split's
50,000 training images (each of 2 trainers trains 25,000), 1 thread per process. The
columns peel the difference apart, one cause at a time, each run in its own process,
repetitions interleaved:

alone           one process trains half the epoch with ``torch_compare``'s loop (a
                permuted index, a gather per batch): the target's baseline.
alone-adapter   the same half through ``TorchAdapter.fit`` after the trainer's own gather
                (``x[sorted indices]``, then the permutation): DDLF's training loop
                without the cluster.
pair            two ``alone`` processes at once, each on its own half, started together
                (no communication at all): what 2 processes on this machine's 2 cores
                cost each other (caches, memory bandwidth, the hypervisor). Reported: the
                slower of the two, as an epoch ends when both halves have.
ddlf-alg6       ``train_sync`` with the paper's Algorithm 6 (one plain average per epoch)
                on an embedded cluster of 2 trainers: the round's wall time minus its
                evaluation (``torch_compare``'s clock), and the busier trainer's
                ``compute_s`` (its train call: set weights, gather, fit, get weights).

Ratios are to ``alone``. ``pair / alone`` is the part no framework can remove on this
machine; ``ddlf-alg6 / pair`` is DDLF's own.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")   # before numpy and torch load

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)
from benchmarks.peers import torch_common as tc  # noqa: E402
from benchmarks.peers.torch_compare import ALG6  # noqa: E402

COLUMNS = ("alone", "alone-adapter", "pair", "ddlf-alg6")
LR = 0.03


def _half(args, part: int):
    """Trainer ``part``'s half of the training split (its rows, in the epoch's order)."""
    x, y, _, _ = tc.load_split("val", args.limit, 1)
    perm = tc.order(args.seed, 0, len(x))
    mine = perm[part::2]
    return x, y, mine


def child(args) -> None:
    """One process: load, say READY, wait for GO on stdin, train, print the seconds."""
    import torch
    import torch.nn.functional as F

    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    TorchAdapter.configure_threads(1)
    x, y, mine = _half(args, args.part)
    model = tc.build(args.seed)
    opt = tc.sgd(model.parameters(), LR)
    if args.column == "alone-adapter":
        adapter = TorchAdapter(model, {"optimizer": lambda p: opt})
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        raise SystemExit("no GO from the parent")
    t0 = time.perf_counter()
    if args.column == "alone-adapter":
        idx = np.sort(mine)
        xs, ys = x[idx], y[idx]
        # the trainer's partition arrives sorted; restore the epoch's order as it does
        back = np.argsort(np.argsort(mine))
        adapter.fit(xs[back], ys[back], 1, tc.BATCH)
    else:
        idx = torch.from_numpy(mine)
        model.train()
        for s in range(0, len(idx), tc.BATCH):
            b = idx[s:s + tc.BATCH]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xt[b]), yt[b]).backward()
            opt.step()
    print(json.dumps({"train_s": time.perf_counter() - t0}), flush=True)


def _start(args, column: str, part: int) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", column, "--part", str(part),
           "--seed", str(args.seed)] + (["--limit", str(args.limit)] if args.limit else [])
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def _processes(args, column: str, n: int) -> list[float]:
    procs = [_start(args, column, part) for part in range(n)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "READY":
                raise RuntimeError(f"{column}: a child did not start (exit {p.wait()})")
        for p in procs:
            p.stdin.write("GO\n")
            p.stdin.flush()
        out = [json.loads(p.stdout.readline())["train_s"] for p in procs]
        for p in procs:
            p.wait(timeout=60)
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def ddlf_alg6(args) -> dict:
    """One epoch of Algorithm 6 in a child process (its own cluster and imports)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "ddlf-alg6",
                           "--seed", str(args.seed)]
                          + (["--limit", str(args.limit)] if args.limit else []),
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"ddlf-alg6 failed: {proc.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


def ddlf_child(args) -> None:
    """``train_sync`` with ``torch_compare``'s Algorithm 6 options, one epoch; prints the
    round's time without evaluation and the busier trainer's train call."""
    import functools

    import ddlf_actors as ddlf
    from ddlf_actors.apps import train_sync

    ddlf.init(num_cpus=2)
    try:
        result = train_sync(functools.partial(tc.build, args.seed),
                            functools.partial(tc.split_dataset, "val", args.limit, 1),
                            workers=2, master_epochs=1, batch_size=tc.BATCH, seed=args.seed,
                            progress=False, optimizer=functools.partial(tc.sgd, lr=LR),
                            **ALG6)
    finally:
        ddlf.shutdown()
    row = result.history[-1]
    print(json.dumps({"train_s": row["wall_s"] - row.get("eval_s", 0.0),
                      "compute_s": row["compute_s"], "startup_s": result.startup_s}),
          flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="training images (smoke runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", choices=("alone", "alone-adapter", "ddlf-alg6"),
                   help=argparse.SUPPRESS)
    p.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "ddlf-alg6":
        ddlf_child(args)
        return 0
    if args.child:
        args.column = args.child
        child(args)
        return 0
    got: dict = {c: [] for c in COLUMNS}
    extra: list = []
    for rep in range(args.reps):
        load = os.getloadavg()[0]
        got["alone"].append(_processes(args, "alone", 1)[0])
        got["alone-adapter"].append(_processes(args, "alone-adapter", 1)[0])
        got["pair"].append(max(_processes(args, "alone", 2)))
        d = ddlf_alg6(args)
        got["ddlf-alg6"].append(d["train_s"])
        extra.append(d["compute_s"])
        print(f"rep {rep + 1}: " + ", ".join(f"{c} {got[c][-1]:.2f} s" for c in COLUMNS)
              + f", ddlf compute_s {extra[-1]:.2f} s; load {load:.2f}", file=sys.stderr,
              flush=True)
    base = statistics.median(got["alone"])
    print(f"\nhalf an epoch per process ({'all' if not args.limit else args.limit} images "
          f"/ 2), 1 thread each, medians of {args.reps}; load average now "
          f"{os.getloadavg()[0]:.2f}\n")
    print("| column | s | vs alone | vs pair |\n|---|---:|---:|---:|")
    pair = statistics.median(got["pair"])
    for c in COLUMNS:
        m = statistics.median(got[c])
        print(f"| {c} | {m:.2f} | {m / base:.2f}x | {m / pair:.2f}x |")
    m = statistics.median(extra)
    print(f"| ddlf-alg6: the busier trainer's train call | {m:.2f} | {m / base:.2f}x | "
          f"{m / pair:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
