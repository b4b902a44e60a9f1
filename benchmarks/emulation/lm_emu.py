"""The GPT on emulated nodes (issue 32 §4, the scaling issue's harness): K = 1, 2, 4
trainer nodes of 0.5 CPU, links of 100 Mbit/s and 1 Gbit/s, time to a target loss.

    sudo python benchmarks/emulation/lm_emu.py [--ks 1,2,4] [--rates 100mbit,1gbit] \\
        [--settings defaults,dataparallel,torchft-diloco] [--seeds 1,2,3] [--epochs 1] \\
        [--target 1.9] [--size small] [--context 128] [--json lm_emu.json]
    sudo python benchmarks/emulation/lm_emu.py --ks 1,2 --rates 1gbit --settings defaults \\
        --seeds 1 --size tiny --context 64 --max-rounds 4                # a smoke run
    python benchmarks/emulation/lm_emu.py --estimate [...]               # the grid's hours
    python benchmarks/emulation/lm_emu.py --from a.json,b.json --target 2.6968  # a table

The emulation harness (``harness.run``) builds the hosts (one network namespace each, a
``tc tbf`` link of the rate both ways, each trainer node in a cgroup of ``--node-cpus``),
starts a head and K nodes, and runs this script's :func:`driver` in the driver's host
(``lm_emu.py _driver ADDRESS PLAN``), which trains ``lm.GptModelFn`` (PyTorch, ``--size``)
on Debian's fortunes (byte tokens, windows of ``--context``) with each setting:
``defaults`` (DDLF's defaults: ``train()`` given no scheme, that is ``scheme="auto"``, as
the scaling issue leaves them) or one of ``emu_streaming.SETTINGS``
(``allreduce+overlap+codec``: the ring for slow links, int4 with error feedback; ``sync``:
the star), seeds interleaved, evaluating on the validation split 16 times an epoch. Every
run starts its own trainers (``train()`` without ``trainers=``), so each starts from its
seed's initial weights (the same at every K) with a fresh optimizer, and its cosine decays
over its own steps. Reusing one pool of trainers restored the weights but not the
optimizer: a later seed started from the previous run's Adam moments and decayed rate.
Times are training time: the rounds' wall time minus the trainers' evaluations in them,
the trainers' start-up reported apart, as ``lm_compare.py`` counts them.

Per (link, setting, K): the median time to ``--target`` (a validation loss: the tuned
single process's after one epoch, from ``training/lm_compare.py --select``'s choices, or
given), the efficiency T1/(K·TK) against the same setting at K = 1 (the tuned K = 1 is a
trainer alone: no other trainer to wait for, its link idle), utilization, the loss after
the budget and seconds per epoch. The issue's targets: K = 4 at 100 Mbit/s reaches the
target at >= 70 % efficiency and in <= 1.0x torchft DiLoCo's time under the same links.

``dataparallel`` is the issue's data-parallel column: ``train(..., "dataparallel")``, a
gradient all-reduce over the ring every step, each trainer on a batch of 32 (as
``lm_compare.py``'s DDP ranks), the model's own rate (1e-3, the rate the 2-core table
chose for DDP; not chosen again at each K). Without a K = 1 of its own, a setting's
efficiency is against the defaults' K = 1.

``torchft-diloco`` is the issue's DiLoCo column (:func:`diloco_runs`): torchft's
``DiLoCo`` as ``lm_compare.py`` runs it on 2 cores (the model's AdamW inside, outer SGD
0.7 Nesterov 0.9, a sync every 16 steps, 32 windows a step per replica), one replica in
each of K hosts of the same namespaces, links and caps, the lighthouse in host 0. It
evaluates after a sync (the only time its replicas hold one model), so its first
evaluation past each point of the grid can come up to 16 steps late.

Durations: a ``small`` GPT trainer at 0.5 CPU makes about 950 tokens/s (half of the 1,892
tokens per CPU second ``training/lm_frameworks.py --size small`` measured), so one epoch
(2.29 M tokens) takes ~40 min at K = 1, ~20 at K = 2, ~10 at K = 4 when the links keep up;
the default grid (2 rates x 2 settings x 3 seeds x K = 1, 2, 4, one epoch) is about 18 h,
``--epochs 0.25`` about 5 h. ``--estimate`` prints a grid's time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _p in (os.path.join(ROOT, "tests"), ROOT):   # netns_cluster; benchmarks.* from the checkout
    if _p not in sys.path:
        sys.path.insert(0, _p)

from benchmarks.emulation import cluster_emu, emu_streaming  # noqa: E402
from benchmarks.emulation.harness import run  # noqa: E402

# tokens/s of one trainer at 0.5 CPU: half of lm_frameworks.py's tokens per CPU second at
# one thread (tiny 8,766; small 1,892: results/lm_frameworks*_2026-11-28.json).
TRAINER_RATE = {"tiny": 4_400.0, "small": 950.0}
TOKENS = 2_291_436   # fortunes' training split, bytes


def setting(name: str, codec: str) -> tuple[str, dict]:
    """``(scheme, train options)`` of setting ``name``: ``defaults`` is exactly what
    ``train()`` runs when given nothing; the others are ``emu_streaming``'s."""
    if name == "defaults":
        from benchmarks.protocol import cadence

        return cadence.default_scheme(), {}
    if name == "dataparallel":   # the issue's data-parallel column: an all-reduce a step
        return "dataparallel", {}
    return emu_streaming.options_for(name, codec, 1)


