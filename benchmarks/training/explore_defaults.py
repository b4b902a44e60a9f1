"""Choosing DDLF's sync defaults on a validation split, against a tuned single process
(issue 21, section 2). One script, one table per command.

Every run here trains on the first 50,000 Fashion-MNIST training images and evaluates on
the last 10,000 (the *validation* split); the test set is never loaded. The model is the
paper CNN (``models.paper_cnn``), batch 32 (per trainer unless a run says ``batch=``),
built after ``keras.utils.set_random_seed(seed)``; ``seed`` also sets the data order
(Keras ``fit``'s shuffle for one process, ``train_sync(seed=)``'s permutations for DDLF).
Each run is its own process (thread counts are fixed at TensorFlow's first op), one at a
time, under ``nice -n 10``.

    python benchmarks/training/explore_defaults.py baseline [--opts OPT ...] [--seeds 0 1 2] [--batch 32]
        one process, 2 TF threads, Keras ``fit``: by default SGD momentum 0.9 at lr
        0.01/0.03/0.1 and Adam at 3e-4/1e-3/3e-3
    python benchmarks/training/explore_defaults.py ddlf CONFIG [CONFIG ...] [--seeds 0 1 2]
        DDLF ``train_sync``, K = 2 trainers x 1 TF thread; CONFIG, e.g.
        "in=adam:1e-3 out=nag:0.9:0.7 steps=16" (grammar below)
    python benchmarks/training/explore_defaults.py compare --single OPT --ddlf CONFIG [CONFIG ...] --seeds 0 1 2
        per seed, the single process and each DDLF CONFIG in turn (the order reversed every
        other seed), each to the target: epochs, seconds per epoch, time to the target, and
        the ratio per seed and its median, with the load average
    python benchmarks/training/explore_defaults.py speed --single OPT --ddlf CONFIG [--reps 3]
        seconds per epoch, 1 epoch each, no evaluation inside, alternated: one process with
        2 threads on 50,000 images, one with 1 thread on 25,000 (a trainer's share), two of
        those at once, DDLF with one train_on_batch per batch (before) and with
        ``keras_steps.fit_steps`` (after); wall and CPU seconds
    python benchmarks/training/explore_defaults.py profile [--opts OPT ...] [--batch 32] [--reps 3]
        a trainer's round piece by piece, at 1 and 2 threads: per step, train_on_batch,
        fit_steps and Keras fit (and each one's first call, which traces); per round,
        set/get weights, the gather, the delta; evaluation of 5,000 images

Common options: ``--target 0.85`` (validation accuracy; runs stop there unless
``--no-stop``), ``--epochs 2`` (at most), ``--evals 24`` (evaluations per epoch, both
sides: DDLF every ``round(rounds/24)`` rounds), ``--json FILE`` (append every run's
record), ``--nice 10``.

CONFIG grammar (space- or comma-separated ``key=value``):

    defaults    ``train_sync`` with no scheme option and ``models.paper_cnn`` as it
                compiles (with it only fit= and batch= may be given)
    in=OPT      the trainers' optimizer: sgd:LR | sgdm:LR (momentum 0.9) | nag:LR (Nesterov
                0.9) | adam:LR | adamw:LR[:WD]; default sgd:0.01 (the paper's)
    out=OUTER   the driver's step: avg (plain average) | nag:MU:LR | hb:MU:LR | lr:LR (no
                momentum); LR ending in K (0.5K) is LR x K by the linear scaling rule
                (lr_scaling='outer', warmed up over half an epoch's rounds); default avg
    scale=inner the linear scaling rule on the trainers' rate instead (lr_scaling='inner')
    steps=N     local steps per trainer per round (rounds_per_epoch from it); default 32
    warm=N      warmup_rounds
    batch=N     batch per trainer (default 32)
    fit=tob     the trainers' old loop, one train_on_batch per batch (default: TrainerActor's)

What is timed: training only, start-up and evaluation out, each side's first trace in.
One process: wall time inside ``fit`` less the callback's ``evaluate`` calls. DDLF: per
round, the busier trainer's ``compute_s`` plus ``overhead_s`` (the round's wall time
beyond its busiest trainer's training and evaluation), i.e. the round's time had nothing
been evaluated. ``s/epoch`` is that over the epochs trained; ``steady`` leaves out the
first step (one process) or round (DDLF), where the trace is. Epochs to the target: the
first evaluation at or above it.

The commands behind the tables in the report of issue 21 (in this order; 2026-11-26/27,
load average printed beside every run):

    baseline --evals 12                                     # the 6-optimizer grid, seed 0
    ddlf defaults "in=sgdm:0.01 out=avg" "in=sgdm:0.03 out=avg" "in=sgdm:0.1 out=avg" \
        "in=sgdm:0.03 out=avg scale=inner" "in=sgdm:0.03 out=nag:0.9:0.5K" \
        "in=sgdm:0.03 out=nag:0.5:1" "in=sgdm:0.03 out=lr:1K" "in=adam:1e-3 out=avg" \
        "in=adam:3e-3 out=avg" "in=adam:1e-3 out=nag:0.9:0.7" "in=adam:3e-4 out=nag:0.9:0.7"
    ddlf ... steps=8|16|64 variants, then --seeds 1 2 for the finalists (see the report)
    baseline --opts sgdm:0.03 adam:1e-3 adam:3e-3 --seeds 0 1 2
    baseline --opts adam:3e-3 --batch 64 --seeds 0 1 2
    ddlf "in=adam:3e-3 out=nag:0.9:0.7 steps=16" "in=adam:1e-3 out=nag:0.9:0.7 steps=16" \
        "in=adam:3e-3 out=avg steps=16" --epochs 6 --no-stop --evals 2
    compare --single adam:3e-3 --ddlf defaults "in=adam:1e-3 out=nag:0.9:0.7 steps=32 batch=16" \
        --seeds 0 1 2          # and --seeds 3 4 5
    speed --single adam:3e-3 --ddlf defaults --reps 3
    profile --opts adam:3e-3 sgdm:0.03
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)

from benchmarks.training.explore_runs import (  # noqa: E402
    BASELINE_OPTS,
    BATCH,
    RESULT,
    WORKERS,
    loadavg,
    parse_config,
    run_ddlf,
    run_profile,
    run_single,
)

# -- the parent: one process per run ------------------------------------------------------------


def child_main(job: dict) -> None:
    kind = job["kind"]
    try:
        result = {"single": run_single, "ddlf": run_ddlf, "profile": run_profile}[kind](job)
        result["status"] = "ok"
    except Exception as e:   # reported in the table, not lost
        import traceback

        traceback.print_exc()
        result = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    print(RESULT + json.dumps({**job, **result}), flush=True)


def run_job(job: dict, args, background: bool = False):
    cmd = ["nice", "-n", str(args.nice), sys.executable, os.path.abspath(__file__),
           "--child", json.dumps(job)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env)
    if background:
        return proc
    return collect(proc, job, args)


def collect(proc, job: dict, args) -> dict:
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {**job, "status": "error", "reason": f"timed out after {args.timeout} s"}
    for line in out.splitlines():
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT):])
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(result) + "\n")
            return result
    return {**job, "status": "error", "reason": f"no result (exit status {proc.returncode})"}


def crossing(result: dict, target: float):
    """(epoch, train_s) of the first evaluation at or above ``target``, or None."""
    for p in result.get("points", []):
        if p["acc"] >= target:
            return p["epoch"], p["train_s"]
    return None


def best_acc(result: dict) -> float:
    return max((p["acc"] for p in result.get("points", [])), default=float("nan"))


def acc_at(result: dict, epoch: float) -> str:
    """Validation accuracy at the last evaluation at or before ``epoch``."""
    pts = [p for p in result.get("points", []) if p["epoch"] <= epoch + 1e-9]
    return f"{pts[-1]['acc']:.4f}" if pts else "  -   "


def row_text(name: str, r: dict, target: float) -> str:
    if r["status"] != "ok":
        return f"{name:<44} {r['seed']:>4}  error: {r['reason']}"
    hit = crossing(r, target)
    ep = f"{hit[0]:.3f}" if hit else f">{r['epochs_done']:.2f}"
    ts = f"{hit[1]:.1f}" if hit else "-"
    return (f"{name:<44} {r['seed']:>4} {ep:>7} {ts:>7} {r['s_per_epoch']:>7.1f} "
            f"{acc_at(r, 0.25):>7} {acc_at(r, 0.5):>7} {acc_at(r, 1.0):>7} "
            f"{best_acc(r):>7.4f}  {r['load'][0]} -> {r['load'][1]}")


HEADER = (f"{'run':<44} {'seed':>4} {'epochs':>7} {'s to T':>7} {'s/epoch':>7} "
          f"{'@0.25':>7} {'@0.5':>7} {'@1.0':>7} {'best':>7}  load average (1, 5, 15 min)")


def job_base(args) -> dict:
    return {"epochs": args.epochs, "evals": args.evals,
            "stop_at": None if args.no_stop else args.target}


def cmd_baseline(args) -> None:
    results = []
    print(f"one process, {args.threads} TF threads, Keras fit, batch {args.batch}; validation "
          f"accuracy, target {args.target}, {args.evals} evaluations per epoch", flush=True)
    print(HEADER, flush=True)
    for seed in args.seeds:
        for opt in args.opts:
            job = {"kind": "single", "opt": opt, "seed": seed, "threads": args.threads,
                   "batch": args.batch, **job_base(args)}
            r = run_job(job, args)
            results.append(r)
            name = f"single {args.threads}T {opt}" + (f" batch {args.batch}"
                                                      if args.batch != BATCH else "")
            print(row_text(name, r, args.target), flush=True)
    summarize(results, args.target, key=lambda r: f"single {r['opt']}")


def cmd_ddlf(args) -> None:
    results = []
    print(f"DDLF train_sync, K = {WORKERS} x 1 TF thread, batch {BATCH} per trainer unless "
          "the run says batch=; "
          f"validation accuracy, target {args.target}, ~{args.evals} evaluations per epoch",
          flush=True)
    print(HEADER, flush=True)
    for seed in args.seeds:
        for config in args.configs:
            name = parse_config(config)["name"]
            job = {"kind": "ddlf", "config": config, "seed": seed, **job_base(args)}
            r = run_job(job, args)
            results.append(r)
            print(row_text(name, r, args.target), flush=True)
    summarize(results, args.target, key=lambda r: parse_config(r["config"])["name"])


def summarize(results: list, target: float, key) -> None:
    """Median epochs to the target per configuration, over its seeds."""
    groups: dict = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    if all(len(g) < 2 for g in groups.values()):
        return
    print(f"\nmedian over seeds (epochs to {target}; a seed that never got there counts as "
          "infinite)")
    for name, rs in groups.items():
        eps = [crossing(r, target)[0] if r["status"] == "ok" and crossing(r, target)
               else float("inf") for r in rs]
        print(f"  {name:<44} median {statistics.median(eps):.3f}  "
              f"({', '.join(f'{e:.3f}' for e in eps)})")


def cmd_compare(args) -> None:
    """Per seed: the single process and each DDLF configuration (the order reversed every
    other seed), each to the target; per DDLF configuration, the time ratio per seed and
    its median."""
    print(f"time to {args.target} validation accuracy, same run, alternated; "
          f"one process {args.threads} TF threads {args.single} vs DDLF {args.ddlf}", flush=True)
    print(HEADER, flush=True)
    runs = []      # (seed, single's result, {config: DDLF's result})
    for i, seed in enumerate(args.seeds):
        jobs = [{"kind": "single", "opt": args.single, "seed": seed, "threads": args.threads,
                 **job_base(args)}]
        jobs += [{"kind": "ddlf", "config": c, "seed": seed, **job_base(args)}
                 for c in args.ddlf]
        if i % 2:
            jobs.reverse()
        single, ddlf = None, {}
        for job in jobs:
            r = run_job(job, args)
            if job["kind"] == "single":
                single = r
                name = f"single {args.threads}T {args.single}"
            else:
                ddlf[job["config"]] = r
                name = "ddlf " + parse_config(job["config"])["name"]
            print(row_text(name, r, args.target), flush=True)
        runs.append((seed, single, ddlf))
    for config in args.ddlf:
        print(f"\nDDLF {config} against one process {args.threads}T {args.single}")
        compare_table([(seed, s, d[config]) for seed, s, d in runs], args.target)


def compare_table(pairs: list, target: float) -> None:
    print("measured: training time to the first evaluation at or above the target (each "
          "side's first trace included); steady: epochs x seconds per epoch without the "
          "first step or round")
    print(f"{'seed':>4} {'epochs 1p':>9} {'epochs DDLF':>11} {'s/ep 1p':>8} {'s/ep DDLF':>9} "
          f"{'s 1p':>6} {'s DDLF':>6} {'measured':>8} {'steady':>7} {'s/ep ratio':>10}")
    measured, steady = [], []
    for seed, s, d in pairs:
        hs, hd = crossing(s, target), crossing(d, target)
        if s["status"] != "ok" or d["status"] != "ok" or not hs or not hd:
            print(f"{seed:>4}  a run did not reach the target")
            continue
        measured.append(hd[1] / hs[1])
        steady.append((hd[0] * d["steady_s_per_epoch"]) / (hs[0] * s["steady_s_per_epoch"]))
        print(f"{seed:>4} {hs[0]:>9.3f} {hd[0]:>11.3f} {s['steady_s_per_epoch']:>8.2f} "
              f"{d['steady_s_per_epoch']:>9.2f} {hs[1]:>6.2f} {hd[1]:>6.2f} "
              f"{measured[-1]:>7.2f}x {steady[-1]:>6.2f}x "
              f"{d['steady_s_per_epoch'] / s['steady_s_per_epoch']:>9.2f}x")
    if measured:
        print(f"DDLF / one process, time to {target}: measured median "
              f"{statistics.median(measured):.2f}x (range {min(measured):.2f}-{max(measured):.2f}x), "
              f"steady median {statistics.median(steady):.2f}x (range {min(steady):.2f}-"
              f"{max(steady):.2f}x), {len(measured)} seeds")


def cmd_speed(args) -> None:
    """Seconds per epoch, one epoch each, no evaluation inside, alternated ``reps`` times."""
    base = {"epochs": 1, "evals": 0, "stop_at": None, "seed": 0}
    opt = args.single
    columns = {
        "1 process, 2 threads, 50,000 images (fit)": [{"kind": "single", "opt": opt,
                                                       "threads": 2, **base}],
        "1 process, 1 thread, 25,000 images (fit)": [{"kind": "single", "opt": opt,
                                                      "threads": 1, "half": True, **base}],
        "2 processes at once, 1 thread, 25,000 each (fit)": [
            {"kind": "single", "opt": opt, "threads": 1, "half": True, **base},
            {"kind": "single", "opt": opt, "threads": 1, "half": True, **base}],
        "DDLF K=2 x 1 thread, train_on_batch loop (before)": [
            {"kind": "ddlf", "config": args.ddlf + " fit=tob", **base}],
        "DDLF K=2 x 1 thread, fit_steps (after)": [{"kind": "ddlf", "config": args.ddlf, **base}],
    }
    got: dict = {name: [] for name in columns}
    for rep in range(args.reps):
        order = list(columns) if rep % 2 == 0 else list(reversed(columns))
        for name in order:
            jobs = columns[name]
            procs = [run_job(j, args, background=True) for j in jobs]
            rs = [collect(p, j, args) for p, j in zip(procs, jobs)]
            got[name].append(rs)
            print(f"rep {rep} {name}: " + ", ".join(
                f"{r.get('s_per_epoch', float('nan')):.1f} s/epoch (load {r.get('load')})"
                if r["status"] == "ok" else r["reason"] for r in rs), flush=True)
    print(f"\nseconds per epoch ({args.ddlf} for DDLF; {opt} for fit), {args.reps} alternated "
          "repetitions, evaluation excluded")
    print("s/epoch: training time over the epoch, its first step (the trace) included; "
          "steady: without the first step (round); CPU: the process's (the busier "
          "trainer's), per epoch")
    print(f"{'column':<52} {'s/epoch (each rep)':<20} {'median':>7} {'steady':>7} "
          f"{'first s':>7} {'CPU s/epoch':>11}")

    def med(values):
        return statistics.median(values) if values else float("nan")

    for name, reps in got.items():
        ok = [rs for rs in reps if all(r["status"] == "ok" for r in rs)]
        per = [max(r["s_per_epoch"] for r in rs) for rs in ok]
        steady = [max(r["steady_s_per_epoch"] for r in rs) for rs in ok]
        first = [max(r["first_step_s"] for r in rs) for rs in ok]
        cpu = [r.get("cpu_s_per_epoch") for rs in ok for r in rs if r.get("cpu_s_per_epoch")]
        print(f"{name:<52} {' '.join(f'{p:.1f}' for p in per):<20} {med(per):>7.1f} "
              f"{med(steady):>7.2f} {med(first):>7.2f} {med(cpu):>11.2f}")


def cmd_profile(args) -> None:
    print(f"one trainer's round of {args.steps} steps of batch {args.batch}, paper CNN; "
          f"{args.reps} alternated repetitions of {args.rounds} rounds per way", flush=True)
    for opt in args.opts:
        for threads in (1, 2):
            r = run_job({"kind": "profile", "threads": threads, "steps": args.steps,
                         "rounds": args.rounds, "reps": args.reps, "opt": opt,
                         "batch": args.batch}, args)
            print_profile(r, threads, opt or "paper_cnn's optimizer", args)


def print_profile(r: dict, threads: int, opt: str, args) -> None:
    if r["status"] != "ok":
        print(f"{threads} threads: error: {r['reason']}")
        return
    ms = r["ms_per_step"]
    cpu = r["cpu_ms_per_step"]
    print(f"\n{opt}, {threads} TF thread(s), load {r['load']}")
    print(f"  {'way':<16} {'ms/step':>8} {'CPU ms/step':>12} {'first call s':>12}")
    for k in ms:
        print(f"  {k:<16} {ms[k]:>8.2f} {cpu[k]:>12.2f} {r['first_call_s'][k]:>12.2f}")
    print(f"  per round: set_weights {r['set_weights_ms']:.2f} ms, get_weights "
          f"{r['get_weights_ms']:.2f} ms, delta {r['delta_ms']:.2f} ms, gather of "
          f"{args.steps * r['batch']} rows {r['gather_ms']:.2f} ms; evaluate 5,000 images "
          f"{r['evaluate_5000_s']:.2f} s")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd")

    def common(sp):
        sp.add_argument("--seeds", type=int, nargs="+", default=[0])
        sp.add_argument("--epochs", type=int, default=2)
        sp.add_argument("--target", type=float, default=0.85)
        sp.add_argument("--no-stop", action="store_true", help="train every epoch")
        sp.add_argument("--evals", type=int, default=24, help="evaluations per epoch")
        sp.add_argument("--threads", type=int, default=2, help="the single process's TF threads")
        sp.add_argument("--json", help="append every run's record to this file")
        sp.add_argument("--nice", type=int, default=10)
        sp.add_argument("--timeout", type=float, default=1800)

    sp = sub.add_parser("baseline")
    common(sp)
    sp.add_argument("--opts", nargs="+", default=BASELINE_OPTS)
    sp.add_argument("--batch", type=int, default=BATCH)
    sp = sub.add_parser("ddlf")
    common(sp)
    sp.add_argument("configs", nargs="+")
    sp = sub.add_parser("compare")
    common(sp)
    sp.add_argument("--single", default="adam:3e-3")
    sp.add_argument("--ddlf", nargs="+", default=["defaults"])
    sp = sub.add_parser("speed")
    common(sp)
    sp.add_argument("--reps", type=int, default=2)
    sp.add_argument("--single", default="adam:3e-3")
    sp.add_argument("--ddlf", default="defaults")
    sp = sub.add_parser("profile")
    common(sp)
    sp.add_argument("--reps", type=int, default=3)
    sp.add_argument("--rounds", type=int, default=10)
    sp.add_argument("--steps", type=int, default=32)
    sp.add_argument("--batch", type=int, default=BATCH)
    sp.add_argument("--opts", nargs="+", default=[None],
                    help="optimizers (e.g. sgdm:0.03 adam:1e-3); default paper_cnn's own")
    args = p.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    if args.cmd is None:
        p.error("a command: baseline, ddlf, compare, speed or profile")
    print(f"# {' '.join(sys.argv)}  (load average {loadavg()}, {time.strftime('%Y-%m-%d %H:%M')})",
          flush=True)
    {"baseline": cmd_baseline, "ddlf": cmd_ddlf, "compare": cmd_compare, "speed": cmd_speed,
     "profile": cmd_profile}[args.cmd](args)


if __name__ == "__main__":
    main()
