"""Training over emulated links: the driver, the head and K trainer nodes, each in its own
network namespace, their links limited with ``tc ... tbf``.

    sudo python benchmarks/emulation/cluster_emu.py codecs   [--k 2] [--rates 1gbit,100mbit]
                                                   [--rounds 6] [--rounds-per-epoch 30]
    sudo python benchmarks/emulation/cluster_emu.py accuracy [--k 2] [--rate 100mbit] [--epochs 5]
                                                   [--codecs none,fp16,topk:0.01]
    sudo python benchmarks/emulation/cluster_emu.py allreduce [--ks 2,4,8] [--rates 1gbit,100mbit]
                                                    [--features 4096] [--samples 800]
    sudo python benchmarks/emulation/cluster_emu.py caps     [--k 2] [--node-cpus 0.5] [--seconds 10]
    sudo python benchmarks/emulation/cluster_emu.py streaming [--k 4] [--settings ...] [--seeds 1,2,3]
    sudo python benchmarks/emulation/cluster_emu.py scaling --select [--ks 1,2,4,8]
    sudo python benchmarks/emulation/cluster_emu.py scaling  [--ks 1,2,4,8] [--setting allreduce+codec]

``streaming`` (issue 23 section 4: overlapped and streamed averaging, utilization, time
to the target) is ``emu_streaming.py``'s; it defaults to ``--model wide_cnn --node-cpus
0.5 --target 0.875 --epochs 3``. ``scaling`` (issue 30 section 5: the tuned single
process, data-parallel, DDLF's defaults and its best setting at K = 1, 2, 4 and 8, their
efficiencies; tuned on validation with ``--select``) is ``scaling.py``'s; it defaults to
``--model wide_cnn --target 0.875 --epochs 5 --evals-per-epoch 8``, nodes at 0.5 CPU up
to K = 4 and 2/K beyond. Both take ``--estimate`` (the grid's expected wall time, without
running it) and ``--from FILE`` (the table of runs already made).

Every mode takes ``--node-cpus C`` (each trainer node capped at C CPUs, see below),
``--model`` (``paper_cnn``, ``wide_cnn`` or ``wide_cnn:<f1>-<f2>-<dense>``, from
``apps/models.py``) and ``--rounds-per-epoch auto`` (DDLF's default, ~16 local steps).

The hosts, links, caps and teardown are the emulation harness's (``harness.py``). The
hosts come from ``tests/netns_cluster.py`` (``NetnsHosts``: one namespace per host,
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

**Per-node CPU caps** (``--node-cpus``, issue 23 section 1). Each trainer node runs in a
cgroup of its own (``benchmarks/emulation/cpu_caps.py``: cgroup v2 ``cpu.max``, or v1
``cpu.cfs_quota_us`` where the kernel mounts that), started inside it, so the node daemon,
its forkserver and its trainer share the cap: K nodes of 0.5 CPU fit on 2 cores. Each node
offers 1 CPU to DDLF, so it holds one trainer of ``num_cpus=1`` with one TF thread. The
head and the driver run uncapped, in a sibling group; the run's group has the CPU weight
of ``--priority`` (8) ordinary processes, so that on a machine loaded by other jobs the
nodes get what their caps allow (and no more).

``caps``: the check that a capped node gets its share. One actor per node spins (a busy
Python loop) for ``--seconds``: first on node 1 alone, then on every node at once, then
on node 1 alone with the caps lifted. For each node: CPU seconds over wall seconds of all
its processes (from its cgroup, as the parent sees them) and of the spinning actor's
process (as it sees itself), and the share of cap periods in which the kernel throttled
the node.

``allreduce`` (needs ``train_allreduce``): for each K a cluster of K nodes, ``sync``
against ``allreduce`` on the same numpy trainers (a softmax model of ``--features`` ×
10 on ``--samples`` rows, few, so that a round waits on the links rather than on K
trainers sharing two cores), alternating, with ``benchmarks/training/allreduce_bench.py``'s ``measure``: the driver's
bytes per round (payload, and on its sockets) and the median round time. The driver's
link carries 2K model copies per sync round; a ring member's carries 2 (K − 1)/K each
way, so allreduce overtakes sync once the link, not the hops, is what a round waits for.

The trainers are started once per invocation and reused by every run (``trainers=``),
and each run starts from the same initial weights. Skips with a reason (exit 0) when not
root or when ``ip netns`` does not work (or, with ``--node-cpus``, when no cgroup can be
made). Namespaces, cgroups and processes are removed on exit, error, Ctrl-C, SIGTERM or
SIGHUP: the teardown ignores further signals and is bounded (processes get 15 s to stop,
then are killed; a cgroup's leftovers SIGTERM then SIGKILL), and the script checks that
nothing of its own is left and says so if something is.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _p in (os.path.join(ROOT, "tests"), ROOT):   # netns_cluster; benchmarks.* from the checkout
    if _p not in sys.path:
        sys.path.insert(0, _p)

from benchmarks.emulation import emu_streaming, scaling  # noqa: E402
from benchmarks.emulation.harness import load_results, model_fn, run  # noqa: E402

CODECS = ["none", "lz4", "fp16", "int8", "topk:0.01"]
TARGET = 0.85


# -- the driver (its own namespace) --------------------------------------------------------------

def small_test_set():
    """Fashion-MNIST with the first 500 test samples: the codec rounds evaluate every round,
    and evaluating all 10,000 would swamp the transfer being measured."""
    from ddlf_actors.apps import datasets

    (x, y), (xt, yt) = datasets.load("fashion-mnist")
    return (x, y), (xt[:500], yt[:500])


def driver(address: str, plan: dict) -> None:
    if plan["mode"] == "streaming":
        return emu_streaming.driver(address, plan)
    if plan["mode"] == "scaling":
        return scaling.driver(address, plan)
    if plan["mode"] == "allreduce":
        return allreduce_driver(address, plan)
    if plan["mode"] == "caps":
        return caps_driver(address, plan)
    import ddlf_actors as ddlf
    from ddlf_actors.apps import TrainConfig, train_sync
    from ddlf_actors.apps.callbacks import Callback
    from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

    class StopAfter(Callback):
        def __init__(self, n):
            self.n = n

        def on_row(self, row, run):
            if row["round"] >= self.n:
                run.stop = True

    dataset = small_test_set if plan["mode"] == "codecs" else "fashion-mnist"
    build = model_fn(plan["model"])
    ddlf.init(address=address)
    trainers = start_trainers(build, dataset, TrainConfig(workers=plan["k"], progress=False))
    try:
        w0 = ddlf.get(trainers[0].get_weights.remote())
        # Warm up (TF traces its functions on a trainer's first calls); not reported.
        train_sync(build, dataset, trainers=trainers, initial_weights=w0,
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
                result = train_sync(build, dataset, trainers=trainers,
                                    initial_weights=w0, **options)
                rows = [{k: r[k] for k in ("round", "epoch", "time_s", "wall_s", "compute_s",
                                           "overhead_s", "bytes_sent", "bytes_received", "test_accuracy")}
                        for r in result.history]
                print("RESULT " + json.dumps({"rate": rate, "codec": spec, "rows": rows,
                                              "total_s": time.perf_counter() - t0}), flush=True)
    finally:
        stop_trainers(trainers)
        ddlf.shutdown()


def caps_driver(address: str, plan: dict) -> None:
    """One spinning actor per node; the parent reads the nodes' cgroups at each phase's
    start and end (``SNAP``) and lifts the caps for the last phase (``CAP``)."""
    import ddlf_actors as ddlf

    @ddlf.remote(num_cpus=1)
    class Spinner:
        def pid(self) -> int:
            return os.getpid()

        def spin(self, seconds: float) -> dict:
            """Keep one CPU busy for ``seconds`` of wall time; the CPU this process got."""
            w0, c0 = time.perf_counter(), time.process_time()
            end = w0 + seconds
            while time.perf_counter() < end:
                pass
            return {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0}

    def ask(line: str) -> None:
        print(line, flush=True)
        if sys.stdin.readline().strip() != "OK":
            raise SystemExit(f"the parent did not answer {line!r}")

    k, seconds = plan["k"], plan["seconds"]
    ddlf.init(address=address)
    spinners = [Spinner.remote() for _ in range(k)]   # 1 CPU per node: one on each
    pids = ddlf.get([s.pid.remote() for s in spinners], timeout=120)
    phases = [("node 1 alone", [0]), ("all nodes", list(range(k))),
              ("node 1 alone, caps lifted", [0])]
    out = []
    for name, who in phases:
        if "lifted" in name:
            ask("CAP none")
        ask(f"SNAP {name}:start")
        got = ddlf.get([spinners[i].spin.remote(seconds) for i in who],
                       timeout=3 * seconds + 60)
        ask(f"SNAP {name}:end")
        out.append({"phase": name, "who": who, "actor": got})
    ask("CAP on")
    print("RESULT " + json.dumps({"pids": pids, "phases": out}), flush=True)
    ddlf.shutdown()


def allreduce_driver(address: str, plan: dict) -> None:
    from helpers_modules.numpy_trainer import NumpyTrainer

    import ddlf_actors as ddlf
    from benchmarks.training.allreduce_bench import SCHEMES, Workload, measure
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


def accuracy_table(results: list, target: float = TARGET) -> str:
    # Only evaluated rows have an accuracy (sync evaluates once per epoch by default).
    def evaluated(r):
        return [x["test_accuracy"] for x in r["rows"] if x["test_accuracy"] is not None]

    epochs = max(len(evaluated(r)) for r in results)
    out = ["| link | codec | " + " | ".join(f"acc eval {i + 1}" for i in range(epochs))
           + f" | time to {target} s | total s | MB/round |",
           "|---|---|" + "---:|" * (epochs + 3)]
    for r in results:
        accs = evaluated(r)
        accs += [None] * (epochs - len(accs))
        hit = next((x["time_s"] for x in r["rows"] if (x["test_accuracy"] or 0) >= target), None)
        mb = statistics.median(x["bytes_sent"] + x["bytes_received"] for x in r["rows"][1:]) / 1e6
        out.append(f"| {r['rate']} | {r['codec']} | "
                   + " | ".join("-" if a is None else f"{a:.4f}" for a in accs)
                   + f" | {'not reached' if hit is None else f'{hit:.1f}'} | "
                   f"{r['rows'][-1]['time_s']:.1f} | {mb:.3f} |")
    return "\n".join(out)


def caps_table(results: list, node_cpus: float) -> str:
    """Per phase and node: CPU over wall of the node's processes (its cgroup, between the
    phase's snapshots), of the spinning actor's process, and the share of cap periods
    throttled."""
    (r,) = results
    out = ["| phase | node | cap (CPU) | node's processes CPU s / wall s | spinner CPU s / "
           "wall s | periods throttled |", "|---|---:|---:|---:|---:|---:|"]
    for ph in r["phases"]:
        a, b = r["snaps"][ph["phase"] + ":start"], r["snaps"][ph["phase"] + ":end"]
        wall = b["t"] - a["t"]
        lifted = "lifted" in ph["phase"]
        for j, got in zip(ph["who"], ph["actor"]):
            periods = b["throttled"][j][0] - a["throttled"][j][0]
            throttled = b["throttled"][j][1] - a["throttled"][j][1]
            out.append(
                f"| {ph['phase']} | {j + 1} | {'none' if lifted else f'{node_cpus:g}'} | "
                f"{(b['cpu_s'][j] - a['cpu_s'][j]) / wall:.3f} | "
                f"{got['cpu_s'] / got['wall_s']:.3f} | "
                f"{'-' if not periods else f'{throttled}/{periods} ({throttled / periods:.0%})'} |")
    return "\n".join(out)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["codecs", "accuracy", "allreduce", "caps", "streaming",
                                    "scaling"])
    p.add_argument("--ks", help="allreduce (2,4,8), scaling (1,2,4,8): trainer counts")
    p.add_argument("--features", type=int, default=4096, help="allreduce: model inputs")
    p.add_argument("--repeats", type=int, default=3, help="allreduce: runs per scheme")
    p.add_argument("--samples", type=int, default=800,
                   help="allreduce: training rows (few: the rounds then wait on the links, "
                        "not on 8 trainers sharing this machine's cores)")
    p.add_argument("--k", type=int, help="trainer nodes (streaming: 4; others: 2)")
    p.add_argument("--rates", default="1gbit,100mbit", help="codecs: link rates (tc syntax)")
    p.add_argument("--rate", default="100mbit", help="accuracy: the link rate")
    p.add_argument("--codecs", help="comma-separated; a pair as down/up, e.g. fp16/topk:0.01")
    p.add_argument("--rounds", type=int, default=6, help="codecs: rounds per run")
    p.add_argument("--rounds-per-epoch",
                   help="30 for codecs, 1 for accuracy; 'auto': DDLF's default (~16 local "
                        "steps a round)")
    p.add_argument("--epochs", type=int,
                   help="epochs per run (accuracy, scaling: 5; streaming: 3)")
    p.add_argument("--target", type=float,
                   help=f"the target accuracy (accuracy: {TARGET}; streaming, scaling: 0.875)")
    p.add_argument("--model", help="paper_cnn, wide_cnn or wide_cnn:<filters1>-<filters2>-"
                                   "<dense> (default: streaming, scaling: wide_cnn; others: "
                                   "paper_cnn)")
    p.add_argument("--node-cpus", type=float,
                   help="cap each trainer node at this many CPUs (a cgroup each); "
                        "default: uncapped (caps: 0.5)")
    p.add_argument("--priority", type=float, default=8.0,
                   help="the run's CPU weight, in ordinary processes (with --node-cpus)")
    p.add_argument("--seconds", type=float, default=10.0, help="caps: seconds per phase")
    p.add_argument("--json", help="also write the results here (and each run as it ends to "
                                  "JSON.partial.jsonl)")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="streaming, scaling: print the table of a --json file or of its "
                        ".partial.jsonl (a grid cut short) instead of running")
    p.add_argument("--settings", help="streaming: comma-separated, of "
                   "sync,sync+codec,overlap,overlap+codec,overlap+frag,overlap+frag+codec,"
                   "allreduce,allreduce+codec,allreduce+overlap+codec,alg6 (default: all)")
    p.add_argument("--setting", default="allreduce+overlap+codec",
                   help="scaling: the best column's setting (comma-separated for several; "
                        "default: the fastest to the target on the streaming grid of "
                        "2026-11-27)")
    p.add_argument("--codec", default="int4:ef", help="streaming, scaling: the '+codec' codec")
    p.add_argument("--fragments", type=int, default=4, help="streaming: the '+frag' F")
    p.add_argument("--seeds", default="1,2,3", help="streaming, scaling: data-order seeds")
    p.add_argument("--evals-per-epoch", type=int,
                   help="streaming (4), scaling (8): evaluations per epoch (time to the target's "
                        "resolution)")
    p.add_argument("--max-rounds", type=int, default=0,
                   help="streaming, scaling: stop each run after this many rounds (a smoke "
                        "test; 0: the whole --epochs)")
    p.add_argument("--estimate", action="store_true",
                   help="streaming, scaling: print the grid's expected wall time and exit")
    scaling.add_arguments(p)
    a = p.parse_args(argv)
    streamed = a.mode == "streaming"
    # Defaults by mode, resolved after parsing: a value given on the command line always
    # wins (comparing against the other mode's default would drop an explicit
    # "--epochs 5" or "--target 0.85" for streaming).
    if a.mode in ("streaming", "scaling"):   # issue 23's workload unless told otherwise
        a.model = a.model or "wide_cnn"
        a.target = a.target if a.target is not None else 0.875
        a.rounds_per_epoch = a.rounds_per_epoch or "auto"
        model_fn(a.model)   # a bad --model fails here, before anything is built
    if a.mode == "scaling":   # issue 30 section 5: caps per K (scaling_plan), 5 epochs
        a.epochs = a.epochs if a.epochs is not None else 5
        a.evals_per_epoch = a.evals_per_epoch or 8
        signal.signal(signal.SIGTERM, _interrupted)
        signal.signal(signal.SIGHUP, _interrupted)
        return scaling.main(a)
    if streamed:
        a.node_cpus = a.node_cpus if a.node_cpus is not None else 0.5
        a.epochs = a.epochs if a.epochs is not None else 3
        a.evals_per_epoch = a.evals_per_epoch or 4
    else:
        a.model = a.model or "paper_cnn"
        a.target = a.target if a.target is not None else TARGET
        a.epochs = a.epochs if a.epochs is not None else 5
    ks = [int(k) for k in (a.ks or "2,4,8").split(",")]
    k = a.k or (4 if a.mode == "streaming" else 2)
    if streamed:
        settings = a.settings.split(",") if a.settings else emu_streaming.STREAMING
        for name in settings:
            emu_streaming.options_for(name, a.codec, a.fragments)   # a bad name fails here
        grid = {"rates": a.rates.split(","), "seeds": [int(x) for x in a.seeds.split(",")],
                "epochs": a.epochs, "codec": a.codec, "fragments": a.fragments}
        if a.from_file:
            results = load_results(a.from_file)
            print(f"{len(results)} run(s) from {a.from_file}")
            print(emu_streaming.streaming_table(results, a.target))
            return 0
        if a.estimate:
            secs = emu_streaming.estimate(grid, [k], settings)
            print(f"{a.mode}: {len(settings)} setting(s) x {len(grid['rates'])} rate(s) x "
                  f"{len(grid['seeds'])} seed(s) x K={k}, "
                  f"{a.epochs} epochs: about {secs / 3600:.1f} h")
            return 0

    from netns_cluster import netns_unavailable

    from benchmarks.emulation.cpu_caps import cgroup_unavailable

    node_cpus = a.node_cpus or (0.5 if a.mode == "caps" else None)   # 0: uncapped
    why = netns_unavailable() or (cgroup_unavailable() if node_cpus else None)
    if why:
        print(f"cluster_emu skipped: {why}")
        return 0
    if a.rounds_per_epoch == "auto":
        rounds_per_epoch = None
    else:
        rounds_per_epoch = int(a.rounds_per_epoch or (30 if a.mode == "codecs" else 1))
    model_fn(a.model)   # a bad --model fails here, before anything is built
    codecs = [c.replace("/", ",") for c in a.codecs.split(",")] if a.codecs else (
        CODECS if a.mode == "codecs" else ["none", "fp16", "topk:0.01"])
    plan = {"mode": a.mode, "k": k, "codecs": codecs,
            "rates": a.rates.split(",") if a.mode != "accuracy" else [a.rate],
            "features": a.features, "repeats": a.repeats, "samples": a.samples,
            "rounds": a.rounds, "epochs": 1 if a.mode == "codecs" else a.epochs,
            "rounds_per_epoch": rounds_per_epoch, "model": a.model, "target": a.target,
            "node_cpus": node_cpus, "priority": a.priority, "seconds": a.seconds}
    if streamed:
        plan.update(grid, settings=settings, evals_per_epoch=a.evals_per_epoch,
                    max_rounds=a.max_rounds)
    if a.json:
        plan["partial"] = a.json + ".partial.jsonl"
    # SIGTERM and SIGHUP as Ctrl-C: unwind through run()'s finally, which removes
    # everything.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGHUP, _interrupted)
    load = os.getloadavg()[0]
    if a.mode == "allreduce":
        results = [r for k in ks for r in run({**plan, "k": k}, os.path.abspath(__file__))]
    else:
        results = run(plan, os.path.abspath(__file__))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"plan": plan, "results": results}, f, indent=1)
    caps = f"nodes capped at {node_cpus:g} CPU" if node_cpus else "nodes uncapped"
    print(f"\nload average (1 min) {load:.2f} before, {os.getloadavg()[0]:.2f} after; {caps}")
    if a.mode == "allreduce":
        print(f"numpy softmax {a.features}x10 (model {4 * 10 * (a.features + 1):,} B), "
              f"medians of {a.repeats} alternating runs")
    elif a.mode == "caps":
        print(f"K={k} nodes, {a.seconds:g} s per phase")
        print(caps_table(results, node_cpus))
        return 0
    elif streamed:
        print(f"{a.model}, nodes at {node_cpus:g} CPU, DDLF's default rounds, "
              f"{a.evals_per_epoch} evaluations per epoch, {a.epochs} epochs"
              + (f" (stopped after {a.max_rounds} rounds)" if a.max_rounds else "")
              + f"; codec {a.codec}, fragments {a.fragments}; tbf links, no delay (no netem)")
        print(emu_streaming.streaming_table(results, a.target))
        return 0
    else:
        print(f"K={k}, {a.model}, batch 32, "
              f"{rounds_per_epoch or 'auto (DDLF default)'} rounds per epoch")
    table = {"codecs": codec_table, "accuracy": lambda r: accuracy_table(r, a.target),
             "allreduce": allreduce_table}
    print(table[a.mode](results))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "_driver":
        driver(sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(main())
