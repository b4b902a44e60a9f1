"""Training over emulated links: the driver, the head and K trainer nodes, each in its own
network namespace, their links limited with ``tc ... tbf``.

    sudo python benchmarks/cluster_emu.py codecs   [--k 2] [--rates 1gbit,100mbit]
                                                   [--rounds 6] [--rounds-per-epoch 30]
    sudo python benchmarks/cluster_emu.py accuracy [--k 2] [--rate 100mbit] [--epochs 5]
                                                   [--codecs none,fp16,topk:0.01]
    sudo python benchmarks/cluster_emu.py allreduce [--ks 2,4,8] [--rates 1gbit,100mbit]
                                                    [--features 4096] [--samples 800]

The hosts come from ``tests/netns_cluster.py`` (``NetnsHosts``: one namespace per host,
each joined to one bridge by a veth pair): host 0 runs the head, hosts 1..K a 1-CPU node
each, host K+1 the driver. Every server binds its host's address only. ``NetnsHosts.shape``
puts a token-bucket qdisc on both ends of every veth, so each host has a full-duplex link
of the given rate to the bridge, as a machine has to its switch: the driver's one link
carries the K weight copies out and the K deltas in. (``netem`` is not available here,
so the links add no delay, only a rate.)

``codecs``: for each link rate and each codec, a few sync rounds of the paper CNN on
Fashion-MNIST (a 500-sample test set, so the per-round evaluation stays small); prints
the bytes that crossed the driver's link per round and the median round time (rounds
after the first, which also fetches the initial weights), with their ratio to ``none``.

``accuracy``: full Fashion-MNIST runs of ``--epochs`` epochs per codec at one rate; the
test accuracy after each epoch, the time to 0.85 and the run's total time.

``allreduce`` (needs ``train_allreduce``): for each K a cluster of K nodes, ``sync``
against ``allreduce`` on the same numpy trainers (a softmax model of ``--features`` ×
10 on ``--samples`` rows, few, so that a round waits on the links rather than on K
trainers sharing two cores), alternating, with ``benchmarks/allreduce_bench.py``'s ``measure``: the driver's
bytes per round (payload, and on its sockets) and the median round time. The driver's
link carries 2K model copies per sync round; a ring member's carries 2 (K − 1)/K each
way, so allreduce overtakes sync once the link, not the hops, is what a round waits for.

The trainers are started once per invocation and reused by every run (``trainers=``),
and each run starts from the same initial weights. Skips with a reason (exit 0) when not
root or when ``ip netns`` does not work. Namespaces and processes are removed on exit,
error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

# tbf's bucket must hold the largest GSO packet a veth hands it (up to 64 KB), and enough
# for the rate at the kernel's timer granularity.
BURST = {"1gbit": "1mb", "100mbit": "256kb"}
CODECS = ["none", "lz4", "fp16", "int8", "topk:0.01"]
TARGET = 0.85


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the parent (root namespace): hosts, links, processes --------------------------------------

def run(plan: dict) -> list:
    """Build the hosts, run the driver with ``plan``, shape the links when it asks; return
    the driver's results. Everything is torn down however this ends."""
    from netns_cluster import NetnsHosts, start_head_and_nodes

    from ddlf_actors.runtime.wire.auth import generate_token

    k = plan["k"]
    # DDLF_SHM=0: the namespaces share one /dev/shm and one boot id, so DDLF would take
    # them for one host and pass every object of 1 MiB or more through shared memory,
    # past the shaped links. Without it, every byte between hosts crosses a veth.
    env = {"DDLF_AUTH_TOKEN": generate_token(), "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2", "DDLF_SHM": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.path.join(ROOT, "tests"), HERE,
                                                     os.environ.get("PYTHONPATH")) if p)}
    hosts = NetnsHosts(k + 2)
    results = []
    try:
        hosts.up()
        info, _nodes = start_head_and_nodes(hosts, env, head=0, nodes=range(1, k + 1))
        driver = subprocess.Popen(
            [*hosts.prefix(k + 1), sys.executable, os.path.abspath(__file__), "_driver",
             info["address"], json.dumps(plan)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, **env})
        hosts.procs.append(driver)
        for line in driver.stdout:
            kind, _, body = line.rstrip("\n").partition(" ")
            if kind == "RATE":
                hosts.shape(body, BURST.get(body, "1mb"))
                log(f"links: {body} each way on all {k + 2} hosts")
                driver.stdin.write("OK\n")
                driver.stdin.flush()
            elif kind == "RESULT":
                results.append(json.loads(body))
                r = results[-1]
                log(f"  {r['rate']:>8} {r['codec']:<10} done in {r['total_s']:.1f} s")
            else:
                log(f"driver: {line.rstrip()}")
        code = driver.wait()
        if code != 0:
            raise RuntimeError(f"the driver exited with status {code} (its errors are above)")
        return results
    finally:
        hosts.down()


# -- the driver (its own namespace) --------------------------------------------------------------

