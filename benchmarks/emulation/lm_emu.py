"""The GPT on emulated nodes (issue 32 §4, the scaling issue's harness): K = 1, 2, 4
trainer nodes of 0.5 CPU, links of 100 Mbit/s and 1 Gbit/s, time to a target loss.

    sudo python benchmarks/emulation/lm_emu.py [--ks 1,2,4] [--rates 100mbit,1gbit] \\
        [--settings defaults,allreduce+overlap+codec] [--seeds 1,2,3] [--epochs 1] \\
        [--target 1.9] [--size small] [--context 128] [--json lm_emu.json]
    sudo python benchmarks/emulation/lm_emu.py --ks 1,2 --rates 1gbit --settings defaults \\
        --seeds 1 --size tiny --context 64 --max-rounds 4                # a smoke run
    python benchmarks/emulation/lm_emu.py --estimate [...]               # the grid's hours

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

**Not built here**: the torchft DiLoCo column across K emulated hosts.
``link_hosts.py`` emulates two hosts (``peers/torch_compare.py --link``); K = 4 needs its
hosts generalised to K. Until then the DiLoCo comparison is at K = 2 through
``torch_compare.py``'s harness.

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
import statistics
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
    if name == "dataparallel":   # the data-parallel column: an all-reduce a step
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


def time_to(r: dict, target: float) -> float | None:
    """Training seconds to the first evaluation at or under ``target``. Runs recorded
    before ``train_s`` (the preview of cd0366e) count their rows' ``time_s``."""
    return next((x.get("train_s", x["time_s"]) for x in r["rows"]
                 if x["test_loss"] is not None and x["test_loss"] <= target), None)


def final_loss(r: dict) -> float | None:
    losses = [x["test_loss"] for x in r["rows"] if x["test_loss"] is not None]
    return losses[-1] if losses else None


def table(results: list, target: float) -> str:
    """Per link, setting and K: medians over the seeds, efficiency against K = 1."""
    med = emu_streaming._median
    fmt = emu_streaming._fmt
    out = [f"| link | setting | K | seeds | time to loss {target} s | reached | efficiency "
           "T1/(K·TK) | utilization | loss at the end | s/epoch | MB/round | load avg |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    groups: dict = {}
    for r in results:
        groups.setdefault((r["rate"], r["codec"], r["k"]), []).append(r)

    def reached(runs):
        times = [time_to(r, target) for r in runs]
        hit = [t for t in times if t is not None]
        return (statistics.median(hit) if len(hit) * 2 > len(times) else None,
                f"{len(hit)}/{len(times)}")

    t1 = {(rate, name): reached(runs)[0] for (rate, name, k), runs in groups.items() if k == 1}
    # A setting without its own K = 1 (data-parallel, or a link not run at K = 1) is
    # against the tuned K = 1: DDLF's defaults on one trainer, which sends nothing, so its
    # time is the same on every link.
    alone = [t for (rate, name), t in sorted(t1.items()) if name == "defaults" and t]
    for (rate, name, k), runs in sorted(groups.items()):
        tt, hits = reached(runs)
        base = t1.get((rate, name)) or (alone[0] if alone else None)
        eff = base / (k * tt) if base and tt else None
        epochs = max(x["epoch"] for x in runs[0]["rows"]) if runs[0]["rows"] else 0
        per_epoch = med(r["rows"][-1].get("train_s", r["rows"][-1]["time_s"]) / max(epochs, 1e-9) for r in runs if r["rows"])
        load = [v for r in runs for v in r["load"]]
        out.append(f"| {rate} | {name} | {k} | {len(runs)} | {fmt(tt)} | {hits} | "
                   f"{fmt(eff, '.0%')} | "
                   f"{fmt(med(emu_streaming.utilization(r) for r in runs), '.0%')} | "
                   f"{fmt(med(final_loss(r) for r in runs), '.4f')} | {fmt(per_epoch)} | "
                   f"{emu_streaming.mb_per_round(runs[0]):.2f} | "
                   f"{min(load):.1f}-{max(load):.1f} |")
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
                if "allreduce" in name or name == "defaults":   # auto runs the ring
                    per_round = 2 * (k - 1) / max(k, 1) * params * 4 * 8 / (mbit * 1e6) / ratio
                total += (1.2 * compute + rounds * per_round + 30) * len(plan["seeds"])
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ks", default="1,2,4")
    p.add_argument("--rates", default="100mbit,1gbit")
    p.add_argument("--settings", default="defaults,allreduce+overlap+codec",
                   help="defaults (DDLF's: scheme auto) or of emu_streaming.SETTINGS")
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
    a = p.parse_args(argv)
    ks = [int(k) for k in a.ks.split(",")]
    settings = a.settings.split(",")
    for name in settings:
        setting(name, a.codec)
    plan = {"mode": "lm", "rates": a.rates.split(","), "settings": settings,
            "seeds": [int(s) for s in a.seeds.split(",")], "epochs": a.epochs,
            "codec": a.codec, "size": a.size, "context": a.context, "node_cpus": a.node_cpus,
            "priority": a.priority, "evals_per_epoch": a.evals_per_epoch,
            "max_rounds": a.max_rounds, "eval_windows": a.eval_windows}
    if a.estimate:
        print(f"about {estimate(plan, ks) / 3600:.1f} h")
        return 0
    target = a.target
    if target is None and a.choices:
        with open(a.choices) as f:
            target = json.load(f).get("target_loss")
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
    results = [r for k in ks for r in run({**plan, "k": k}, os.path.abspath(__file__))]
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
