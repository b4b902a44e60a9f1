"""Time to accuracy by the protocol of issue 21, with every column tuned on validation.

Every column is tuned on a validation split with the same grid, several seeds run
interleaved, and framework and algorithm are measured apart.

    # 1. selection: each column's grid on the first 50,000 training images, judged on the
    #    last 10,000 (validation); the test set is not read. Writes the choices file.
    python benchmarks/training/train_compare.py --select [--select-epochs 2] [--select-seeds 1]
    # 2. the final run (the default): every column on all 60,000 images with its chosen
    #    settings, evaluated on the test set, --seeds 3 interleaved, --epochs 10.
    python benchmarks/training/train_compare.py [--final] [--seeds 3] [--epochs 10]

    common: [--columns a,b] [--target 0.85] [--evals-per-epoch 4] [--workers 2]
            [--choices benchmarks/training/train_compare_choices.json] [--json out.json]
            [--png benchmarks/training/train_compare.png] [--timeout 3600]
            [--limit N] [--eval-limit M]        # smoke runs: N training images, M evaluated

The paper's CNN (``models.paper_cnn``) on Fashion-MNIST, batch 32 per trainer, K = 2
trainers of one TensorFlow thread each (intra-op 1, inter-op 1, ``OMP_NUM_THREADS=1``);
the single process gets K threads. Every run of seed s starts from the same initial
weights (the paper CNN built after ``keras.utils.set_random_seed(s)``) and shuffles with
s: seeds change both the data order and the initial weights. Selection uses seeds 1001,
1002, ... (``--select-seeds``, default 1 to keep the budget sane: one seed judges each
candidate, so close candidates may swap between runs), the final run seeds 1, 2, 3.

Columns (``protocol/columns.py`` holds their framework, algorithm and grid):

keras             one process, K TF threads, Keras ``fit``'s compiled loop over all epochs
                  (``shuffle=True``). Grid: SGD momentum 0.9 with lr in {0.01, 0.03, 0.1},
                  Adam with lr in {3e-4, 1e-3, 3e-3}.
raytrain          Ray Train ``TensorflowTrainer``: ``MultiWorkerMirroredStrategy`` over K
                  workers, gradients all-reduced every step (global batch 32 x K). Needs
                  ``tf_keras`` and ``TF_USE_LEGACY_KERAS=1`` (Keras 3 fails at once,
                  ray-project/ray#47464). Grid: the 6 above, each without and with the
                  linear scaling rule (lr x K): 12.
ray, spark        the paper's Algorithm 6 as before: one round per epoch, plain average of
                  the K deltas, SGD 0.01 (no grid: the published reference). ``ray`` by
                  hand on K actors; ``spark`` as the paper's Example 3.1 on ``local[K]``.
ray-rounds        the best scheme DDLF found, written by hand on Ray with
                  ``train_on_batch`` (:func:`run_ray_rounds`, about 30 lines): rounds of
                  about 32 local steps, the averaged delta taken as a gradient by outer
                  Nesterov momentum 0.9 at rate 0.5 x K, warmed up linearly from 0.5 over
                  half an epoch's rounds. Grid: the keras 6 (the trainers' optimizer).
ddlf-default      DDLF's defaults: ``train(model_fn, dataset)``, no scheme and no scheme
                  options (issue 30: whatever ``train()`` runs when told nothing; the table
                  says which scheme that was). Grid: the model's own optimizer (whatever
                  ``models.paper_cnn()`` compiles when the run starts) and the 6.
ddlf-sync         ``train_sync``'s defaults (the star), with ddlf-default's chosen optimizer:
                  the defaults before issue 30, for the record.
ddlf-alg6         ``train_sync(rounds_per_epoch=1, outer_momentum=0, lr_scaling="none")``,
                  SGD 0.01: Algorithm 6 in DDLF (no grid).
ddlf-default@ray  ddlf-default's chosen settings with ``backend="ray"``: DDLF's scheme and
                  trainers on a local Ray instance.

Selection picks, per column, the candidate reaching ``--target`` on validation in the
least training time (median over the selection seeds), ties broken by validation
accuracy after ``--select-epochs``; candidates that diverge (NaN loss, accuracy at
chance) are marked and never chosen (``protocol/choices.py``). The final run refuses
to start without a choice for every column that has a grid, and names the command.

Evaluation. Every column with a global model is evaluated at least ``--evals-per-epoch``
E times per epoch, and the first evaluation at or above the target counts (no
interpolation): keras and raytrain between steps (a callback after steps k*S/E of each
epoch of S steps), ray-rounds and DDLF every ``R // E`` rounds (R rounds per epoch, as
``apps/schemes/sync.py`` sizes them: about 32 local steps each) and after the last.
ray, spark and ddlf-alg6 average once per epoch, so they have a global model, and an
evaluation, once per epoch; the table marks them.

What is timed (``time.perf_counter``), the same way for every column:

- ``train_s``: training time: wall time from the start of training to the end of the
  last epoch *minus the evaluation pauses*. keras, ray, ray-rounds and spark time each
  evaluation on the process that drives training and subtract it; raytrain's rank 0
  does the same inside its workers (rank 0 evaluates a local copy of the weights while
  the other worker waits at the next all-reduce); DDLF evaluates on its trainers,
  queued before their next train call, and each history row's ``eval_s`` (the slower
  trainer's) is subtracted. An evaluation point's ``train_s`` is the training time up to
  the weights it evaluated. Start-up (framework, TensorFlow, data, model) is not
  training time and is reported apart (``startup_s``).
- seconds per epoch = ``train_s / epochs``: the framework's speed.
- epochs to the target: the evaluation's epoch (fractional): the algorithm.
- time to the target: that evaluation's ``train_s``: both.

Each column-run is its own process (this script with ``--job JSON``), in a fresh
process group; the parent takes one JSON line from it, samples the process tree's CPU,
ends anything it left behind (the parent makes itself the reaper of orphaned
descendants where Linux allows) and records the 1-minute load average at its start.
Runs are interleaved: seed 1 of every column (and candidate), then seed 2, and so on.
"""

