"""``cluster_emu.py streaming`` and ``scaling`` (issue 23 section 4): overlapped and
streamed averaging against blocking sync on emulated links, and how time to the target
scales with K. The parent's side (hosts, links, caps) is ``harness.run``; this module
holds what the driver runs there and the tables the parent prints.

    sudo python benchmarks/emulation/cluster_emu.py streaming [--k 4] [--rates 1gbit,100mbit]
        [--settings sync,overlap+codec,...] [--seeds 1,2,3] [--epochs 3]
    sudo python benchmarks/emulation/cluster_emu.py scaling [--ks 1,2,4] [--setting allreduce+overlap+codec]

Both default to the workload of issue 23 section 1: ``models.wide_cnn`` (5.1 M
parameters) on Fashion-MNIST, trainer nodes capped at 0.5 CPU, target 0.875, DDLF's
default rounds (~16 local steps), 4 evaluations per epoch on the whole test set.

Per run: **utilization** = every trainer's training compute (the rows'
``compute_total_s``) over K times the run's wall time (evaluations, ~1/K of the test set
4 times an epoch, are not counted as compute); **time to the target** = the ``time_s`` of
the first evaluated row at or above it (its resolution is a quarter of an epoch);
**accuracy after the fixed epochs** = the last row's. Tables give the median over the
seeds (each seed changes the data's order; every run starts from the same initial
weights, fetched once per cluster) with the load average beside them.

The links are ``tc tbf`` rate limits only: ``netem`` is not available here, so they add
no delay (a real WAN's tens of milliseconds of latency would cost the blocking settings
more per round than the overlapped ones).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

# name -> (scheme, options); "codec" is filled in with --codec.
SETTINGS = {
    "sync": ("sync", {}),
    "sync+codec": ("sync", {"compression": "codec"}),
    "overlap": ("sync", {"overlap": True}),
    "overlap+codec": ("sync", {"overlap": True, "compression": "codec"}),
    "overlap+frag": ("sync", {"overlap": True, "fragments": "frag"}),
    "overlap+frag+codec": ("sync", {"overlap": True, "fragments": "frag",
                                    "compression": "codec"}),
    "allreduce": ("allreduce", {}),
    "allreduce+codec": ("allreduce", {"compression": "codec"}),
    # The ring with overlap: no driver on the path, and the collective in the trainers'
    # threads while the next round's steps run.
    "allreduce+overlap+codec": ("allreduce", {"overlap": True, "compression": "codec"}),
    # The paper's Algorithm 6: one plain average per epoch.
    "alg6": ("sync", {"rounds_per_epoch": 1, "outer_momentum": 0.0, "lr_scaling": "none"}),
}
STREAMING = list(SETTINGS)
# DDLF's defaults (scheme="auto") with one setting more each, for scaling's best columns
# (issue 30): what that one setting adds to what a user gets. Not in the streaming grid.
SETTINGS.update({
    "auto+sqrt": ("auto", {"lr_scaling": "sqrt"}),
    # auto without its rate rule from K = 4: the defaults before it (what it adds).
    "auto+lr_scaling=none": ("auto", {"lr_scaling": "none"}),
    "auto+overlap": ("auto", {"overlap": True}),
    # auto with its steps per round given (it then picks the codec around them).
    "auto+steps16": ("auto", {"steps_per_round": 16}),
    "auto+steps32": ("auto", {"steps_per_round": 32}),
    "auto+sqrt+overlap": ("auto", {"lr_scaling": "sqrt", "overlap": True}),
    # auto with each trainer on 16 samples a step, half the batch (the noise-scale rule's
    # test at K = 8: K times the batch against the model's gradient noise scale).
    "auto+batch16": ("auto", {"batch_size": 16}),
})


def options_for(name: str, codec: str, fragments: int) -> tuple[str, dict]:
    """``(scheme, train options)`` of setting ``name``; KeyError naming the valid ones."""
    if name not in SETTINGS:
        raise SystemExit(f"unknown setting {name!r}; valid: {', '.join(SETTINGS)}")
    scheme, opts = SETTINGS[name]
    fill = {"codec": codec, "frag": fragments}
    return scheme, {k: fill.get(v, v) if isinstance(v, str) else v for k, v in opts.items()}


# -- the driver (its own namespace) --------------------------------------------------------------
def driver(address: str, plan: dict) -> None:
    """Every (rate, seed, setting) of ``plan`` on one cluster of K trainers, printing one
    ``RESULT`` line per run; seeds interleaved, so a change of load shows as spread."""
    import ddlf_actors as ddlf
    from benchmarks.emulation.harness import model_fn
    from benchmarks.protocol import cadence
    from ddlf_actors.apps import TrainConfig, train
    from ddlf_actors.apps.callbacks import Callback
    from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

    class StopAfter(Callback):
        def __init__(self, n):
            self.n = n

        def on_row(self, row, run):
            if self.n and row["round"] >= self.n:
                run.stop = True

    k, dataset = plan["k"], "fashion-mnist"
    build = model_fn(plan["model"])
    ddlf.init(address=address)
    trainers = start_trainers(build, dataset, TrainConfig(workers=k, progress=False))
    try:
        w0 = ddlf.get(trainers[0].get_weights.remote())
        num_train = ddlf.get(trainers[0].describe.remote())["num_train"]
        # Warm up (TF traces its functions on a trainer's first calls); not reported.
        train(build, dataset, "sync", trainers=trainers, initial_weights=w0, workers=k,
              progress=False, callbacks=[StopAfter(2)])
        for rate in plan["rates"]:
            print(f"RATE {rate}", flush=True)
            if sys.stdin.readline().strip() != "OK":
                raise SystemExit("the parent did not shape the links")
            for seed in plan["seeds"]:
                for name in plan["settings"]:
                    scheme, opts = options_for(name, plan["codec"], plan["fragments"])
                    every = cadence.eval_every(scheme, opts, k, num_train,
                                               plan["evals_per_epoch"])["eval_every"]
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    result = train(build, dataset, scheme, trainers=trainers,
                                   initial_weights=w0, workers=k, seed=seed,
                                   master_epochs=plan["epochs"], progress=False,
                                   eval_every=every,
                                   callbacks=[StopAfter(plan["max_rounds"])], **opts)
                    keys = ("round", "epoch", "time_s", "wall_s", "compute_s",
                            "compute_total_s", "eval_s", "overhead_s", "bytes_sent",
                            "bytes_received", "ring_bytes", "test_accuracy", "workers")
                    rows = [{key: r.get(key) for key in keys} for r in result.history]
                    print("RESULT " + json.dumps({
                        "rate": rate, "codec": name, "k": k, "seed": seed, "scheme": scheme,
                        "options": opts, "rows": rows, "total_s": time.perf_counter() - t0,
                        "load": [load, os.getloadavg()[0]]}), flush=True)
    finally:
        stop_trainers(trainers)
        ddlf.shutdown()


# -- a run's figures -----------------------------------------------------------------------------
def utilization(r: dict) -> float | None:
    """Training compute over K × wall time."""
    rows = r["rows"]
    wall = rows[-1]["time_s"] if rows else 0
    if not wall:
        return None
    return sum(x.get("compute_total_s") or 0.0 for x in rows) / (r["k"] * wall)


def steady_utilization(r: dict) -> float | None:
    """:func:`utilization` after the first row (which holds the run's start: the first
    weights sent whole, TensorFlow's first calls): what a long run tends to."""
    rows = r["rows"]
    if len(rows) < 3:
        return None
    wall = rows[-1]["time_s"] - rows[0]["time_s"]
    return sum(x.get("compute_total_s") or 0.0 for x in rows[1:]) / (r["k"] * wall)


def time_to(r: dict, target: float) -> float | None:
    return next((x["time_s"] for x in r["rows"] if (x["test_accuracy"] or 0) >= target), None)


def final_accuracy(r: dict) -> float | None:
    accs = [x["test_accuracy"] for x in r["rows"] if x["test_accuracy"] is not None]
    return accs[-1] if accs else None


def mb_per_round(r: dict) -> float:
    """The driver's link both ways, plus (allreduce) every member's ring sends, per round."""
    rows = r["rows"][1:] or r["rows"]
    return statistics.median((x["bytes_sent"] or 0) + (x["bytes_received"] or 0)
                             + (x.get("ring_bytes") or 0) for x in rows) / 1e6


def _median(values):
    got = [v for v in values if v is not None]
    if not got:
        return None
    return statistics.median(got)


def _fmt(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def _reached(runs: list, target: float, time_to=time_to) -> tuple[float | None, str]:
    """Median time to the target over the seeds, and how many reached it (``time_to``:
    a run's time to the target, by default an accuracy's, reached going up)."""
    times = [time_to(r, target) for r in runs]
    hit = [t for t in times if t is not None]
    med = statistics.median(hit) if len(hit) * 2 > len(times) else None
    return med, f"{len(hit)}/{len(times)}"


# -- tables (the parent) -------------------------------------------------------------------------
def streaming_table(results: list, target: float) -> str:
    """Per link and setting: medians over the seeds; ratios against blocking sync."""
    out = [f"| link | setting | seeds | utilization | after row 1 | time to {target} s | reached | "
           "vs sync | accuracy at the end | vs sync, points | s/epoch | MB/round | load avg |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    groups: dict = {}
    for r in results:
        groups.setdefault((r["rate"], r["codec"]), []).append(r)
    base = {}
    for (rate, name), runs in groups.items():
        if name == "sync":
            base[rate] = (_reached(runs, target)[0], _median(final_accuracy(r) for r in runs))
    for (rate, name), runs in groups.items():
        util = _median(utilization(r) for r in runs)
        tt, hits = _reached(runs, target)
        acc = _median(final_accuracy(r) for r in runs)
        epochs = max(x["epoch"] for x in runs[0]["rows"]) if runs[0]["rows"] else 0
        per_epoch = _median(r["rows"][-1]["time_s"] / max(epochs, 1e-9) for r in runs
                            if r["rows"])
        b_tt, b_acc = base.get(rate, (None, None))
        ratio = tt / b_tt if tt is not None and b_tt else None
        diff = 100 * (acc - b_acc) if acc is not None and b_acc is not None else None
        load = [v for r in runs for v in r["load"]]
        steady = _median(steady_utilization(r) for r in runs)
        out.append(f"| {rate} | {name} | {len(runs)} | {_fmt(util, '.0%')} | "
                   f"{_fmt(steady, '.0%')} | {_fmt(tt)} | "
                   f"{hits} | {_fmt(ratio, '.2f')}{'x' if ratio is not None else ''} | "
                   f"{_fmt(acc, '.4f')} | {_fmt(diff, '+.2f')} | {_fmt(per_epoch)} | "
                   f"{mb_per_round(runs[0]):.2f} | {min(load):.1f}-{max(load):.1f} |")
    return "\n".join(out)


def scaling_table(results: list, target: float) -> str:
    """Per link and K: median time to the target and the efficiency T1 / (K·TK)."""
    out = [f"| link | setting | K | seeds | time to {target} s | reached | efficiency T1/(K·TK) | "
           "utilization | after row 1 | accuracy at the end | s/epoch | load avg |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    groups: dict = {}
    for r in results:
        groups.setdefault((r["rate"], r["codec"], r["k"]), []).append(r)
    t1 = {(rate, name): _reached(runs, target)[0]
          for (rate, name, k), runs in groups.items() if k == 1}
    for (rate, name, k), runs in sorted(groups.items()):
        tt, hits = _reached(runs, target)
        base = t1.get((rate, name))
        eff = base / (k * tt) if base and tt else None
        epochs = max(x["epoch"] for x in runs[0]["rows"]) if runs[0]["rows"] else 0
        per_epoch = _median(r["rows"][-1]["time_s"] / max(epochs, 1e-9) for r in runs
                            if r["rows"])
        load = [v for r in runs for v in r["load"]]
        out.append(f"| {rate} | {name} | {k} | {len(runs)} | {_fmt(tt)} | {hits} | "
                   f"{_fmt(eff, '.0%')} | {_fmt(_median(utilization(r) for r in runs), '.0%')} | "
                   f"{_fmt(_median(steady_utilization(r) for r in runs), '.0%')} | "
                   f"{_fmt(_median(final_accuracy(r) for r in runs), '.4f')} | "
                   f"{_fmt(per_epoch)} | {min(load):.1f}-{max(load):.1f} |")
    return "\n".join(out)


def round_seconds(scheme: str, opts: dict, k: int, mbit: float, work: float,
                  model_mb: float = 20.4) -> float:
    """A round's seconds by a plain model: ``work`` seconds of compute; a blocking sync
    round also waits for K weight copies down and K deltas up through the driver's link
    one after the other, an overlapped one for the larger of its compute and one
    direction (the link is full duplex); an allreduce member sends 2(K−1)/K of the model
    over its own link (``auto``: the ring with int8, what it takes on slow links). A codec
    divides the bytes by 7.5 (int4)."""
    ratio = 7.5 if opts.get("compression") else 1.0
    if scheme in ("allreduce", "auto"):
        if scheme == "auto" and not opts.get("compression"):
            ratio = 3.9
        return work + 2 * (k - 1) / k * model_mb * 8 / mbit / ratio
    if opts.get("overlap"):
        return max(work, k * model_mb * 8 / mbit / ratio)
    return work + 2 * k * model_mb * 8 / mbit / ratio


def estimate(plan: dict, ks: list[int], settings: list[str]) -> float:
    """Seconds a grid should take, by a plain model of issue 23's workload (README,
    ``link_workload.py``): 1.1 s of compute per 32 steps at 0.5 CPU, DDLF's default rounds
    (``STEPS_PER_ROUND``), fragments F times as many of 1/F the steps, each round as
    :func:`round_seconds`. Times 1.3 (evaluations, and what the K = 2 smoke runs took
    beyond the model: 0-35 % a round), 15 s a run (its first round) and 2 minutes per
    cluster to start."""
    from ddlf_actors.apps.schemes.rounds import STEPS_PER_ROUND

    compute = 1.1     # seconds per 32 steps of batch 32
    total = 0.0
    for k in ks:
        total += 120
        for rate in plan["rates"]:
            mbit = 1000.0 if rate.startswith("1g") else 100.0
            for name in settings:
                scheme, opts = options_for(name, plan["codec"], plan["fragments"])
                steps = 60000 / k / 32                       # per trainer per epoch
                rounds = opts.get("rounds_per_epoch") or max(1, round(steps / STEPS_PER_ROUND))
                work = compute * steps / 32 / rounds         # compute per round
                per_round = round_seconds(scheme, opts, k, mbit, work)
                total += (1.3 * plan["epochs"] * rounds * per_round + 15) * len(plan["seeds"])
    return total


def save(path: str | None, plan: dict, results: list) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"plan": plan, "results": results}, f, indent=1)