def small_test_set():
    """Fashion-MNIST with the first 500 test samples: the codec rounds evaluate every round,
    and evaluating all 10,000 would swamp the transfer being measured."""
    from ddlf_actors.apps import datasets

    (x, y), (xt, yt) = datasets.load("fashion-mnist")
    return (x, y), (xt[:500], yt[:500])


def driver(address: str, plan: dict) -> None:
    if plan["mode"] == "allreduce":
        return allreduce_driver(address, plan)
    import ddlf_actors as ddlf
    from ddlf_actors.apps import TrainConfig, models, train_sync
    from ddlf_actors.apps.callbacks import Callback
    from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

    class StopAfter(Callback):
        def __init__(self, n):
            self.n = n

        def on_row(self, row, run):
            if row["round"] >= self.n:
                run.stop = True

    dataset = small_test_set if plan["mode"] == "codecs" else "fashion-mnist"
    ddlf.init(address=address)
    trainers = start_trainers(models.paper_cnn, dataset,
                              TrainConfig(workers=plan["k"], progress=False))
    try:
        w0 = ddlf.get(trainers[0].get_weights.remote())
        # Warm up (TF traces its functions on a trainer's first calls); not reported.
        train_sync(models.paper_cnn, dataset, trainers=trainers, initial_weights=w0,
                   workers=plan["k"], rounds_per_epoch=30, progress=False,
                   callbacks=[StopAfter(2)])
        for rate in plan["rates"]:
            print(f"RATE {rate}", flush=True)
            if sys.stdin.readline().strip() != "OK":
                raise SystemExit("the parent did not shape the links")
            for spec in plan["codecs"]:
                options = dict(workers=plan["k"], rounds_per_epoch=plan["rounds_per_epoch"],
                               master_epochs=plan["epochs"], progress=False,
                               compression=None if spec == "none" else _spec(spec))
                if plan["mode"] == "codecs":
                    options["callbacks"] = [StopAfter(plan["rounds"])]
                t0 = time.perf_counter()
                result = train_sync(models.paper_cnn, dataset, trainers=trainers,
                                    initial_weights=w0, **options)
                rows = [{k: r[k] for k in ("round", "epoch", "time_s", "wall_s", "compute_s",
                                           "overhead_s", "bytes_sent", "bytes_received", "test_accuracy")}
                        for r in result.history]
                print("RESULT " + json.dumps({"rate": rate, "codec": spec, "rows": rows,
                                              "total_s": time.perf_counter() - t0}), flush=True)
    finally:
        stop_trainers(trainers)
        ddlf.shutdown()


def allreduce_driver(address: str, plan: dict) -> None:
    from allreduce_bench import SCHEMES, Workload, measure
    from helpers_modules.numpy_trainer import NumpyTrainer

    import ddlf_actors as ddlf
    from ddlf_actors.apps import TrainConfig
    from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

    ddlf.init(address=address)
    work = Workload(features=plan["features"], classes=10, samples=plan["samples"])
    trainers = start_trainers(work.model_fn, work.dataset, TrainConfig(
        workers=plan["k"], trainer_cls=NumpyTrainer, progress=False))
    try:
        for rate in plan["rates"]:
            print(f"RATE {rate}", flush=True)
            if sys.stdin.readline().strip() != "OK":
                raise SystemExit("the parent did not shape the links")
            t0 = time.perf_counter()
            runs: dict = {s: [] for s in SCHEMES}
            for _ in range(plan["repeats"]):
                for scheme in SCHEMES:
                    runs[scheme].append(measure(scheme, trainers, work, 2, 6))
            for scheme, got in runs.items():
                row = {key: statistics.median(g[key] for g in got)
                       for key in ("wire", "payload", "round_s", "ring_s", "ring_bytes")}
                print("RESULT " + json.dumps({
                    "rate": rate, "codec": scheme, "k": plan["k"], **row,
                    "model_bytes": work.model_bytes, "total_s": time.perf_counter() - t0}),
                    flush=True)
    finally:
        stop_trainers(trainers)
        ddlf.shutdown()


def _spec(text: str):
    parts = text.split(",")
    return parts[0] if len(parts) == 1 else tuple(parts)


# -- tables --------------------------------------------------------------------------------------

def codec_table(results: list) -> str:
    """Medians over the rounds after the first (which also fetches the initial weights).
    ``beyond compute``: the round's time beyond its busiest trainer's training and
    evaluation, which is where the transfers (and encoding, decoding) show."""
    out = ["| link | codec | MB/round (driver link, both ways) | smaller by | round s | "
           "beyond compute s | vs none |", "|---|---|---:|---:|---:|---:|---:|"]
    base = {}
    for r in results:
        rows = r["rows"][1:]
        per_round = statistics.median(x["bytes_sent"] + x["bytes_received"] for x in rows)
        wall = statistics.median(x["wall_s"] for x in rows)
        beyond = statistics.median(x["overhead_s"] for x in rows)
        if r["codec"] == "none":
            base[r["rate"]] = (per_round, beyond)
        b = base.get(r["rate"])
        out.append(f"| {r['rate']} | {r['codec']} | {per_round / 1e6:.3f} | "
                   f"{'' if b is None else f'{b[0] / per_round:.1f}x'} | {wall:.3f} | "
                   f"{beyond:.3f} | {'' if b is None else f'{beyond / b[1]:.2f}'} |")
    return "\n".join(out)