from __future__ import annotations

import os
import sys

# Before numpy loads, so its BLAS and the trainers (which inherit the environment) start
# single-threaded; each column then sets TensorFlow's own pools explicitly.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The bookkeeping package (benchmarks.protocol) is in the checkout; trainers and Ray
# workers import it too (DDLF ships the driver's sys.path; Ray's and Spark's workers
# inherit PYTHONPATH).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from benchmarks import protocol  # noqa: E402
from benchmarks.peers.ray_columns import run_ray, run_ray_rounds, run_raytrain  # noqa: E402
from benchmarks.peers.spark_column import run_spark  # noqa: E402
from benchmarks.protocol import COLUMNS, Job, cadence, ran  # noqa: E402
from benchmarks.training.column_process import (  # noqa: E402
    BATCH_SIZE,
    FASHION_SIZES,
    RESULT_PREFIX,
    SELECT_SEED_BASE,
    EvalClock,
    SeededModel,
    Unavailable,
    build_model,
    configure_tf,
    describe_optimizer,
    eval_name,
    eval_steps,
    evaluate_arrays,
    log,
    now,
    result,
    split_for,
)
from benchmarks.training.process_tree import become_subreaper, run_job  # noqa: E402

DEFAULT_CHOICES = os.path.join(_HERE, "train_compare_choices.json")

# -- keras: one process, fit's compiled loop -----------------------------------------------------