def driver(address: str, plan: dict) -> None:
    """Every (rate, seed, setting) of ``plan`` on one cluster of K trainers, one
    ``RESULT`` line per run (``harness.run`` reads them)."""
    import ddlf_actors as ddlf
    from benchmarks.protocol import cadence, ran
    from ddlf_actors.apps import datasets, lm, train
    from ddlf_actors.apps.callbacks import Callback

    class StopAt(Callback):
        def __init__(self, epochs, rounds):
            self.epochs, self.rounds = epochs, rounds

        def on_row(self, row, run):
            if row["epoch"] >= self.epochs - 1e-9 or (self.rounds and row["round"] >= self.rounds):
                run.stop = True

    k = plan["k"]
    ds = datasets.corpus("fortunes", context=plan["context"],
                         eval_windows=plan["eval_windows"]).prepare()
    steps = lm.steps_per_trainer(ds.windows("train"), k, 32, 1)
    num_train = ds.windows("train")
    ddlf.init(address=address)
    try:
        for rate in plan["rates"]:
            print(f"RATE {rate}", flush=True)
            if sys.stdin.readline().strip() != "OK":
                raise SystemExit("the parent did not shape the links")
            for seed in plan["seeds"]:
                for name in plan["settings"]:
                    scheme, opts = setting(name, plan["codec"])
                    build = lm.GptModelFn(ds, framework="torch", size=plan["size"],
                                          total_steps=max(1, round(steps * plan["epochs"])),
                                          batch_size=32, seed=seed)
                    # evals_per_epoch evaluations within a budget of less than an epoch too
                    per_epoch = cadence.evals_per_epoch(plan["evals_per_epoch"],
                                                        plan["epochs"])
                    when = cadence.evaluations(scheme, opts, k, num_train, per_epoch)
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    result = train(build, ds, scheme, workers=k, seed=seed, progress=False,
                                   **when,
                                   master_epochs=max(1, int(-(-plan["epochs"] // 1))),
                                   callbacks=[StopAt(plan["epochs"], plan["max_rounds"])],
                                   **opts)
                    keys = ("round", "epoch", "time_s", "wall_s", "eval_s", "compute_total_s",
                            "bytes_sent", "bytes_received", "ring_bytes", "test_loss",
                            "bits_per_byte", "tokens", "workers")
                    rows, train_s = [], 0.0
                    for r in result.history:
                        train_s += float(r.get("wall_s") or 0.0) - float(r.get("eval_s") or 0.0)
                        rows.append({**{key: r.get(key) for key in keys}, "train_s": train_s})
                    print("RESULT " + json.dumps({
                        "rate": rate, "codec": name, "k": k, "seed": seed, "scheme": scheme,
                        "options": opts, "ran": ran.describe_run(result), "rows": rows,
                        "startup_s": result.startup_s,
                        "batch_size": result.config.batch_size,
                        "auto": (result.settings.get("auto") or {}).get("line"),
                        "total_s": time.perf_counter() - t0,
                        "load": [load, os.getloadavg()[0]]}), flush=True)
    finally:
        ddlf.shutdown()


DILOCO = "torchft-diloco"


def diloco_runs(plan: dict, ks: list) -> list:
    """The torchft DiLoCo column: ``lm_compare.py``'s replicas (the model's AdamW inside,
    outer SGD 0.7 Nesterov 0.9, a sync every 16 steps, a batch of 32 each), one in each
    of K hosts of ``node_cpus`` (``link_hosts.LinkHosts``: the same namespaces, ``tbf``
    links and cgroups as the DDLF runs), the lighthouse and barrier store in host 0, as
    the driver and head are for DDLF. Seeds in order per link; one result per run, in the
    DDLF runs' form. K = 1 is not run: the efficiency is against the defaults' K = 1."""
    import argparse

    from benchmarks.emulation.link_hosts import LinkHosts
    from benchmarks.peers.torchft_diloco import linked_diloco
    from benchmarks.protocol import cadence
    from benchmarks.training import lm_compare

    script = os.path.abspath(lm_compare.__file__)
    out = []
    for k in (k for k in ks if k > 1):
        for rate in plan["rates"]:
            hosts = LinkHosts(rate, host_cpus=plan["node_cpus"], priority=plan["priority"],
                              n=k + 1).up()
            try:
                for seed in plan["seeds"]:
                    args = argparse.Namespace(
                        # evaluated on the validation split, as the DDLF runs here are
                        seed=seed, lr=plan["diloco_lr"], epochs=plan["epochs"], split="val",
                        evals_per_epoch=cadence.evals_per_epoch(plan["evals_per_epoch"],
                                                                plan["epochs"]),
                        sync_every=16, timeout=plan["diloco_timeout"], eval_threads=1,
                        size=plan["size"], context=plan["context"],
                        eval_windows=plan["eval_windows"])
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    try:
                        got = linked_diloco(args, hosts, script, replica_hosts=range(1, k + 1),
                                            flags=lm_compare.child_flags(args))
                    finally:
                        hosts.end_run()
                    r = {"rate": rate, "codec": DILOCO, "k": k, "seed": seed,
                         "scheme": DILOCO, "total_s": time.perf_counter() - t0,
                         "load": [load, os.getloadavg()[0]]}
                    if "timeline" not in got:
                        print(f"  {DILOCO} K={k} {rate} seed {seed}: "
                              f"{got.get('error') or got.get('unavailable')}", file=sys.stderr)
                        out.append({**r, "rows": [], "error": got.get("error")
                                    or got.get("unavailable")})
                        continue
                    out.append({**r, "startup_s": got["startup_s"], "rows": [
                        {"epoch": row["epoch"], "train_s": row["train_s"],
                         "time_s": row["train_s"], "test_loss": row["test_loss"]}
                        for row in got["timeline"]]})
                    if plan.get("partial"):
                        with open(plan["partial"], "a") as f:
                            f.write(json.dumps(out[-1]) + "\n")
                    print(f"  {DILOCO} K={k} {rate} seed {seed}: done in "
                          f"{out[-1]['total_s']:.1f} s", file=sys.stderr)
            finally:
                hosts.close()
    return out


def _first_at(r: dict, target: float) -> dict | None:
    """The run's first evaluated row at or under ``target``."""
    return next((x for x in r["rows"]
                 if x["test_loss"] is not None and x["test_loss"] <= target), None)


def time_to(r: dict, target: float) -> float | None:
    """Training seconds to the first evaluation at or under ``target``. Runs recorded
    before ``train_s`` (the preview of cd0366e) count their rows' ``time_s``."""
    x = _first_at(r, target)
    return None if x is None else x.get("train_s", x["time_s"])


def epochs_to(r: dict, target: float) -> float | None:
    """Epochs to the first evaluation at or under ``target``."""
    x = _first_at(r, target)
    return None if x is None else x["epoch"]


def final_loss(r: dict) -> float | None:
    losses = [x["test_loss"] for x in r["rows"] if x["test_loss"] is not None]
    return losses[-1] if losses else None


def groups(results: list, target: float) -> list:
    """Per link, setting and K (sorted): medians over the seeds, the efficiency against
    K = 1 (the setting's own, or the defaults'), as a dict each; :func:`table`'s rows and
    ``report.py``'s facts."""
    med = emu_streaming._median
    by: dict = {}
    for r in results:
        by.setdefault((r["rate"], r["codec"], r["k"]), []).append(r)

    t1 = {(rate, name): emu_streaming._reached(runs, target, time_to)[0]
          for (rate, name, k), runs in by.items() if k == 1}
    # A setting without its own K = 1 (data-parallel, or a link not run at K = 1) is
    # against the tuned K = 1: DDLF's defaults on one trainer, which sends nothing, so its
    # time is the same on every link.
    alone = [t for (rate, name), t in sorted(t1.items()) if name == "defaults" and t]
    out = []
    for (rate, name, k), runs in sorted(by.items()):
        tt, hits = emu_streaming._reached(runs, target, time_to)
        base = t1.get((rate, name)) or (alone[0] if alone else None)
        epochs = max((x["epoch"] for r in runs for x in r["rows"]), default=0)
        # torchft's replicas report neither their compute nor the driver's bytes
        counted = [r for r in runs if r["rows"] and "compute_total_s" in r["rows"][0]]
        out.append({
            "rate": rate, "setting": name, "k": k, "seeds": len(runs), "time": tt,
            "epochs": med(epochs_to(r, target) for r in runs), "reached": hits,
            "efficiency": base / (k * tt) if base and tt else None,
            "utilization": med(emu_streaming.utilization(r) for r in counted),
            "final_loss": med(final_loss(r) for r in runs),
            "s_per_epoch": med(r["rows"][-1].get("train_s", r["rows"][-1]["time_s"])
                               / max(epochs, 1e-9) for r in runs if r["rows"]),
            "mb_per_round": emu_streaming.mb_per_round(counted[0]) if counted else None,
            "load": [v for r in runs for v in r["load"]]})
    return out


def table(results: list, target: float) -> str:
    """Per link, setting and K: medians over the seeds, efficiency against K = 1."""
    fmt = emu_streaming._fmt
    out = [f"| link | setting | K | seeds | time to loss {target:.4f} s | epochs to it | "
           "reached | efficiency T1/(K·TK) | utilization | loss at the end | s/epoch | "
           "MB/round | load avg |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for g in groups(results, target):
        out.append(f"| {g['rate']} | {g['setting']} | {g['k']} | {g['seeds']} | "
                   f"{fmt(g['time'])} | {fmt(g['epochs'], '.3f')} | {g['reached']} | "
                   f"{fmt(g['efficiency'], '.0%')} | {fmt(g['utilization'], '.0%')} | "
                   f"{fmt(g['final_loss'], '.4f')} | {fmt(g['s_per_epoch'])} | "
                   f"{fmt(g['mb_per_round'], '.2f')} | "
                   f"{min(g['load']):.1f}-{max(g['load']):.1f} |")
    return "\n".join(out)


def estimate(plan: dict, ks: list) -> float:
    """Seconds: each run trains ``epochs`` of the corpus at K trainers of
    ``TRAINER_RATE`` tokens/s (the links' time on top for plain sync at 100 Mbit/s: K
    copies of the model each way per ~16 steps), plus 2 minutes per cluster."""
    rate = TRAINER_RATE.get(plan["size"], 450.0)
    params = {"tiny": 0.84e6, "small": 6.1e6}.get(plan["size"], 6.1e6)
    total = 0.0
    for k in ks:
        total += 120
        for link in plan["rates"]:
            mbit = 1000.0 if link.startswith("1g") else 100.0
            for name in plan["settings"]:
                compute = TOKENS * plan["epochs"] / (k * rate)
                rounds = TOKENS * plan["epochs"] / (k * 32 * plan["context"] * 16)
                ratio = 7.5 if "codec" in name else 1.0
                per_round = 2 * k * params * 4 * 8 / (mbit * 1e6) / ratio
                if "allreduce" in name or name in ("defaults", DILOCO):   # a ring, or gloo's
                    per_round = 2 * (k - 1) / max(k, 1) * params * 4 * 8 / (mbit * 1e6) / ratio
                if name == "dataparallel":   # the gradient's ring every step, 16 a "round"
                    per_round = 16 * 2 * (k - 1) / max(k, 1) * params * 4 * 8 / (mbit * 1e6)
                if name == DILOCO and k == 1:   # not run: against the defaults' K = 1
                    continue
                total += (1.2 * compute + rounds * per_round + 30) * len(plan["seeds"])
    return total


def print_from(paths: list, target: float | None, choices: str | None) -> int:
    """The table of the runs in ``paths`` (``--json`` files), against ``target`` or the
    choices' target loss."""
    import gzip

    results = []
    for path in paths:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            results += json.load(f)["results"]
    if target is None and choices:
        with open(choices) as f:
            target = json.load(f).get("target_loss")
    if target is None:
        raise SystemExit("--from needs --target or --choices (the target loss)")
    print(table(results, target))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ks", default="1,2,4")
    p.add_argument("--rates", default="100mbit,1gbit")
    p.add_argument("--settings", default=f"defaults,dataparallel,{DILOCO}",
                   help="defaults (DDLF's: scheme auto), dataparallel, torchft-diloco "
                        "(torchft's DiLoCo on the same hosts) or of emu_streaming.SETTINGS")
    p.add_argument("--codec", default="int4:ef")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--target", type=float, help="a validation loss (default: --choices')")
    p.add_argument("--choices", help="lm_compare.py --select's file (its target_loss)")
    p.add_argument("--size", default="small")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--node-cpus", type=float, default=0.5)
    p.add_argument("--priority", type=float, default=8.0)
    p.add_argument("--evals-per-epoch", type=int, default=16)
    p.add_argument("--max-rounds", type=int, default=0, help="a smoke run: rounds per run")
    p.add_argument("--eval-windows", type=int,
                   help="evaluate on the validation split's first N windows (smoke runs)")
    p.add_argument("--json")
    p.add_argument("--estimate", action="store_true")
    p.add_argument("--from", dest="from_", metavar="FILES",
                   help="print the table of these --json files' runs (comma-separated, "
                        ".gz allowed) instead of running anything")
    a = p.parse_args(argv)
    ks = [int(k) for k in a.ks.split(",")]
    settings = a.settings.split(",")
    for name in settings:
        if name != DILOCO:
            setting(name, a.codec)
    plan = {"mode": "lm", "rates": a.rates.split(","), "settings": settings,
            "seeds": [int(s) for s in a.seeds.split(",")], "epochs": a.epochs,
            "codec": a.codec, "size": a.size, "context": a.context, "node_cpus": a.node_cpus,
            "priority": a.priority, "evals_per_epoch": a.evals_per_epoch,
            "max_rounds": a.max_rounds, "eval_windows": a.eval_windows,
            "diloco_lr": 1e-3, "diloco_timeout": 3 * 3600.0}
    if a.estimate:
        print(f"about {estimate(plan, ks) / 3600:.1f} h")
        return 0
    if a.from_:
        return print_from(a.from_.split(","), a.target, a.choices)
    target = a.target
    if a.choices:
        with open(a.choices) as f:
            choices = json.load(f)
        target = choices.get("target_loss") if target is None else target
        # torchft DiLoCo's rate as the 2-core table chose it (lm_compare.py --select)
        plan["diloco_lr"] = choices.get(DILOCO, {}).get("lr", plan["diloco_lr"])
    from netns_cluster import netns_unavailable

    from benchmarks.emulation.cpu_caps import cgroup_unavailable

    why = netns_unavailable() or cgroup_unavailable()
    if why:
        print(f"lm_emu skipped: {why}")
        return 0
    if a.json:
        plan["partial"] = a.json + ".partial.jsonl"
    signal.signal(signal.SIGTERM, cluster_emu._interrupted)
    signal.signal(signal.SIGHUP, cluster_emu._interrupted)
    ddlf_settings = [name for name in settings if name != DILOCO]
    results = [r for k in ks if ddlf_settings
               for r in run({**plan, "settings": ddlf_settings, "k": k},
                            os.path.abspath(__file__))]
    if DILOCO in settings:
        results += diloco_runs(plan, ks)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"plan": plan, "results": results}, f, indent=1)
    print(f"GPT {a.size} (PyTorch), fortunes, context {a.context}, nodes at {a.node_cpus:g} "
          f"CPU, {a.epochs:g} epoch(s)" + (f" (stopped after {a.max_rounds} rounds)"
                                           if a.max_rounds else "")
          + "; tbf links, no delay")
    print(table(results, target if target is not None else float("-inf")))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "_driver":   # harness.run, in the driver's host
        driver(sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(main())
