"""Chaos benchmark: training on a multi-node cluster while trainers and nodes die and nodes join.

    python benchmarks/chaos/train_chaos.py [--runs 20] [--numpy | --framework keras|torch]
                                     [--nodes 2] [--schemes sync,async]
                                     [--train-size 12000] [--test-size 2000] [--epochs E]
                                     [--rounds-per-epoch 4] [--faults-per-run 3] [--seed 0]
                                     [--timeout S] [--json out.json] [--logs DIR]

Each run is its own process (this script with ``--one-run``), and starts its own local
cluster: a head and ``--nodes`` K one-CPU nodes on 127.0.0.1 (``MultiNodeCluster`` from
tests/cluster_utils.py, what ``ddlf-node start`` runs). It trains K trainers on a subset
of Fashion-MNIST (``--train-size`` images, ``--test-size`` test images), checkpointing
every round into a temporary directory: the paper's CNN (Keras on TensorFlow; with
``--framework torch`` the same CNN in PyTorch, ``models.paper_cnn_torch``, SGD 0.01 as
Keras compiles it), or with ``--numpy`` the softmax regression of tests/helpers_modules/numpy_trainer.py, whose
``fit`` sleeps ``--numpy-fit-s`` per call to stand for compute (so rounds last long
enough for faults to land mid-round, without loading the shared machine). Runs
alternate between the schemes given (``sync`` and ``async`` by default).

Faults come from a generator seeded by ``(--seed, run)``, at random times in the middle
of the run (after 10 % of its rows and before 75 %: rows, not seconds, since the shared
machine's load changes a run's length severalfold), spaced so that about
``--faults-per-run`` fit in the run's time (estimated from its own pace up to the window's
start, not the fault-free run's, which a change of load makes several times off), one at
a time:

- ``trainer``: SIGKILL to one trainer's process, by pid (read from the head's actor
  list), from outside; its replacement starts in its reserved bundle on the same node.
- ``node``: a node daemon and every process under it SIGKILLed; its trainer has nowhere
  to go until a node joins (or a spare node that joined earlier takes it at once).
- ``join``: a new one-CPU node starts and joins. It is forced while a node's trainer
  waits for capacity, and otherwise happens at random while there is no spare node.

A trainer or node is killed only while every one of the K trainers is live and at
least two are (so at most K - 1 of K are ever lost, one at a time; never all at once).

Each run has a watchdog (``--timeout``; by default 4x the fault-free run plus 60 s):
a run still going then is a *hang*. Its Python stacks are dumped (SIGUSR1 to
faulthandler) into its log, and its whole process tree is killed. A run whose training
call raises is a *failed run*, reported with the exception.

What is measured, all on the wall clock (``time.time()``, one clock for every process
on the machine):

- detection: from the fault to the ``trainer_lost`` event, seen by an ``on_event``
  callback on the driver;
- reconfiguration, two ways: to the next call (train, or the evaluation shard a round
  queues first) another trainer starts after the loss (sync: the next round, started
  without the lost trainer; async: the next piece, the lost one requeued), and to the
  ``trainer_joined`` of the lost slot's replacement; for a join, from the node's start
  to the trainer it takes joining;
- wasted work per fault, in units of one trainer's share of one round: the compute the
  lost trainer had spent on its unfinished call (its log of train calls: kill time
  minus call start, over the run's median call), and for sync also the samples the
  round of the loss trained short of its plan, over the share;
- final test accuracy against a fault-free run of the same scheme with the same seed
  (``--baselines`` of them; a second one shows the run-to-run noise);
- checkpoint cost: ``result.checkpoint_s`` (time the training loop waited on
  checkpoints) plus ``result.checkpoint_cpu_s`` (the CPU the background writer took),
  over the training call's wall time; ``result.checkpoint_write_s``, the writer's wall
  time, is shown too (most of it waits on ``fsync`` and costs training nothing).

The report is a table per run, one per fault kind, and the issue's targets, met or
missed. Exit status 0 only with no hang and no failed run.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TESTS = os.path.join(_ROOT, "tests")
for _p in (_TESTS, _ROOT):   # run from a source checkout; MultiNodeCluster, NumpyTrainer
    if _p not in sys.path:
        sys.path.insert(0, _p)

from benchmarks.chaos.chaos_report import (  # noqa: E402
    analyse,
    format_faults,
    format_runs,
    format_targets,
    targets,
)
from benchmarks.chaos.chaos_run import RESULT_PREFIX, one_run  # noqa: E402
from benchmarks.chaos.chaos_trainers import log, now  # noqa: E402

# -- the parent: runs, watchdog, report -------------------------------------------------------


def run_process(spec: dict, timeout: float) -> dict:
    """Run ``spec`` in its own process group with a watchdog; return its result.

    A run still going after ``timeout`` s is a hang: its stacks go to its log (SIGUSR1 to
    faulthandler), then its whole tree is killed, by pid."""
    import psutil

    os.makedirs(spec["dir"], exist_ok=True)
    spec_path = os.path.join(spec["dir"], "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    stderr_path = os.path.join(spec["dir"], "stderr.log")
    t0 = now()
    with open(stderr_path, "w") as err, tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one-run", spec_path],
                                stdout=stdout, stderr=err, start_new_session=True)
        me = psutil.Process(proc.pid)
        seen: dict = {}
        hang = False
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for p in me.children(recursive=True):
                    seen.setdefault(p.pid, p)
            if now() - t0 > timeout:
                hang = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR1)   # stacks into stderr.log
                time.sleep(2)
                break
            time.sleep(0.2)
        leftovers = _end_tree(proc, seen)
        stdout.seek(0)
        text = stdout.read()
    if hang:
        result = {"run": spec["run"], "scheme": spec["scheme"], "chaos": spec["chaos"],
                  "status": "hang", "error": f"still running after {timeout:.0f} s (stacks in "
                  f"{stderr_path})"}
    else:
        result = _parse(text, spec, proc.returncode, stderr_path)
    result["process_s"] = now() - t0
    result["leftovers"] = leftovers
    result["log"] = stderr_path
    return result


def _end_tree(proc, seen: dict) -> list[str]:
    """Kill the run's process group and every descendant we saw (by pid); name those that
    were still alive after the run's own clean-up had its chance."""
    import psutil

    ended = []
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # The run stops its cluster itself; give its daemons a moment to see their lifeline go.
    gone, alive = psutil.wait_procs(list(seen.values()), timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            ended.append(f"{p.name()} ({p.pid})")
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return ended


def _parse(text: str, spec: dict, returncode, stderr_path: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"run": spec["run"], "scheme": spec["scheme"], "chaos": spec["chaos"],
            "status": "failed", "error": f"the run process exited with {returncode} and no "
            f"result (see {stderr_path})"}


# -- main --------------------------------------------------------------------------------------


def _training_s(run: dict) -> float:
    """From training's start (trainers built) to its last row."""
    return run["rows"][-1]["wall"] - run["t_begin"]


def _spec(args, run: int, scheme: str, chaos: bool, root: str, base_s: float | None) -> dict:
    window = (0.1, 0.75)   # of the rows
    return {"run": run, "scheme": scheme, "chaos": chaos, "numpy": args.numpy,
            "framework": args.framework,
            "nodes": args.nodes, "train_size": args.train_size, "test_size": args.test_size,
            "epochs": args.epochs, "rounds_per_epoch": args.rounds_per_epoch,
            "seed": args.seed, "chaos_seed": args.seed * 100_003 + run,
            "numpy_fit_s": args.numpy_fit_s, "window": window,
            "mean_gap": (window[1] - window[0]) * (base_s or 0) / max(1, args.faults_per_run),
            "faults_per_run": args.faults_per_run,
            "dir": os.path.join(root, f"{'run' if chaos else 'base'}-{scheme}-{run:03d}")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="runs with faults (default 20)")
    p.add_argument("--numpy", action="store_true",
                   help="the numpy softmax trainer instead of the paper's CNN (fast)")
    p.add_argument("--framework", choices=("keras", "torch"), default="keras",
                   help="the paper's CNN in Keras (TensorFlow) or in PyTorch")
    p.add_argument("--nodes", type=int, default=2, help="K one-CPU nodes = K trainers")
    p.add_argument("--schemes", default="sync,async")
    p.add_argument("--train-size", type=int, default=12000)
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=None,
                   help="master epochs (default: 4 for the CNN, 8 with --numpy)")
    p.add_argument("--rounds-per-epoch", type=int, default=4)
    p.add_argument("--numpy-fit-s", type=float, default=0.4,
                   help="with --numpy: seconds each train call sleeps (stands for compute)")
    p.add_argument("--faults-per-run", type=float, default=3)
    p.add_argument("--baselines", type=int, default=2,
                   help="fault-free runs per scheme (the first is the reference)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=None,
                   help="a run's watchdog, s (default: 4x the fault-free run + 60 s)")
    p.add_argument("--json", help="write every run's raw record and analysis here")
    p.add_argument("--logs", help="keep each run's logs and checkpoints here (default: a "
                   "temp directory, removed unless a run hung or failed)")
    p.add_argument("--one-run", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.one_run:
        with open(args.one_run) as f:
            spec = json.load(f)
        result = one_run(spec)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    if args.epochs is None:
        args.epochs = 8 if args.numpy else 4
    if args.nodes < 2:
        p.error("--nodes must be at least 2: one trainer must survive each fault")
    schemes = [s for s in args.schemes.split(",") if s]
    from ddlf_actors.apps import datasets

    if datasets.locate("fashion-mnist") is None:
        p.error("Fashion-MNIST not found: `apt-get download dataset-fashion-mnist && dpkg-deb "
                "-x dataset-fashion-mnist_*.deb DIR` and set DDLF_DATA_DIR=DIR/usr/share/"
                "datasets, or run `ddlf-train fetch fashion-mnist`")
    root = args.logs or tempfile.mkdtemp(prefix="ddlf-chaos-")
    os.makedirs(root, exist_ok=True)
    # One dataset cache for every run: built by the first, mapped by the rest.
    os.environ.setdefault("DDLF_CACHE_DIR", os.path.join(root, "cache"))
    if args.numpy and args.framework != "keras":
        p.error("--numpy and --framework: the numpy model is neither")
    what = ("numpy softmax" if args.numpy else
            "paper CNN (PyTorch)" if args.framework == "torch" else "paper CNN (Keras)")
    log(f"train_chaos: {args.runs} runs, {what}, K={args.nodes}, schemes {schemes}, "
        f"logs in {root}; load {os.getloadavg()}")

    runs, specs = [], []
    bases: dict = {}
    for scheme in schemes:
        for b in range(args.baselines):
            spec = _spec(args, b, scheme, False, root, None)
            r = run_process(spec, args.timeout or 900)
            log(f"baseline {scheme} #{b}: {r['status']} {r.get('train_s', 0):.1f} s, "
                f"accuracy {r.get('final_accuracy')}")
            runs.append(r)
            specs.append(spec)
            if r["status"] == "ok" and scheme not in bases:
                bases[scheme] = r
        if scheme not in bases:
            log(f"no fault-free {scheme} run finished: cannot time faults for it")
    for i in range(args.runs):
        scheme = schemes[i % len(schemes)]
        base = bases.get(scheme)
        if base is None:
            continue
        spec = _spec(args, i, scheme, True, root, _training_s(base))
        timeout = args.timeout or 4 * base["train_s"] + 60
        r = run_process(spec, timeout)
        a = analyse(r, base, spec)
        kinds = [m["kind"] for m in a["faults"]]
        log(f"run {i} {scheme}: {r['status']} {r.get('train_s', 0):.1f} s, faults {kinds}, "
            f"accuracy {r.get('final_accuracy')} (Δ {a.get('acc_diff')}) "
            f"{r.get('error', '')}")
        runs.append(r)
        specs.append(spec)

    analyses = [analyse(r, bases.get(r["scheme"]), s) for r, s in zip(runs, specs)]
    print(f"\n{what} on Fashion-MNIST ({args.train_size} train / {args.test_size} test), "
          f"K={args.nodes} one-CPU nodes, {args.epochs} epochs x {args.rounds_per_epoch} "
          f"rounds, checkpoint every round, seed {args.seed}"
          + (f", fit sleeps {args.numpy_fit_s} s" if args.numpy else "")
          + f"; load average at the end {os.getloadavg()[0]:.1f}")
    print(format_runs(runs, analyses))
    print()
    print(format_faults(analyses, runs))
    chaos = [r for r in runs if r["chaos"]]
    print(f"\nruns with faults: {len(chaos)}; finished "
          f"{sum(r['status'] == 'ok' for r in chaos)}, hangs "
          f"{sum(r['status'] == 'hang' for r in chaos)}, failed "
          f"{sum(r['status'] == 'failed' for r in chaos)}; faults injected "
          f"{sum(len(a['faults']) for r, a in zip(runs, analyses) if r['chaos'])}; "
          f"losses with no injected fault "
          f"{sum(a['unexplained_losses'] for r, a in zip(runs, analyses) if r['chaos'])}")
    for scheme in schemes:
        accs = [r["final_accuracy"] for r in runs if not r["chaos"] and r["scheme"] == scheme
                and r.get("final_accuracy") is not None]
        if len(accs) > 1:
            print(f"fault-free {scheme} runs: accuracies {', '.join(f'{a:.4f}' for a in accs)} "
                  f"(spread {100 * (max(accs) - min(accs)):.2f} points)")
    print()
    print(format_targets(targets(runs, analyses)))
    leftovers = [x for r in runs for x in r.get("leftovers", [])]
    if leftovers:
        print(f"processes left behind and killed: {leftovers}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "analyses": analyses}, f, indent=1)
    bad = [r for r in chaos if r["status"] != "ok"]
    if not args.logs and not bad:
        shutil.rmtree(root, ignore_errors=True)
    elif bad:
        print(f"logs of the runs that hung or failed are in {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