def run_keras(job: Job, args) -> dict:
    t0 = now()
    configure_tf(args.workers)
    import keras

    (x, y), (xe, ye) = split_for(job, args)()
    model = build_model(job.seed, job.candidate)
    label = protocol.candidate_label(job.candidate, describe_optimizer(model.optimizer))
    clock = EvalClock(job.column, eval_name(job))
    steps = math.ceil(len(x) / BATCH_SIZE)
    at = eval_steps(steps, args.evals_per_epoch)
    losses: list = []

    class EvalBetweenSteps(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in at:
                losses.append(float(logs["loss"]) if logs and "loss" in logs else None)
                clock.evaluate(self.epoch + (batch + 1) / steps,
                               lambda: evaluate_arrays(model, xe, ye))

    t_ready = now()
    clock.start()
    # One fit for every epoch: Keras's compiled loop with its own shuffle (seeded above).
    model.fit(x, y, epochs=args.epochs, batch_size=BATCH_SIZE, shuffle=True, verbose=0,
              callbacks=[EvalBetweenSteps()])
    train_s = clock.train_s()
    return result(job, args, startup_s=t_ready - t0, train_s=train_s, eval_s=clock.eval_s,
                  points=clock.points, train_losses=losses, label=label,
                  settings=f"one process, {args.workers} TF threads, fit; {label}")




# -- DDLF -----------------------------------------------------------------------------------------

# DDLF's columns: (scheme, scheme options). None: train()'s default scheme, told nothing.
DDLF_RUNS: dict[str, tuple[str | None, dict]] = {
    "ddlf-default": (None, {}),
    "ddlf-default@ray": (None, {}),
    "ddlf-sync": ("sync", {}),
    # The paper's Algorithm 6: one round per epoch, a plain average.
    "ddlf-alg6": ("sync", {"rounds_per_epoch": 1, "outer_momentum": 0.0, "lr_scaling": "none"}),
}


def run_ddlf(job: Job, args) -> dict:
    t0 = now()
    try:
        import ddlf_actors as ddlf
        from ddlf_actors.apps import train
    except ImportError as e:
        raise Unavailable(f"ddlf_actors.apps is not importable ({e})")
    backend = "ray" if job.column.endswith("@ray") else "ddlf"
    if backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"ray is not importable ({e}); pip install -e '.[ray]'")
    scheme, options = DDLF_RUNS[job.column]
    options = dict(options)
    n_train = len(protocol.split_indices(job.stage, *FASHION_SIZES, limit=args.limit).train)
    R = cadence.rounds_per_epoch(scheme, options, args.workers, n_train, BATCH_SIZE)
    if R and R > 1:
        options.update(cadence.evaluations(scheme, options, args.workers, n_train,
                                           args.evals_per_epoch, BATCH_SIZE))
    # backend="ray": a local Ray instance with K CPUs; the scheme places its trainers there.
    ddlf.init(num_cpus=args.workers, backend=backend)
    try:
        t_call = now()
        shape = dict(workers=args.workers, master_epochs=args.epochs, batch_size=BATCH_SIZE,
                     progress=False, seed=job.seed)
        model = SeededModel(job.seed, job.candidate)
        if scheme is None:   # DDLF's defaults: no scheme named
            r = train(model, split_for(job, args), **shape, **options)
        else:
            r = train(model, split_for(job, args), scheme, **shape, **options)
    finally:
        ddlf.shutdown()
    points, train_s, eval_s = protocol.ddlf_points(r.history, r.startup_s)
    notes = []
    made = getattr(r.options, "rounds_per_epoch", None)
    if made != R:
        notes.append(f"the run used {made} rounds/epoch, not the {R} this script computed "
                     "(the scheme chose its rounds as the run started); evaluations per "
                     "epoch are as measured")
    default = None
    if job.candidate.get("optimizer") == "default":
        # After training (not timed): the model's own optimizer, as paper_cnn compiles it now.
        configure_tf(1)
        default = describe_optimizer(build_model(job.seed, job.candidate).optimizer)
    label = protocol.candidate_label(job.candidate, default)
    settings = (("train() defaults ran " if scheme is None else "") + ran.describe_run(r)
                + ("" if backend == "ddlf" else ", on Ray") + f"; {label}")
    for p in points:
        log(f"[{job.column}] epoch {p['epoch']:.2f}: {p['train_s']:.1f} s of training, "
            f"{eval_name(job)} accuracy {p['accuracy']:.4f}")
    for n in notes:
        log(f"[{job.column}] note: {n}")
    return result(job, args, startup_s=t_call - t0 + r.startup_s, train_s=train_s,
                  eval_s=eval_s, points=points, label=label, settings=settings,
                  train_losses=[row.get("train_loss") for row in r.history],
                  compute_s=sum(row.get("compute_s", 0.0) for row in r.history),
                  overhead_s=sum(row.get("overhead_s", 0.0) for row in r.history),
                  rounds_per_epoch=made, notes=notes, model_default=default,
                  scheme_ran=ran.scheme_ran(r))


