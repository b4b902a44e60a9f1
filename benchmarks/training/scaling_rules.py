"""The rules by K behind DDLF's defaults (issue 30 section 2): epochs to a validation
target for K trainers, against one process with the same optimizer grid.

Sample efficiency only: how many epochs of data each setting needs to reach the target,
not how fast it goes through them (that is ``emulation/cluster_emu.py scaling``, on capped
nodes). So the runs need no emulated hosts: K trainers of one TensorFlow thread each on
an embedded cluster of K CPUs (oversubscribed on a small machine: the epochs do not
depend on it), and the single process with one thread.

Every run trains ``models.wide_cnn`` (5.1 M parameters) on the first 50,000 Fashion-MNIST
training images and evaluates on the last 10,000 (validation; ``protocol/split.py``), batch
32 per trainer, from the same initial weights (built after ``keras.utils.set_random_seed
(1234)``), the seed setting the data's order; 16 evaluations per epoch (``--evals``). A
run stops at the target. One JSON line per run goes to ``--out``. ``--stage final`` trains
on all 60,000 and evaluates on the test set instead, to compare with the test-set tables
(never to choose).

    python benchmarks/training/scaling_rules.py single "opt=adam:1e-3" "opt=adam:2e-3 batch=128" \\
        --seeds 0,1,2 --out runs.jsonl
    python benchmarks/training/scaling_rules.py ddlf 4 "in=adam:2e-3 outer_momentum=0.8" \\
        --seeds 0,1,2 --out runs.jsonl
    python benchmarks/training/scaling_rules.py table runs.jsonl

CONFIG (``key=value``, space-separated): ``in=OPT`` / ``opt=OPT`` the optimizer
(``adam:LR``, ``sgd:LR``, ``sgdm:LR`` momentum 0.9); ``batch=N``; for DDLF any
``train()`` option by name (``outer_lr=0.5``, ``outer_momentum=0.8``, ``steps_per_round=32``,
``compression=int4:ef``), and ``scheme=NAME`` (default ``allreduce``). The raw runs behind
``docs/training.md``'s "The defaults, by K and by link" are
``benchmarks/results/scaling_rules_2026-11-28.jsonl.gz`` (16 evaluations an epoch) and, for
the K = 4 rules chosen again at ``--evals 32``, ``scaling_rules_evals32_2026-11-30.jsonl.gz``.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)

from benchmarks.protocol.split import STAGES, SplitDataset, split_indices  # noqa: E402

INIT_SEED = 1234


class Model:
    """``models.wide_cnn`` compiled with optimizer ``opt`` (``adam:1e-3`` ...): picklable,
    so the trainers build it themselves."""

    def __init__(self, opt: str):
        self.opt = opt

    def __call__(self):
        import keras

        from ddlf_actors.apps import models

        name, _, lr = self.opt.partition(":")
        makers = {"adam": lambda r: keras.optimizers.Adam(r),
                  "sgd": lambda r: keras.optimizers.SGD(r),
                  "sgdm": lambda r: keras.optimizers.SGD(r, momentum=0.9)}
        if name not in makers:
            raise SystemExit(f"unknown optimizer {self.opt!r}: use adam:LR, sgd:LR or sgdm:LR")
        model = models.wide_cnn()
        model.compile(optimizer=makers[name](float(lr)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model


def parse(config: str) -> dict:
    out = {}
    for item in config.replace(",", " ").split():
        key, _, value = item.partition("=")
        out[key] = value
    return out


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def run_ddlf(k: int, config: str, seed: int, epochs: int, target: float, evals: int,
             stage: str = "select") -> dict:
    import keras

    from ddlf_actors.apps import train
    from ddlf_actors.apps.schemes.rounds import STEPS_PER_ROUND, default_rounds

    c = parse(config)
    model = Model(c.pop("in", "adam:1e-3"))
    scheme = c.pop("scheme", "allreduce")
    options = {key: _value(v) for key, v in c.items()}
    if "batch" in options:
        options["batch_size"] = options.pop("batch")
    batch = options.get("batch_size", 32)
    trained = len(split_indices(stage, 60_000, 10_000).train)   # Fashion-MNIST's sizes
    rounds = options.get("rounds_per_epoch") or default_rounds(
        trained / k, batch, options.get("steps_per_round", STEPS_PER_ROUND))
    keras.utils.set_random_seed(INIT_SEED)
    w0 = model().get_weights()
    t0 = time.time()
    result = train(model, SplitDataset(stage), scheme, workers=k, master_epochs=epochs,
                   seed=seed, target_accuracy=target, progress=False, initial_weights=w0,
                   eval_every=max(1, rounds // evals), **options)
    rows = [(r["epoch"], r["test_accuracy"], r["time_s"]) for r in result.history
            if r.get("test_accuracy") is not None]
    return {"k": k, "config": config, "seed": seed, "rows": rows, "wall_s": time.time() - t0,
            "settings": getattr(result, "settings", None), "stage": stage}


def run_single(config: str, seed: int, epochs: int, target: float, evals: int,
               stage: str = "select") -> dict:
    import keras
    import numpy as np

    c = parse(config)
    batch = int(c.get("batch", 32))
    (x, y), (xv, yv) = SplitDataset(stage)()
    keras.utils.set_random_seed(INIT_SEED)
    model = Model(c.get("opt", "adam:1e-3"))()
    rng = np.random.default_rng(seed)
    steps = -(-len(x) // batch)
    every = max(1, steps // evals)
    rows, t0 = [], time.time()
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        for s in range(steps):
            idx = order[s * batch:(s + 1) * batch]
            model.train_on_batch(x[idx], y[idx])
            if (s + 1) % every == 0 or s == steps - 1:
                _, acc = model.evaluate(xv, yv, batch_size=1000, verbose=0)
                rows.append((epoch + (s + 1) / steps, float(acc), time.time() - t0))
                if acc >= target:
                    return {"k": 1, "config": config, "seed": seed, "rows": rows,
                            "wall_s": time.time() - t0, "single": True}
    return {"k": 1, "config": config, "seed": seed, "rows": rows, "wall_s": time.time() - t0,
            "single": True}


def epochs_to(rows, target: float):
    return next((e for e, a, *_ in rows if a is not None and a >= target), None)


def table(paths: list, target: float) -> str:
    """Median [min–max] epochs to ``target`` per (K, config), over the seeds."""
    runs = []
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            runs += [json.loads(line) for line in f if line.strip()]
    groups = collections.defaultdict(list)
    for r in runs:
        label = ("one process, " if r.get("single") else "DDLF, ") + r["config"]
        if r.get("stage", "select") != "select":
            label += f" ({r['stage']} split)"
        groups[(r["k"], label)].append(epochs_to(r["rows"], target))
    lines = [f"| K | setting | seeds | epochs to {target} (median [min-max]) |",
             "|---:|---|---:|---|"]
    for (k, label), hits in sorted(groups.items()):
        got = [h for h in hits if h is not None]
        text = (f"{statistics.median(got):.2f} [{min(got):.2f}-{max(got):.2f}]"
                + (f", {len(hits) - len(got)} not reached" if len(got) < len(hits) else "")
                if got else "not reached")
        lines.append(f"| {k} | {label} | {len(hits)} | {text} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("single", "ddlf", "table"))
    p.add_argument("args", nargs="+", help="single: CONFIGs; ddlf: K then CONFIGs; "
                   "table: result files")
    p.add_argument("--seeds", default="0", help="comma-separated (default 0)")
    p.add_argument("--epochs", type=int, default=2, help="at most (default 2)")
    p.add_argument("--target", type=float, default=0.875)
    p.add_argument("--evals", type=int, default=16, help="evaluations per epoch (default 16)")
    p.add_argument("--stage", choices=STAGES, default="select",
                   help="select: validation (default); final: all 60,000 images, the test set")
    p.add_argument("--out", default="scaling_rules.jsonl", help="append each run here")
    a = p.parse_args(argv)
    if a.mode == "table":
        print(table(a.args, a.target))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.mode == "single":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        jobs = [(lambda c=c, s=s: run_single(c, s, a.epochs, a.target, a.evals, a.stage))
                for s in seeds for c in a.args]
    else:
        import ddlf_actors as ddlf

        k = int(a.args[0])
        ddlf.init(num_cpus=max(k, 2))
        jobs = [(lambda c=c, s=s: run_ddlf(k, c, s, a.epochs, a.target, a.evals, a.stage))
                for s in seeds for c in a.args[1:]]
    for job in jobs:   # seeds interleaved: every config once per seed, in turn
        r = job()
        print(json.dumps({key: v for key, v in r.items() if key != "rows"}
                         | {"epochs_to_target": epochs_to(r["rows"], a.target)}), flush=True)
        with open(a.out, "a") as f:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