def allreduce_table(results: list) -> str:
    out = ["| link | K | scheme | driver payload B/round | driver wire B/round | round ms | "
           "ring ms | allreduce/sync round |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    sync = {(r["rate"], r["k"]): r["round_s"] for r in results if r["codec"] == "sync"}
    for r in sorted(results, key=lambda r: (r["rate"], r["k"], r["codec"] != "sync")):
        ratio = r["round_s"] / sync[(r["rate"], r["k"])] if r["codec"] != "sync" else None
        out.append(f"| {r['rate']} | {r['k']} | {r['codec']} | {r['payload']:,.0f} | "
                   f"{r['wire']:,.0f} | {1e3 * r['round_s']:.1f} | "
                   f"{1e3 * r['ring_s']:.1f} | {'' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(out)


def accuracy_table(results: list) -> str:
    # Only evaluated rows have an accuracy (sync evaluates once per epoch by default).
    def evaluated(r):
        return [x["test_accuracy"] for x in r["rows"] if x["test_accuracy"] is not None]

    epochs = max(len(evaluated(r)) for r in results)
    out = ["| link | codec | " + " | ".join(f"acc eval {i + 1}" for i in range(epochs))
           + f" | time to {TARGET} s | total s | MB/round |",
           "|---|---|" + "---:|" * (epochs + 3)]
    for r in results:
        accs = evaluated(r)
        accs += [None] * (epochs - len(accs))
        hit = next((x["time_s"] for x in r["rows"] if (x["test_accuracy"] or 0) >= TARGET), None)
        mb = statistics.median(x["bytes_sent"] + x["bytes_received"] for x in r["rows"][1:]) / 1e6
        out.append(f"| {r['rate']} | {r['codec']} | "
                   + " | ".join("-" if a is None else f"{a:.4f}" for a in accs)
                   + f" | {'not reached' if hit is None else f'{hit:.1f}'} | "
                   f"{r['rows'][-1]['time_s']:.1f} | {mb:.3f} |")
    return "\n".join(out)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["codecs", "accuracy", "allreduce"])
    p.add_argument("--ks", default="2,4,8", help="allreduce: trainer counts")
    p.add_argument("--features", type=int, default=4096, help="allreduce: model inputs")
    p.add_argument("--repeats", type=int, default=3, help="allreduce: runs per scheme")
    p.add_argument("--samples", type=int, default=800,
                   help="allreduce: training rows (few: the rounds then wait on the links, "
                        "not on 8 trainers sharing this machine's cores)")
    p.add_argument("--k", type=int, default=2, help="trainer nodes")
    p.add_argument("--rates", default="1gbit,100mbit", help="codecs: link rates (tc syntax)")
    p.add_argument("--rate", default="100mbit", help="accuracy: the link rate")
    p.add_argument("--codecs", help="comma-separated; a pair as down/up, e.g. fp16/topk:0.01")
    p.add_argument("--rounds", type=int, default=6, help="codecs: rounds per run")
    p.add_argument("--rounds-per-epoch", type=int, help="30 for codecs, 1 for accuracy")
    p.add_argument("--epochs", type=int, default=5, help="accuracy: epochs per run")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)

    from netns_cluster import netns_unavailable

    why = netns_unavailable()
    if why:
        print(f"cluster_emu skipped: {why}")
        return 0
    codecs = [c.replace("/", ",") for c in a.codecs.split(",")] if a.codecs else (
        CODECS if a.mode == "codecs" else ["none", "fp16", "topk:0.01"])
    plan = {"mode": a.mode, "k": a.k, "codecs": codecs,
            "rates": a.rates.split(",") if a.mode != "accuracy" else [a.rate],
            "features": a.features, "repeats": a.repeats, "samples": a.samples,
            "rounds": a.rounds, "epochs": 1 if a.mode == "codecs" else a.epochs,
            "rounds_per_epoch": a.rounds_per_epoch or (30 if a.mode == "codecs" else 1)}
    # SIGTERM as Ctrl-C: unwind through run()'s finally, which removes everything.
    signal.signal(signal.SIGTERM, _interrupted)
    if a.mode == "allreduce":
        results = [r for k in map(int, a.ks.split(",")) for r in run({**plan, "k": k})]
    else:
        results = run(plan)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"plan": plan, "results": results}, f, indent=1)
    if a.mode == "allreduce":
        print(f"\nnumpy softmax {a.features}x10 (model {4 * 10 * (a.features + 1):,} B), "
              f"medians of {a.repeats} alternating runs")
    else:
        print(f"\nK={a.k}, paper CNN, batch 32, {plan['rounds_per_epoch']} rounds per epoch")
    table = {"codecs": codec_table, "accuracy": accuracy_table, "allreduce": allreduce_table}
    print(table[a.mode](results))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "_driver":
        driver(sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(main())