RUNNERS = {
    "keras": run_keras,
    "raytrain": run_raytrain,
    "ray": run_ray,
    "spark": run_spark,
    "ray-rounds": run_ray_rounds,
    "ddlf-default": run_ddlf,
    "ddlf-sync": run_ddlf,
    "ddlf-alg6": run_ddlf,
    "ddlf-default@ray": run_ddlf,
}


def column_main(spec: dict) -> None:
    """In the column-run's own process: run it, print one result line."""
    job = Job.from_json(spec["job"])
    args = argparse.Namespace(**spec["settings"])
    try:
        out = RUNNERS[job.column](job, args)
    except Unavailable as e:
        out = {"status": "unavailable", "reason": str(e)}
    except Exception as e:
        traceback.print_exc()
        out = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    out = {"column": job.column, "stage": job.stage, "seed": job.seed,
           "candidate": job.candidate, **out}
    print(RESULT_PREFIX + json.dumps(out), flush=True)



def one_line(r: dict, target: float) -> str:
    """A column-run as the log shows it when it ends, load average beside it."""
    head = (f"seed {r['seed']:>4} {r['column']:<17} {protocol.candidate_label(r['candidate']):<22} "
            f"load {r.get('load_1min') or 0:5.2f}")
    if r.get("status") != "ok":
        return f"{head}  {r.get('status')}: {r.get('reason', '')}"
    m = protocol.metrics(r, target)
    hit = "never" if m["time_to_target"] is None else \
        f"epoch {m['epochs_to_target']:.2f} / {m['time_to_target']:.1f} s"
    acc = "-" if m["final_accuracy"] is None else f"{m['final_accuracy']:.4f}"
    return (f"{head}  {m['s_per_epoch']:6.1f} s/epoch, {target} at {hit}, "
            f"{r['eval_on']} acc {acc}, start-up {r['startup_s']:.1f} s")


# -- the two stages -------------------------------------------------------------------------------


def plan(args) -> list[Job]:
    """The interleaved column-runs of this invocation. Raises ``ChoicesMissing`` (final
    run) when a column with a grid has no choice."""
    if args.select:
        candidates = {c: COLUMNS[c].grid for c in args.columns if COLUMNS[c].chooses}
        seeds = [SELECT_SEED_BASE + i for i in range(1, args.select_seeds + 1)]
        return protocol.interleave("select", args.columns, seeds, candidates)
    needs = list(dict.fromkeys(COLUMNS[c].choice_from or c for c in args.columns
                               if COLUMNS[c].chooses or COLUMNS[c].choice_from))
    chosen = protocol.read_choices(args.choices, needs)
    candidates = {c: [chosen[COLUMNS[c].choice_from or c]] if c in chosen or
                  COLUMNS[c].choice_from else [COLUMNS[c].fixed] for c in args.columns}
    return protocol.interleave("final", args.columns, range(1, args.seeds + 1), candidates)


