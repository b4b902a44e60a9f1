"""A workload where the links matter (issue 23 section 1): a round's compute against its
transfer, for the models of ``apps/models.py``, on half a CPU.

    sudo python benchmarks/emulation/link_workload.py [--models wide_cnn,wide_cnn:64-128-324,paper_cnn]
                                            [--node-cpus 0.5] [--rounds 6] [--ks 1,2,4]

For each model a child process, started inside a cgroup capped at ``--node-cpus``
(``benchmarks/emulation/cpu_caps.py``: cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us`` where this
kernel mounts that), with one TensorFlow thread (as a trainer of ``num_cpus=1`` gets),
runs rounds of DDLF's default ``STEPS_PER_ROUND`` (32) ``train_on_batch`` steps of batch
32 on Fashion-MNIST, as ``TrainerActor.fit`` does; after one warm-up round, it reports
each round's wall time and its CPU time. Without root (no cgroup) it runs uncapped and
says so.

The transfer is *computed*, not measured: a plain sync round sends the weights down to
each trainer and its delta up, one after the other, all through the driver's link, so
at K trainers the driver's link carries K model copies each way: ``2·K·bytes·8/rate``.
(``cluster_emu.py`` measures it on emulated links.) The table gives, per model: its
parameters and bytes, the round's compute (median wall time and CPU seconds, with the
cap), the transfer at 100 Mbit/s and 1 Gbit/s at each K, the ratio transfer/compute at
K = 1, and an estimate of a K = 1 run of 2 epochs at each rate (rounds of 32 steps on
60,000 samples: 59 per epoch, each compute + transfer, evaluation left out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RATES = {"100mbit": 100e6, "1gbit": 1e9}


def build(spec: str):
    """``name`` or ``wide_cnn:<f1>-<f2>-<dense>``: the model, compiled."""
    from ddlf_actors.apps import models

    name, _, arg = spec.partition(":")
    if name == "wide_cnn" and arg:
        f1, f2, dense = (int(v) for v in arg.split("-"))
        return models.wide_cnn(filters=(f1, f2), dense=dense)
    return getattr(models, name)()


def measure(spec: str, rounds: int, steps: int, batch: int) -> dict:
    """In the capped child: rounds of ``steps`` steps; wall and CPU seconds per round."""
    # One intra-op thread, one inter-op thread, set before TF starts (TrainerActor does).
    os.environ.update(OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
                      TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    from ddlf_actors.apps import datasets, tf_startup

    tf = tf_startup.import_tensorflow()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    (x, y), _ = datasets.load("fashion-mnist")
    model = build(spec)
    per_round = steps * batch
    walls, cpus = [], []
    for r in range(rounds + 1):
        start = (r * per_round) % (len(x) - per_round)
        w, c = time.perf_counter(), time.process_time()
        for i in range(start, start + per_round, batch):
            model.train_on_batch(x[i:i + batch], y[i:i + batch])
        if r:   # round 0 traces the functions: not reported
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
    return {"params": int(model.count_params()), "bytes": 4 * int(model.count_params()),
            "wall_s": walls, "cpu_s": cpus}


def run_capped(spec: str, args, group) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "_measure", spec, str(args.rounds),
           str(args.steps), str(args.batch)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run((group.prefix() if group else []) + cmd, capture_output=True,
                          text=True, env=env, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"measuring {spec} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict, ks: list, cpus: float | None, steps: int) -> str:
    rounds_per_epoch = round(60000 / (32 * steps))
    head = ["model", "params", "MB", f"compute s/round ({cpus if cpus else 'no'} CPU cap)",
            "CPU s/round"]
    for rate in RATES:
        head += [f"transfer {rate} K={k} s" for k in ks]
    head += ["transfer/compute 100mbit K=1", "transfer/compute 1gbit K=1",
             "K=1 2 epochs est. 100mbit s", "K=1 2 epochs est. 1gbit s"]
    out = ["| " + " | ".join(head) + " |", "|---" * 2 + "|" + "---:|" * (len(head) - 2)]
    for spec, r in results.items():
        wall = statistics.median(r["wall_s"])
        cpu = statistics.median(r["cpu_s"])
        row = [spec, f"{r['params']:,}", f"{r['bytes'] / 1e6:.1f}", f"{wall:.2f}", f"{cpu:.2f}"]
        for bits in RATES.values():
            row += [f"{2 * k * r['bytes'] * 8 / bits:.2f}" for k in ks]
        t1 = {rate: 2 * r["bytes"] * 8 / bits for rate, bits in RATES.items()}
        row += [f"{t1['100mbit'] / wall:.2f}", f"{t1['1gbit'] / wall:.2f}"]
        row += [f"{2 * rounds_per_epoch * (wall + t1[rate]):.0f}" for rate in RATES]
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="wide_cnn,wide_cnn:64-128-324,paper_cnn")
    p.add_argument("--node-cpus", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ks", default="1,2,4")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if ROOT not in sys.path:   # benchmarks.* from the checkout
        sys.path.insert(0, ROOT)
    from benchmarks.emulation.cpu_caps import CpuGroups, cgroup_unavailable
    from ddlf_actors.apps import datasets

    datasets.ensure("fashion-mnist")   # fetched once, outside the timed child
    why = cgroup_unavailable()
    groups = None
    cap = a.node_cpus
    if why:
        print(f"no CPU cap: {why}; the compute column is uncapped", file=sys.stderr)
        cap = None
    else:
        groups = CpuGroups(f"ddlf-workload-{os.getpid()}", weight=8)
    results = {}
    load_before = os.getloadavg()[0]
    try:
        for spec in a.models.split(","):
            group = groups.child(spec.replace(":", "_"), cap) if groups else None
            print(f"{spec}: measuring {a.rounds} rounds at {cap or 'uncapped'} CPU ...",
                  file=sys.stderr)
            results[spec] = run_capped(spec, a, group)
    finally:
        if groups is not None:
            groups.close()
    print(f"\nload average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{a.steps} steps of batch {a.batch} per round, median of {a.rounds} rounds")
    print(table(results, [int(k) for k in a.ks.split(",")], cap, a.steps))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"node_cpus": cap, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        print(json.dumps(measure(sys.argv[2], *(int(v) for v in sys.argv[3:6]))))
    else:
        sys.exit(main())
