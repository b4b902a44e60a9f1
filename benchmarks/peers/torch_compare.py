"""The paper CNN in PyTorch on Fashion-MNIST, side by side: one process, torch DDP,
torchft's DiLoCo, DDLF on PyTorch (its defaults, and the paper's Algorithm 6), and DDLF's
Keras on TF and on JAX. Issue 24 §3.

    python benchmarks/peers/torch_compare.py --select --choices choices.json      # 1. choose lr
    python benchmarks/peers/torch_compare.py --choices choices.json               # 2. report
    python benchmarks/peers/torch_compare.py --limit 3200 --seeds 0 --epochs 1 \\
        --eval-limit 2000                                                    # a smoke run
    python benchmarks/peers/torch_compare.py --link 100mbit --choices choices.json \\
        --columns torch-ddp,torchft-diloco,ddlf-torch-default,ddlf-torch-alg6 # 2 hosts

The protocol of the evidence issue (21, section 1):

* **Choices on a validation split.** ``--select`` trains every tunable column on the
  first 50,000 training images with each learning rate of the grid (SGD, momentum 0.9,
  lr in {0.01, 0.03, 0.1}), evaluates on the last 10,000, and picks, per column, the rate
  that first reaches ``--target`` (earliest, in epochs; ties and no crossing: the best
  accuracy after the last epoch). It prints the selection table and writes the choices
  to ``--choices``. The report run reads them and then uses the test set, once per run.
* **Seeds** (``--seeds``, default 0,1,2): each changes the initial weights
  (``torch.manual_seed``) and the data order (a permutation per epoch from
  ``numpy.random.default_rng([seed, epoch])``); the same seed gives every column the same
  initial weights and the same order of images.
* **Fine evaluation**: ``--evals-per-epoch`` (default 4) evaluations of the global model
  per epoch, plus one at each epoch's end; the first crossing of ``--target`` is reported.
  Evaluation time is excluded from every column the same way: the clock stops while it
  runs, and in the two-process columns both processes wait at a barrier meanwhile.
* **Interleaved**: seed 1 of every column, then seed 2, ...; each run is its own process
  (its own threads and imports), and the load average is printed beside it.
* **Three numbers apart**: seconds per epoch (training time / epochs), epochs to the
  target, time to the target; and the test accuracy after ``--epochs`` epochs.

Columns (``--columns``):

torch-1p        one process, ``torch.set_num_threads(2)``, batch 32, SGD momentum 0.9.
                (Its two OpenMP threads spin between ops by default, which on a busy
                machine costs several times their speed: ``--omp-wait-policy passive``.)
torch-1p-1t     the same with one thread: a DDLF trainer's own compute, the baseline of
                "DDLF-torch with Algorithm 6 adds nothing measurable" (each of its 2
                trainers trains half an epoch on one thread, so its seconds per epoch
                compare with half of this column's).
torch-ddp       ``torchrun --standalone --nproc_per_node 2``: two processes of 1 thread,
                ``DistributedDataParallel`` over gloo (gradients all-reduced every step),
                batch 32 per process (global 64), the same grid (the learning rate applies
                to the averaged gradient). Rank 0 evaluates at 2 threads between steps
                while rank 1 waits at a barrier.
torchft-diloco  torchft's ``DiLoCo`` (``pip install torchft``): two replicas of 1 thread,
                a lighthouse, inner SGD momentum 0.9 (lr from the grid), outer SGD lr 0.7,
                Nesterov momentum 0.9 (the DiLoCo paper's), a sync every ``--sync-every``
                (16) inner steps: DDLF's default of about 16 local steps per round.
                Evaluated right after a sync (the global model), at the first sync past
                each quarter of an epoch.
ddlf-torch-default
                ``train_sync(models.paper_cnn_torch, ...)`` on an embedded DDLF cluster: 2
                trainers of 1 thread, batch 32 each, ``optimizer=`` SGD momentum 0.9 (lr
                from the grid, tuned like the others), every scheme setting at DDLF's
                default (``apps/schemes/rounds.py``: rounds of ~16 local steps, outer
                Nesterov 0.9 at 0.7). Evaluated by the trainers every
                ``rounds_per_epoch // --evals-per-epoch`` rounds and after each epoch's last
                round; the clock is the rows' round times minus their evaluation time.
ddlf-torch-alg6 the same with the paper's Algorithm 6 (``rounds_per_epoch=1,
                outer_momentum=0, lr_scaling="none"``: a plain average once per epoch). Its
                global model exists only at each epoch's end, so it has one evaluation per
                epoch, not ``--evals-per-epoch``.
ddlf-torch-ring
                ``train(..., scheme="allreduce")``: the trainers all-reduce their outer
                gradients in a ring (no driver on the path: both directions of a link busy
                at once, as torchft's DiLoCo), every other setting at DDLF's default.
ddlf-torch-ring-int4
                the setting DDLF's docs give for slow links (issue 23's fastest to a target
                at 100 Mbit/s with a 5 M-parameter model): the ring with ``overlap=True``
                (the collective runs while the next round's steps do) and
                ``compression="int4:ef"`` (4-bit per hop, with error feedback).
keras-tf, keras-jax
                DDLF's defaults with ``models.paper_cnn`` (Keras, the optimizer it compiles,
                Adam 1e-3; not tuned) on TensorFlow and, with ``keras_backend="jax"``, on JAX in the
                trainers; for the record, evaluated as ``ddlf-torch-default``.

The two-process columns run in a private network namespace (``unshare -n``, loopback
only): torchrun's store and torchft's servers listen on every interface, and nothing
here may be reachable from outside. That needs root (CI and this machine's sessions
are); without it those columns say so.

``--link 100mbit`` (or ``1gbit``; root) runs the distributed columns across two emulated
hosts (``link_hosts.py``: network namespaces on a bridge, each host's link limited to the
rate both ways by ``tc ... tbf``, each host capped at ``--host-cpus`` CPUs by a cgroup):
torch-ddp as a torchrun per host, torchft-diloco with the lighthouse and replica 0 in
host A and replica 1 in host B, and the DDLF columns with a head, a node and the driver in
host A and a node in host B, so that trainer B's weights and deltas cross the links. The
single-process columns run as without it. The table adds host A's link: the MB it carried
over the whole run, and over the timed training the MB per local step and per exchange
and the seconds a step's bytes need at the rate. The hosts are made once and removed at
the end, also on an error, Ctrl-C, SIGTERM or SIGHUP; each run's processes are ended
before the next.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")   # before numpy and torch load

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)

from benchmarks.emulation.emu_streaming import options_for  # noqa: E402
from benchmarks.emulation.link_hosts import (  # noqa: E402
    RATES,
    LinkMeter,
    counter_delta,
)
from benchmarks.peers.torch_common import (  # noqa: E402
    BATCH,
    Timeline,
    build,
    child_flags,
    eval_marks,
    evaluate,
    load_split,
    log,
    order,
    parse_child,
    relay_epochs,
    sgd,
    split_dataset,
    start_in,
    wait_all,
)
from benchmarks.peers.torch_ddp import linked_ddp, run_ddp, run_ddp_rank  # noqa: E402
from benchmarks.peers.torch_report import choose, report_table  # noqa: E402
from benchmarks.peers.torchft_diloco import (  # noqa: E402
    linked_diloco,
    run_diloco,
    run_diloco_replica,
    serve_lighthouse,
)

GRID = (0.01, 0.03, 0.1)
TUNED = ("torch-1p", "torch-1p-1t", "torch-ddp", "torchft-diloco", "ddlf-torch-default",
         "ddlf-torch-alg6", "ddlf-torch-ring", "ddlf-torch-ring-int4")
DDLF = ("ddlf-torch-default", "ddlf-torch-alg6", "ddlf-torch-ring", "ddlf-torch-ring-int4",
        "keras-tf", "keras-jax")
ALL_COLUMNS = TUNED + ("keras-tf", "keras-jax")
IN_NETNS = ("torch-ddp", "torchft-diloco")


def _setting(name: str) -> dict:
    """``train``'s options for a setting of ``emu_streaming.SETTINGS`` (the one table of
    them; ``+codec`` is int4 with error feedback); a sync setting without ``scheme``, so
    ``train_sync`` takes it too."""
    scheme, options = options_for(name, "int4:ef", 1)
    return options if scheme == "sync" else {"scheme": scheme, **options}


# The paper's Algorithm 6 as sync's options: one plain average per epoch.
ALG6 = _setting("alg6")
# The ring; and DDLF's setting for slow links (docs/training.md): overlapped, 4-bit per hop.
RING = _setting("allreduce")
RING_INT4 = _setting("allreduce+overlap+codec")
# --link: these run across the two emulated hosts; the single-process ones stay as they are.
LINKED = ("torch-ddp", "torchft-diloco") + DDLF


# -- torch-1p ---------------------------------------------------------------------------------


def run_single(args, threads: int = 2) -> dict:
    import torch
    import torch.nn.functional as F

    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    TorchAdapter.configure_threads(threads)
    t0 = time.perf_counter()
    x, y, xe, ye = load_split(args.split, args.limit, args.eval_limit)
    model = build(args.seed)
    opt = sgd(model.parameters(), args.lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    steps = math.ceil(len(x) / BATCH)
    marks = eval_marks(steps, args.evals_per_epoch)
    ready_s = time.perf_counter() - t0
    tl = Timeline()
    for epoch in range(args.epochs):
        idx = torch.from_numpy(order(args.seed, epoch, len(x)))
        model.train()
        for step in range(1, steps + 1):
            b = idx[(step - 1) * BATCH:step * BATCH]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xt[b]), yt[b]).backward()
            opt.step()
            if step in marks:
                tl.pause()
                e0 = time.perf_counter()
                loss, acc = evaluate(model, xe, ye)
                tl.record(epoch + step / steps, loss, acc, time.perf_counter() - e0)
                model.train()
                tl.resume()
    return {"startup_s": ready_s, "train_s": tl.train_s, "timeline": tl.rows}


# -- torch-ddp (each rank runs this under torchrun) -------------------------------------------


# -- DDLF's columns: train_sync on an embedded cluster of 2 one-CPU trainers -----------------



def keras_cnn(seed: int):
    import keras

    from ddlf_actors.apps import models

    keras.utils.set_random_seed(seed)
    return models.paper_cnn()


def ddlf_timeline(history: list) -> Timeline:
    """A DDLF run's history as this script's timeline. Training time is the rounds' wall
    time minus the trainers' evaluation time in them. The first round's wall time starts
    when training does (8562c90), so the trainers' start-up (``startup_s``, reported
    apart) is not in it and is not taken out again: doing so made times negative."""
    tl = Timeline()
    for row in history:
        tl.train_s += row["wall_s"] - row.get("eval_s", 0.0)
        if row.get("test_accuracy") is not None:
            tl.record(row["epoch"], row["test_loss"], row["test_accuracy"],
                      row.get("eval_s", 0.0))
    return tl


def link_rows(workers: int):
    """A ``Callback`` that reads this host's link counters over the timed training: from
    ``on_train_begin`` (the trainers are up; the clock of the first round starts next and
    holds the first weights' shipping) to the last history row, one row a round. Its
    ``record()`` is the run's ``link`` record (None without ``--link``). Starting at the
    first row instead left a one-round run (Algorithm 6 for one epoch) with nothing."""
    from ddlf_actors.apps.callbacks import Callback

    class LinkRows(Callback):
        def __init__(self):
            self.meter = LinkMeter()
            self.rows = 0
            self.samples = 0

        def on_train_begin(self, run):
            self.meter.start()

        def on_row(self, row, run):
            self.meter.stop()
            self.rows += 1
            self.samples += row.get("samples") or 0

        def record(self):
            return self.meter.record(self.samples / (workers * BATCH), self.rows)

    return LinkRows()


def run_ddlf(args, model_fn, **options) -> dict:
    """One DDLF run of 2 trainers: its timeline, start-up and settings."""
    import functools

    import ddlf_actors as ddlf
    from ddlf_actors.apps import train
    from ddlf_actors.apps.schemes.rounds import default_rounds

    x, *_ = load_split(args.split, args.limit, args.eval_limit)
    rounds = options.get("rounds_per_epoch") or default_rounds(len(x) / 2, BATCH)
    meter = link_rows(workers=2)
    if args.head:   # --link: the head and a node per host are up; this driver is in host A
        ddlf.init(address=args.head)
    else:
        ddlf.init(num_cpus=2)
    try:
        result = train(model_fn, functools.partial(split_dataset, args.split, args.limit,
                                                   args.eval_limit),
                       workers=2, master_epochs=args.epochs, batch_size=BATCH,
                       seed=args.seed, progress=False, callbacks=[meter],
                       eval_every=max(1, rounds // args.evals_per_epoch), **options)
    finally:
        ddlf.shutdown()
    tl = ddlf_timeline(result.history)
    return {"startup_s": result.startup_s, "train_s": tl.train_s, "timeline": tl.rows,
            "link": meter.record(),
            "settings": {k: v for k, v in result.options.to_json().items()
                         if k in ("rounds_per_epoch", "outer_lr", "outer_momentum",
                                  "nesterov", "lr_scaling", "warmup_rounds", "eval_every")}}


def run_ddlf_column(args, column: str) -> dict:
    """DDLF on PyTorch: ``ddlf-torch-default`` (every scheme setting at its default) or
    ``ddlf-torch-alg6`` (the paper's Algorithm 6), ``ddlf-torch-ring`` (the ring) or
    ``ddlf-torch-ring-int4`` (the ring for slow links); ``optimizer=`` SGD momentum 0.9 at
    ``args.lr``, as the single-process and DDP columns train."""
    import functools

    options: dict = {"optimizer": functools.partial(sgd, lr=args.lr)}
    options.update({"ddlf-torch-alg6": ALG6, "ddlf-torch-ring": RING,
                    "ddlf-torch-ring-int4": RING_INT4}.get(column, {}))
    return run_ddlf(args, functools.partial(build, args.seed), **options)


def run_keras_column(args, column: str) -> dict:
    """DDLF's defaults with the Keras paper CNN on TensorFlow (``keras-tf``) or JAX
    (``keras-jax``: ``keras_backend="jax"`` in the trainers; the driver needs neither)."""
    import functools

    backend = {"keras-tf": "tensorflow", "keras-jax": "jax"}[column]
    return run_ddlf(args, functools.partial(keras_cnn, args.seed), keras_backend=backend)


# -- the parent: columns in processes, interleaved --------------------------------------------


def run_column_here(args) -> dict:
    column = args.column
    if column == "torch-1p":
        return run_single(args)
    if column == "torch-1p-1t":
        return run_single(args, threads=1)
    if column == "torch-ddp":
        return run_ddp(args, os.path.abspath(__file__))
    if column == "torchft-diloco":
        return run_diloco(args, os.path.abspath(__file__))
    if column.startswith("ddlf-"):
        return run_ddlf_column(args, column)
    return run_keras_column(args, column)


def run_args(args, seed: int, lr: float | None, split: str, eval_threads: int):
    """``args`` with one run's seed, rate and split (what a child's flags carry)."""
    return argparse.Namespace(**{**vars(args), "seed": seed, "lr": lr, "split": split,
                                 "eval_threads": eval_threads})



def run_column(args, column: str, seed: int, lr: float | None, split: str,
               hosts=None) -> dict:
    """One column, one seed: :func:`run_one`'s result with ``run_s``, the run's wall time
    in all (start-up, evaluations and teardown included: what a grid's duration adds up
    from), also logged."""
    t0 = time.monotonic()
    result = run_one(args, column, seed, lr, split, hosts)
    result["run_s"] = time.monotonic() - t0
    log(f"  {column} seed {seed}: {result['run_s']:.0f} s in all")
    return result


def run_one(args, column: str, seed: int, lr: float | None, split: str, hosts) -> dict:
    """One column, one seed, in its own process (in a private network namespace for the
    two-process columns; with ``hosts``, a ``LinkHosts``, the distributed columns across
    its two emulated hosts); the result with the load average beside it."""
    load = os.getloadavg()[0]
    base = {"column": column, "seed": seed, "lr": lr, "split": split, "loadavg": load,
            "link_rate": hosts.rate if hosts is not None and column in LINKED else None}
    if hosts is not None and column in LINKED:
        log(f"{column} seed {seed} lr {lr} ({split}), {hosts.rate} links, load {load:.2f}")
        # A host has one CPU (--host-cpus' default): rank 0 evaluates on one thread, as
        # DDLF's one-thread trainers do; a second thread would only contend for it.
        return {**base, **run_linked(run_args(args, seed, lr, split, 1), column, hosts)}
    flags = ["--column", column, *child_flags(run_args(args, seed, lr, split, 2))]
    cmd = [sys.executable, os.path.abspath(__file__), *flags]
    if column in IN_NETNS:
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
            return {**base, "unavailable": "needs root, unshare and ip for a private network "
                                           "namespace (its servers listen on every interface)"}
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    log(f"{column} seed {seed} lr {lr} ({split}), load {load:.2f}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=args.timeout + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {**base, "error": f"timeout after {args.timeout + 60:.0f} s"}
    except BaseException:   # Ctrl-C, SIGTERM: the run is in a session of its own
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise
    relay_epochs(err)
    result = parse_child(subprocess.CompletedProcess(cmd, proc.returncode, out, err), column)
    return {**base, **result}


# -- --link: the distributed columns across two emulated hosts --------------------------------


def run_linked(args, column: str, hosts) -> dict:
    """``column`` across ``hosts`` (host A = 0, host B = 1), every process of the run
    ended afterwards however it went. Adds ``link_total``: the bytes each host's link
    carried over the whole run (start-up included), as the bridge side counts them."""
    before = hosts.counters()
    try:
        if column == "torch-ddp":
            result = linked_ddp(args, hosts, os.path.abspath(__file__))
        elif column == "torchft-diloco":
            result = linked_diloco(args, hosts, os.path.abspath(__file__))
        else:
            result = linked_ddlf(args, column, hosts)
        after = hosts.counters()
        result["link_total"] = [counter_delta(b, a) for b, a in zip(before, after)]
        return result
    except Exception as e:   # the column's error, in the table; the hosts stay up
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        hosts.end_run()



def linked_ddlf(args, column: str, hosts) -> dict:
    """A head and a node in host A, a node in host B, and this column's driver in host A
    (``--head``): trainer B's weights and deltas cross the links."""
    address = hosts.start_ddlf()
    proc, files = start_in(hosts, 0, [sys.executable, os.path.abspath(__file__), "--column",
                                      column, "--head", address, *child_flags(args)])
    (out,) = wait_all([proc], [files], args.timeout + 60, [f"{column}'s driver"])
    relay_epochs(out.stderr)
    return parse_child(out, column)



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--columns", default=",".join(ALL_COLUMNS))
    p.add_argument("--select", action="store_true", help="choose lr on the validation split")
    p.add_argument("--choices", help="JSON of chosen settings: written by --select, read "
                                     "otherwise (default: lr 0.03 for every column)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--sync-every", type=int, default=16,
                   help="torchft-diloco: inner steps (16: DDLF's STEPS_PER_ROUND)")
    p.add_argument("--limit", type=int, help="train on the first N images (smoke runs)")
    p.add_argument("--eval-limit", type=int, help="evaluate on the first N (smoke runs)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    p.add_argument("--omp-wait-policy", choices=("default", "passive"), default="default",
                   help="passive: OMP_WAIT_POLICY=PASSIVE in every run (torch's OpenMP "
                        "threads sleep instead of spinning; see docs/benchmarks/peers.md)")
    p.add_argument("--json", help="also write every run here")
    p.add_argument("--link", choices=("none", *RATES), default="none",
                   help="run the distributed columns across two emulated hosts (network "
                        "namespaces, tbf-limited links of this rate, --host-cpus each); "
                        "needs root")
    p.add_argument("--host-cpus", type=float, default=1.0,
                   help="--link: each host's CPU cap (a cgroup); 0: uncapped")
    p.add_argument("--priority", type=float, default=8.0,
                   help="--link: the hosts' CPU weight against the machine's other "
                        "processes, in ordinary processes (cluster_emu.py's --priority; "
                        "0.02 is about nice 19)")
    # one run, in a child process
    p.add_argument("--column", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lr", type=float, default=0.03, help=argparse.SUPPRESS)
    p.add_argument("--split", default="test", help=argparse.SUPPRESS)
    p.add_argument("--ddp-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--diloco-replica", type=int, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", help=argparse.SUPPRESS)
    p.add_argument("--barrier-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--barrier-addr", help=argparse.SUPPRESS)
    p.add_argument("--host-ip", help=argparse.SUPPRESS)
    p.add_argument("--head", help=argparse.SUPPRESS)
    p.add_argument("--eval-threads", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse-server", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.ddp_rank:
        run_ddp_rank(args)
        return 0
    if args.diloco_replica is not None:
        run_diloco_replica(args)
        return 0
    if args.lighthouse_server:
        serve_lighthouse(args)
        return 0
    if args.column:
        try:
            result = run_column_here(args)
        except Exception as e:   # report it as the column's error, with the parent's table
            result = {"error": f"{type(e).__name__}: {e}"}
            import traceback

            traceback.print_exc()
        print(json.dumps(result), flush=True)
        return 0

    columns = [c for c in args.columns.split(",") if c]
    unknown = [c for c in columns if c not in ALL_COLUMNS]
    if unknown:
        p.error(f"unknown columns {unknown}; known: {', '.join(ALL_COLUMNS)}")
    # Every column trains PyTorch; without it each run would fail in its own child process
    # and the table would be a column of errors, so say it once, before anything starts.
    if importlib.util.find_spec("torch") is None:
        p.error("every column trains PyTorch, which is not installed in this Python: "
                "pip install -e '.[torch]'")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.omp_wait_policy == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"   # inherited by every run's processes
    log(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    log(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    hosts = None
    if args.link != "none":
        from benchmarks.emulation.link_hosts import LinkHosts, link_unavailable

        why = link_unavailable(args.host_cpus)
        if why:
            print(f"torch_compare --link skipped: {why}")
            return 0
        # SIGTERM and SIGHUP as Ctrl-C: unwind through the finally below, which removes
        # the namespaces, the cgroups and every process of the run.
        signal.signal(signal.SIGTERM, _interrupted)
        signal.signal(signal.SIGHUP, _interrupted)
        hosts = LinkHosts(args.link, host_cpus=args.host_cpus or None,
                          priority=args.priority).up()
    results: list = []
    try:
        run_all(args, columns, seeds, hosts, results)
    finally:
        if hosts is not None:
            hosts.close()
        if args.json:   # what ran, also after an error or Ctrl-C
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    print(f"\nload average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_all(args, columns: list, seeds: list, hosts, results: list) -> None:
    """The selection (``--select``) or the report, appending each run to ``results``."""
    cpus = f"{args.host_cpus:g} CPU each" if args.host_cpus else "uncapped"
    where = (f", the distributed columns across 2 hosts at {args.link} ({cpus})"
             if hosts is not None else "")
    if args.select:
        tuned = [c for c in columns if c in TUNED]
        for seed in seeds[:1]:   # one seed for the choice; the report takes every seed
            for lr in GRID:
                for column in tuned:
                    results.append(run_column(args, column, seed, lr, "val", hosts))
        print(report_table(results, args.target, "Selection on the validation split "
                                                  "(last 10,000 training images), seed "
                                                  f"{seeds[0]}{where}"))
        chosen = choose(results, args.target)
        print("\nchosen:", json.dumps(chosen))
        if args.choices:
            with open(args.choices, "w") as f:
                json.dump(chosen, f, indent=1)
    else:
        chosen = {}
        if args.choices:
            with open(args.choices) as f:
                chosen = json.load(f)
        for seed in seeds:
            for column in columns:
                lr = chosen.get(column, {}).get("lr", 0.03) if column in TUNED else 0.01
                results.append(run_column(args, column, seed, lr, "test", hosts))
        print(report_table(results, args.target, f"Test set, seeds {args.seeds}, "
                                                  f"{args.epochs} epoch(s), OMP_WAIT_POLICY="
                                                  f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
                                                  f"{where}"))


if __name__ == "__main__":
    sys.exit(main())