def run_select(args, jobs: list, settings: dict) -> dict:
    results = []
    for job in jobs:
        results.append(run_job(os.path.abspath(__file__), job, settings, args.timeout))
        log("== " + one_line(results[-1], args.target))
    tables: dict = {}
    for c in args.columns:
        if not COLUMNS[c].chooses:
            why = COLUMNS[c].no_grid
            print(f"{c}: no selection ({why})")
            continue
        rows = []
        for cand in COLUMNS[c].grid:
            runs = [r for r in results if r["column"] == c and r["candidate"] == cand]
            row = protocol.candidate_row(cand, runs, args.target)
            ok = [r for r in runs if r.get("status") == "ok"]
            row["label"] = ok[0]["label"] if ok else protocol.candidate_label(cand)
            rows.append(row)
        tables[c] = rows
    meta = {"target": args.target, "select_epochs": args.select_epochs,
            "select_seeds": [SELECT_SEED_BASE + i for i in range(1, args.select_seeds + 1)],
            "evals_per_epoch": args.evals_per_epoch, "limit": args.limit,
            "eval_limit": args.eval_limit, "workers": args.workers,
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    doc = protocol.write_choices(args.choices, tables, meta)
    for c, rows in tables.items():
        print()
        print(protocol.selection_table(c, rows, args.target, args.select_epochs))
    print(f"\nwrote {args.choices}")
    return {"stage": "select", "meta": meta, "choices": doc, "runs": results}


def run_final(args, jobs: list, settings: dict) -> dict:
    chosen_labels = {}
    if args.choices and os.path.exists(args.choices):
        with open(args.choices) as f:
            doc = json.load(f)
        for c, entry in doc.get("columns", {}).items():
            chosen_labels[c] = next((r.get("label") for r in entry.get("selection", ())
                                     if r.get("chosen")), None)
            if c in args.columns and entry.get("limit"):
                print(f"note: {c}'s choice was selected with --limit {entry['limit']} "
                      "(a smoke run), not on the full split")
    results = []
    for job in jobs:
        results.append(run_job(os.path.abspath(__file__), job, settings, args.timeout))
        log("== " + one_line(results[-1], args.target))
        # "model default" is read when the run starts: say so if the model changed since.
        r, src = results[-1], COLUMNS[job.column].choice_from or job.column
        if (job.candidate == protocol.MODEL_DEFAULT and r.get("status") == "ok"
                and chosen_labels.get(src) and r.get("label") != chosen_labels[src]):
            print(f"note: {job.column} seed {job.seed} ran {r['label']}, but selection chose "
                  f"{chosen_labels[src]}: models.paper_cnn's optimizer changed since --select")
    rows = protocol.headline_rows(results, args.target)
    eval_on = "validation" if args.select else "test"
    print(f"\nTime to {eval_on} accuracy {args.target}: Fashion-MNIST, paper CNN, batch "
          f"{BATCH_SIZE}/trainer, K = {args.workers}, {args.epochs} epochs, seeds "
          f"1-{args.seeds} interleaved; {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}"
          + (f"; --limit {args.limit} training images" if args.limit else "")
          + (f", {args.eval_limit} evaluated" if args.eval_limit else ""))
    print(protocol.headline_table(rows, args.target, args.epochs, eval_on))
    ratios = protocol.ratio_lines(rows, args.target)
    if ratios:
        print()
        print(ratios)
    summary = {c: {k: (v.to_json() if hasattr(v, "to_json") else v) for k, v in col.items()
                   if k != "runs"} for c, col in rows.items()}
    return {"stage": "final", "runs": results, "summary": summary}


def write_png(results: list, path: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    colors: dict = {}
    for r in results:
        if r.get("status") != "ok" or not r["evals"]:
            continue
        color = colors.setdefault(r["column"], f"C{len(colors)}")
        ax.plot([p["train_s"] for p in r["evals"]], [p["accuracy"] for p in r["evals"]],
                marker=".", color=color, alpha=0.8,
                label=r["column"] if r["column"] not in ax.get_legend_handles_labels()[1]
                else None)
    ax.axhline(target, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training time, s (start-up and evaluation excluded)")
    ax.set_ylabel(f"{results[0].get('eval_on', 'test') if results else 'test'} accuracy")
    accs = [p["accuracy"] for r in results if r.get("status") == "ok" for p in r["evals"]]
    ax.set_ylim(max(0.0, min([target - 0.25, *(a - 0.02 for a in accs)])), 1.0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Fashion-MNIST, paper CNN: every seed of every column")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line -------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    stage = p.add_mutually_exclusive_group()
    stage.add_argument("--select", action="store_true",
                       help="run each column's grid on the validation split and write the "
                            "choices file")
    stage.add_argument("--final", action="store_true",
                       help="(the default) every column with its chosen settings, on test")
    p.add_argument("--columns", default=",".join(protocol.COLUMN_NAMES),
                   help=f"comma-separated, in this order (default all: "
                        f"{','.join(protocol.COLUMN_NAMES)})")
    p.add_argument("--choices", default=DEFAULT_CHOICES,
                   help="the choices file --select writes and the final run reads")
    p.add_argument("--target", type=float, default=0.85, help="accuracy target (0.85)")
    p.add_argument("--epochs", type=int, default=10, help="final run's epochs (10)")
    p.add_argument("--seeds", type=int, default=3, help="final run's seeds, 1..N (3)")
    p.add_argument("--select-epochs", type=int, default=2, help="selection epochs (2)")
    p.add_argument("--select-seeds", type=int, default=1,
                   help="selection seeds (1, to keep the budget sane: 31 candidate runs)")
    p.add_argument("--evals-per-epoch", type=int, default=4,
                   help="evaluations per epoch where a global model exists (4)")
    p.add_argument("--workers", type=int, default=2, help="trainers K (2)")
    p.add_argument("--limit", type=int, help="smoke runs: train on the first N images only")
    p.add_argument("--eval-limit", type=int,
                   help="smoke runs: evaluate on the first M images only (default: all, or "
                        "1000 with --limit)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per column-run")
    p.add_argument("--data-dir", help="sets DDLF_DATA_DIR for the columns")
    p.add_argument("--png", default=os.path.join(_HERE, "train_compare.png"),
                   help="final run: accuracy against training time ('' to skip)")
    p.add_argument("--json", help="also write every column-run's result here")
    p.add_argument("--job", help=argparse.SUPPRESS)  # internal: one column-run
    args = p.parse_args(argv)
    if args.job:
        return args
    args.columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = protocol.unknown_columns(args.columns)
    if unknown:
        p.error(f"unknown column(s) {unknown}; choose from {','.join(protocol.COLUMN_NAMES)}")
    for name in ("epochs", "seeds", "select_epochs", "select_seeds", "evals_per_epoch",
                 "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.target <= 1:
        p.error("--target must be in (0, 1]")
    if args.limit is not None and args.eval_limit is None:
        args.eval_limit = 1000
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.data_dir:
        os.environ["DDLF_DATA_DIR"] = os.path.abspath(args.data_dir)
    if args.job:
        column_main(json.loads(args.job))
        return
    try:
        jobs = plan(args)
    except protocol.ChoicesMissing as e:
        sys.exit(f"train_compare: {e}")
    settings = {"epochs": args.select_epochs if args.select else args.epochs,
                "workers": args.workers, "evals_per_epoch": args.evals_per_epoch,
                "limit": args.limit, "eval_limit": args.eval_limit}
    become_subreaper()
    t, load_before = now(), os.getloadavg()
    log(f"== {len(jobs)} column-runs ({'select' if args.select else 'final'}), load average "
        f"{load_before[0]:.2f}")
    out = run_select(args, jobs, settings) if args.select else run_final(args, jobs, settings)
    load_after = os.getloadavg()
    print(f"(total {now() - t:.0f} s; load average before {load_before[0]:.2f}, after "
          f"{load_after[0]:.2f})")
    if args.png and not args.select:
        write_png(out["runs"], args.png, args.target)
        log(f"wrote {args.png}")
    if args.json:
        out.update({"settings": settings, "target": args.target, "cpus": os.cpu_count(),
                    "python": platform.python_version(), "load_before": load_before,
                    "load_after": load_after})
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
