"""The GPT on Debian's fortunes on 2 real cores, side by side (issue 32 §4): one tuned
process, torch DDP, torchft's DiLoCo and DDLF's defaults, all in PyTorch.

    python benchmarks/training/lm_compare.py --select --choices lm_choices.json   # 1. lr
    python benchmarks/training/lm_compare.py --choices lm_choices.json           # 2. the table
    python benchmarks/training/lm_compare.py --size tiny --context 64 --epochs 0.02 \\
        --seeds 0 --eval-windows 64                                              # a smoke run

The protocol of ``train_compare.py`` (issue 21 §1), for text:

* **Choices on the validation split.** ``--select`` trains every column with each peak
  learning rate of the grid (AdamW with warm-up and cosine decay, ``lm/schedule.py``;
  peak in {3e-4, 1e-3, 3e-3}) on the training split and evaluates on the validation
  split (never the test split); per column the rate with the lowest validation loss after
  the budget wins. The **target loss** is the validation loss of the chosen single
  process after the budget (issue 32: "the loss the tuned single process reaches after
  one epoch"); it is written to ``--choices`` with the rates. The report trains on the
  training split and evaluates on the test split.
* **The same budget for every column**: ``--epochs`` passes over the training split
  (default 1: 2.29 M tokens; fractions allowed), the same batch of 32 windows per
  process (DDP and the DDLF trainers: 32 each, global 64), each column's cosine decaying
  over its own steps of that budget.
* **Seeds** (``--seeds``, default 0,1,2) change the initial weights (the model's seeded
  generator) and the order of windows (``numpy.random.default_rng([seed, epoch])``);
  interleaved: seed 0 of every column, then seed 1, ...; each run its own process.
* **Apart**: seconds per epoch (and tokens/s: the framework), epochs to the target loss
  (the algorithm), time to the target (both), and the loss after the budget. Evaluation
  (``--evals-per-epoch`` 4, plus the end) is taken out of every column's clock.

Columns (``--columns``):

torch-1p        one process, 2 threads (OpenMP's passive wait, as DDLF's trainers set),
                ``gpt_tiny_torch``'s own optimizer: the tuned single process.
torch-ddp       ``torchrun --standalone --nproc_per_node 2``, 1 thread each, DDP over gloo
                (gradients all-reduced every step), in a private network namespace.
torchft-diloco  torchft's ``DiLoCo``: 2 replicas of 1 thread, inner the model's AdamW,
                outer SGD 0.7 Nesterov 0.9 (DiLoCo's), a sync every 16 inner steps (DDLF's
                default round), a lighthouse; output to files (``torch_compare``'s lesson:
                an undrained stderr pipe stalled a replica mid-quorum).
ddlf-default    ``train(lm.GptModelFn(ds, ..., batch_size=32), ds, workers=2)`` on an
                embedded DDLF cluster with every scheme setting at its default (run as the
                scaling issue leaves them, not re-tuned for text): ``auto`` decides whether
                each trainer steps on the 32 windows or on 16 (its batch rule).
ddlf-split-batch  (only when named in ``--columns``) ddlf-default with each trainer on 16
                windows a step (``batch_size=16, split_batch=False``), half the single
                process's batch: as many optimizer steps per token as one process takes.
                The diagnostic that showed why the defaults learned less per token than
                one process before ``auto`` weighed the batch; not a column of the issue's
                table.
ddlf-plain-average  (only when named) ddlf-default with ``outer_momentum=0``: the round's
                average applied as it is (outer rate 1, no momentum). A diagnostic of the
                outer step on a model it was not chosen on.

The model is ``--size small`` (6.1 M parameters; ``tiny`` for smoke runs) with windows of
``--context`` 128 bytes (the byte tokenizer). The run's helpers (processes, timelines,
the table's medians) are ``torch_compare.py``'s (``peers/torch_common.py``,
``torchft_diloco.py``, ``torch_report.py``); the table and ratios are ``lm_report.py``.

Durations: ``small`` trains at 1,892 tokens per CPU second on one thread here
(``lm_frameworks.py --size small``; about 3,600 tokens/s on 2 idle cores, 2,000 counted
for a shared machine), so an epoch is 11-20 minutes a column: ``--select --epochs 0.25``
(4 columns x 3 rates) about 1.1 h, the report with ``--epochs 1`` (4 columns x 3 seeds)
about 4.1 h. ``--estimate`` prints the expected wall time of a command.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")   # before numpy and torch load

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)

import numpy as np  # noqa: E402

from benchmarks.peers import torch_common as tc  # noqa: E402
from benchmarks.peers.torch_compare import ddlf_timeline  # noqa: E402
from benchmarks.peers.torchft_diloco import store_barrier, weights_crc  # noqa: E402
from benchmarks.training.lm_report import figures, ratio_lines, report_table  # noqa: E402

BATCH = 32
GRID = (3e-4, 1e-3, 3e-3)
COLUMNS = ("torch-1p", "torch-ddp", "torchft-diloco", "ddlf-default")
IN_NETNS = ("torch-ddp", "torchft-diloco")
log = tc.log


# -- data, model, evaluation (in the training processes) --------------------------------------


def text_split(args):
    """``(ds, x, y, x_eval, y_eval)``: the training windows and the evaluation split's
    (validation for ``--select``, test for the report), at most ``--eval-windows``."""
    from ddlf_actors.apps import datasets

    ds = datasets.corpus("fortunes", context=args.context).prepare()
    (x, y), _ = ds.load_shared()
    xe, ye = ds.split_windows("validation" if args.split == "val" else "test")
    n = min(len(xe), args.eval_windows or len(xe))
    return ds, x, y, xe[:n], ye[:n]


def steps_for(n_windows: int, per_step: int, epochs: float) -> tuple[int, int]:
    """``(steps per epoch, steps of the budget)`` for ``per_step`` windows a step."""
    per_epoch = max(1, n_windows // per_step)
    return per_epoch, max(1, round(per_epoch * epochs))


def build(args, total_steps: int):
    from ddlf_actors.apps import lm

    return lm.gpt_tiny_torch(256, args.context, args.size, learning_rate=args.lr,
                             total_steps=total_steps, seed=args.seed)


def evaluate(model, xe, ye, threads: int | None = None) -> tuple[float, float]:
    """``(loss, next-token accuracy)`` through the PyTorch adapter."""
    return tc.evaluate(model, xe[:], ye[:], threads)


def batches(x, y, args, epoch: int, rank: int = 0, world: int = 1):
    """This rank's windows of each step of ``epoch``, gathered from the map."""
    import torch

    idx = np.random.default_rng([args.seed, epoch]).permutation(len(x))
    per_step = BATCH * world
    for s in range(len(x) // per_step):
        b = np.sort(idx[s * per_step + rank * BATCH:s * per_step + (rank + 1) * BATCH])
        yield (torch.from_numpy(x[b].astype(np.int64)),
               torch.from_numpy(y[b].astype(np.int64)))


def lm_loss(model, xb, yb):
    import torch.nn.functional as F

    out = model(xb)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1))


def train_loop(args, model, opt, x, y, xe, ye, *, rank=0, world=1, eval_threads=None,
               inner=None):
    """The budget's steps (``args.epochs`` epochs) with evaluations at ``eval_marks``
    (DDP's all-reduce is inside ``model``'s backward); ``inner``: the module evaluated
    (DDP's wrapped one). Returns the timeline."""
    per_epoch, total = steps_for(len(x), BATCH * world, args.epochs)
    marks = {m + e * per_epoch for e in range(math.ceil(args.epochs))
             for m in tc.eval_marks(per_epoch, args.evals_per_epoch)}
    marks = {m for m in marks if m <= total} | {total}
    tl = tc.Timeline()
    done = 0
    for epoch in range(math.ceil(args.epochs)):
        model.train()
        for xb, yb in batches(x, y, args, epoch, rank, world):
            opt.zero_grad(set_to_none=True)
            lm_loss(model, xb, yb).backward()
            opt.step()
            done += 1
            if done in marks:
                tl.pause()
                if world > 1:
                    import torch.distributed as dist

                    dist.barrier()
                if rank == 0:
                    e0 = time.perf_counter()
                    loss, acc = evaluate(inner or model, xe, ye, eval_threads)
                    tl.record(done / per_epoch, loss, acc, time.perf_counter() - e0)
                if world > 1:
                    dist.barrier()
                model.train()
                tl.resume()
            if done >= total:
                return tl
    return tl


# -- the columns --------------------------------------------------------------------------------


def run_single(args) -> dict:
    from ddlf_actors.apps.frameworks.threads import limit_threads
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    limit_threads(2)
    TorchAdapter.configure_threads(2)
    t0 = time.perf_counter()
    _, x, y, xe, ye = text_split(args)
    model = build(args, steps_for(len(x), BATCH, args.epochs)[1])
    opt = model.default_optimizer()
    ready = time.perf_counter() - t0
    tl = train_loop(args, model, opt, x, y, xe, ye)
    return {"startup_s": ready, "train_s": tl.train_s, "timeline": tl.rows,
            "tokens_per_epoch": len(x) * args.context}


def run_ddp_rank(args) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    TorchAdapter.configure_threads(1)
    t0 = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=1800))
    rank, world = dist.get_rank(), dist.get_world_size()
    _, x, y, xe, ye = text_split(args)
    model = build(args, steps_for(len(x), BATCH * world, args.epochs)[1])
    ddp = DDP(model)
    opt = model.default_optimizer()
    dist.barrier()
    ready = time.perf_counter() - t0
    tl = train_loop(args, ddp, opt, x, y, xe, ye, rank=rank, world=world,
                    eval_threads=args.eval_threads, inner=model)
    if rank == 0:
        print(json.dumps({"startup_s": ready, "train_s": tl.train_s, "timeline": tl.rows,
                          "tokens_per_epoch": len(x) * args.context}), flush=True)
    dist.destroy_process_group()


def run_ddp(args) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", os.path.abspath(__file__), "--ddp-rank", *child_flags(args)]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc, files = tc.start_to_files(subprocess.Popen, cmd, env=env)
    (out,) = tc.wait_all([proc], [files], args.timeout, ["torchrun"])
    if proc.poll() is None:
        proc.kill()
    tc.relay_epochs(out.stderr)
    return tc.parse_child(out, "torchrun")


def run_diloco_replica(args) -> None:
    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    TorchAdapter.configure_threads(1)
    t0 = time.perf_counter()
    rank, world = args.diloco_replica, args.diloco_world
    _, x, y, xe, ye = text_split(args)
    per_epoch, total = steps_for(len(x), BATCH * world, args.epochs)
    model = build(args, total)
    inner = model.default_optimizer()
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    # On emulated hosts (lm_emu.py): this replica's host address (the others reach its
    # store and manager there) and host A's for the barrier; else all on the loopback.
    host = args.host_ip or "localhost"
    own = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    shared = dist.TCPStore(args.barrier_addr or "localhost", args.barrier_port,
                           is_master=False, timeout=timedelta(seconds=1800))
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=300)), min_replica_size=world,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                    inner.load_state_dict(sd["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        replica_id=str(rank), store_addr=host, store_port=own.port, rank=0,
        world_size=1, lighthouse_addr=args.lighthouse, hostname=host,
        init_sync=False, use_async_quorum=False, timeout=timedelta(seconds=300),
        quorum_timeout=timedelta(seconds=300), connect_timeout=timedelta(seconds=60))
    every = args.sync_every
    quarter = per_epoch / args.evals_per_epoch
    store_barrier(shared, "ready", world)
    ready = time.perf_counter() - t0
    tl = tc.Timeline()
    done, n_evals, due = 0, 0, quarter
    try:
        with DiLoCo(manager, [model], inner, outer, sync_every=every, pin_memory=False):
            for epoch in range(math.ceil(args.epochs) + 1):
                model.train()
                for xb, yb in batches(x, y, args, epoch, rank, world):
                    if done >= total and done % every == 0:
                        break
                    inner.zero_grad(set_to_none=True)
                    lm_loss(model, xb, yb).backward()
                    inner.step()   # every sync_every-th step also syncs
                    done += 1
                    if done % every or (done < due and done < total):
                        continue
                    while due <= done:
                        due += quarter
                    n_evals += 1
                    tl.pause()
                    shared.set(f"eval{n_evals}/crc{rank}", str(weights_crc(model)))
                    store_barrier(shared, f"eval{n_evals}a", world)
                    if rank == 0:
                        e0 = time.perf_counter()
                        loss, acc = evaluate(model, xe, ye, args.eval_threads)
                        tl.record(done / per_epoch, loss, acc, time.perf_counter() - e0)
                        crcs = {shared.get(f"eval{n_evals}/crc{r}") for r in range(world)}
                        tl.rows[-1]["replicas_equal"] = len(crcs) == 1
                    store_barrier(shared, f"eval{n_evals}b", world)
                    model.train()
                    tl.resume()
                else:
                    continue
                break
    finally:
        manager.shutdown(wait=False)
    if rank == 0:
        print(json.dumps({"startup_s": ready, "train_s": tl.train_s, "timeline": tl.rows,
                          "tokens_per_epoch": len(x) * args.context}), flush=True)


def run_diloco(args) -> dict:
    try:
        import torch.distributed as dist
        from torchft._torchft import LighthouseServer
    except ImportError as e:
        return {"unavailable": f"torchft is not installed ({e}); pip install torchft"}
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    barrier = dist.TCPStore("localhost", 0, world_size=3, is_master=True,
                            wait_for_workers=False)
    procs, files = [], []
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        for r in range(2):
            cmd = [sys.executable, os.path.abspath(__file__), "--diloco-replica", str(r),
                   "--lighthouse", lighthouse.address(), "--barrier-port", str(barrier.port),
                   *child_flags(args)]
            proc, pair = tc.start_to_files(subprocess.Popen, cmd, env=env)
            procs.append(proc)
            files.append(pair)
        outs = tc.wait_all(procs, files, args.timeout, ["replica 0", "replica 1"])
        tc.relay_epochs(outs[0].stderr)
        return tc.parse_child(outs[0], "replica 0", other=outs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for out, err in files:
            out.close()
            err.close()
        lighthouse.shutdown()


def run_ddlf(args, batch: int = BATCH, **given) -> dict:
    """DDLF's defaults on 2 trainers given a batch of ``batch`` windows, and ``given``."""
    import ddlf_actors as ddlf
    from benchmarks.protocol import cadence
    from ddlf_actors.apps import lm, train
    from ddlf_actors.apps.callbacks import Callback

    class StopAt(Callback):
        """Ends the run at the budget's epoch (a fraction of an epoch, in smoke runs)."""

        def on_row(self, row, run):
            if row["epoch"] >= args.epochs - 1e-9:
                run.stop = True

    ds, x, *_ = text_split(args)
    eval_split = "validation" if args.split == "val" else "test"
    ds = type(ds)(ds.source, context=args.context, eval_split=eval_split,
                  eval_windows=args.eval_windows)
    per_trainer = lm.steps_per_trainer(len(x), 2, batch, 1)
    fn = lm.GptModelFn(ds, framework="torch", size=args.size, learning_rate=args.lr,
                       total_steps=max(1, round(per_trainer * args.epochs)), seed=args.seed,
                       batch_size=batch)
    ddlf.init(num_cpus=2)
    try:
        result = train(fn, ds, workers=2, master_epochs=math.ceil(args.epochs),
                       batch_size=batch, seed=args.seed, progress=False,
                       callbacks=[StopAt()], **given,
                       # per epoch, not per round: auto may split the batch, which
                       # doubles the rounds (a budget under an epoch evaluates as often)
                       evals_per_epoch=cadence.evals_per_epoch(args.evals_per_epoch,
                                                               args.epochs))
    finally:
        ddlf.shutdown()
    tl = ddlf_timeline(result.history)
    return {"startup_s": result.startup_s, "train_s": tl.train_s, "timeline": tl.rows,
            "tokens_per_epoch": len(x) * args.context,
            "settings": {**{k: v for k, v in result.options.to_json().items()
                            if k in ("rounds_per_epoch", "outer_lr", "outer_momentum",
                                     "nesterov", "eval_every", "evals_per_epoch")},
                         "batch_size": result.config.batch_size,
                         "auto": (result.settings.get("auto") or {}).get("line")}}


RUNNERS = {"torch-1p": run_single, "torch-ddp": run_ddp, "torchft-diloco": run_diloco,
           "ddlf-default": run_ddlf,
           # Not one of COLUMNS (the table): a diagnostic, named in --columns.
           "ddlf-split-batch": lambda args: run_ddlf(args, BATCH // 2, split_batch=False),
           # and the defaults with a plain average for the outer step (no momentum, rate 1)
           "ddlf-plain-average": lambda args: run_ddlf(args, outer_momentum=0.0)}


# -- the parent ---------------------------------------------------------------------------------


def child_flags(args) -> list:
    flags = ["--seed", str(args.seed), "--lr", repr(args.lr), "--epochs", repr(args.epochs),
             "--split", args.split, "--evals-per-epoch", str(args.evals_per_epoch),
             "--sync-every", str(args.sync_every), "--timeout", str(args.timeout),
             "--eval-threads", str(args.eval_threads), "--size", args.size,
             "--context", str(args.context)]
    if args.eval_windows:
        flags += ["--eval-windows", str(args.eval_windows)]
    return flags


def run_one(args, column: str, seed: int, lr: float, split: str) -> dict:
    """One column, one seed, one rate, in its own process (a private network namespace
    for the two-process columns)."""
    load = os.getloadavg()[0]
    base = {"column": column, "seed": seed, "lr": lr, "split": split, "loadavg": load}
    run = argparse.Namespace(**{**vars(args), "seed": seed, "lr": lr, "split": split})
    cmd = [sys.executable, os.path.abspath(__file__), "--column", column, *child_flags(run)]
    if column in IN_NETNS:
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
            return {**base, "unavailable": "needs root, unshare and ip for a private network "
                                           "namespace (its servers listen on every interface)"}
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    log(f"{column} seed {seed} lr {lr} ({split}), load {load:.2f}")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=args.timeout + 120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {**base, "error": f"timeout after {args.timeout + 120:.0f} s"}
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise
    tc.relay_epochs(err)
    result = tc.parse_child(subprocess.CompletedProcess(cmd, proc.returncode, out, err), column)
    result["run_s"] = time.monotonic() - t0
    log(f"  {column} seed {seed}: {result['run_s']:.0f} s in all")
    return {**base, **result}


def rates(args) -> tuple:
    """The grid ``--select`` searches: ``--rates`` if given, else ``GRID``."""
    if not args.rates:
        return GRID
    return tuple(float(r) for r in args.rates.split(",") if r)


def save(path: str | None, results: list) -> None:
    """Every run so far to ``path`` (``--json``), after each run: a command stopped
    part-way (a benchmark started in the background ignores SIGINT, and SIGKILL skips
    ``finally``) keeps what it measured."""
    if path:
        from ddlf_actors.apps.datasets.atomic import atomic_write

        with atomic_write(path) as f:
            f.write(json.dumps(results, indent=1).encode())


def estimate(args, columns: list, seeds: list) -> float:
    """Seconds a command should take: tokens/s of ``small`` (tiny) at 2 cores from
    ``lm_frameworks.py`` on this machine, ~2,000 (13,000) for every column, plus
    evaluations (a forward pass is about a third of a step) and ~30 s a run to start."""
    rate = {"tiny": 13_000.0, "small": 2_000.0}.get(args.size, 2_000.0)
    per_run = 2_291_436 * args.epochs / rate * (1 + 0.35 * 0.11) + 30
    runs = len(columns) * (len(rates(args)) if args.select else len(seeds))
    return runs * per_run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--select", action="store_true", help="choose lr on the validation split")
    p.add_argument("--rates", help="the peak rates --select tries, comma-separated "
                                   "(default: 3e-4,1e-3,3e-3); the same for every column")
    p.add_argument("--choices", help="JSON of the chosen rates and the target loss: written "
                                     "by --select, read otherwise")
    p.add_argument("--target", type=float, help="the target loss (default: the choices' "
                                                "target, the tuned single process's loss)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=float, default=1.0, help="the budget, in epochs")
    p.add_argument("--size", default="small", help="tiny or small (sizes.SIZES)")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--eval-windows", type=int, help="evaluate on the first N (smoke runs)")
    p.add_argument("--sync-every", type=int, default=16)
    p.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds per run")
    p.add_argument("--json", help="also write every run here")
    p.add_argument("--estimate", action="store_true", help="print the expected wall time")
    p.add_argument("--column", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lr", type=float, default=1e-3, help=argparse.SUPPRESS)
    p.add_argument("--split", default="test", help=argparse.SUPPRESS)
    p.add_argument("--ddp-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--diloco-replica", type=int, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", help=argparse.SUPPRESS)
    p.add_argument("--barrier-port", type=int, help=argparse.SUPPRESS)
    # torchft DiLoCo across emulated hosts (lm_emu.py; torchft_diloco.linked_diloco)
    p.add_argument("--diloco-world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--host-ip", help=argparse.SUPPRESS)
    p.add_argument("--barrier-addr", help=argparse.SUPPRESS)
    p.add_argument("--lighthouse-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--eval-threads", type=int, default=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ddp_rank:
        run_ddp_rank(args)
        return 0
    if args.diloco_replica is not None:
        run_diloco_replica(args)
        return 0
    if args.lighthouse_server:
        from benchmarks.peers.torchft_diloco import serve_lighthouse

        serve_lighthouse(args, args.diloco_world)
        return 0
    if args.column:
        try:
            result = RUNNERS[args.column](args)
        except Exception as e:
            import traceback

            traceback.print_exc()
            result = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result), flush=True)
        return 0

    columns = [c for c in args.columns.split(",") if c]
    unknown = [c for c in columns if c not in RUNNERS]
    if unknown:
        p.error(f"unknown columns {unknown}; known: {', '.join(RUNNERS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.estimate:
        print(f"about {estimate(args, columns, seeds) / 3600:.1f} h")
        return 0
    log(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    results: list = []
    try:
        if args.select:
            for lr in rates(args):
                for column in columns:
                    results.append(run_one(args, column, seeds[0], lr, "val"))
                    save(args.json, results)
            print(report_table(results, None, f"Selection on the validation split, seed "
                                              f"{seeds[0]}, {args.epochs:g} epoch(s), "
                                              f"GPT {args.size}"))
            best: dict = {}
            for r in results:
                f = figures(r, None)
                if f and (r["column"] not in best or f["final_loss"] < best[r["column"]][0]):
                    best[r["column"]] = (f["final_loss"], r["lr"])
            chosen = {c: {"lr": lr} for c, (_, lr) in best.items()}
            if "torch-1p" in best:
                chosen["target_loss"] = best["torch-1p"][0]
            print("\nchosen:", json.dumps(chosen))
            if args.choices:
                with open(args.choices, "w") as f:
                    json.dump(chosen, f, indent=1)
        else:
            chosen = {}
            if args.choices:
                with open(args.choices) as f:
                    chosen = json.load(f)
            target = args.target if args.target is not None else chosen.get("target_loss")
            for seed in seeds:
                for column in columns:
                    lr = chosen.get(column, {}).get("lr", 1e-3)
                    results.append(run_one(args, column, seed, lr, "test"))
                    save(args.json, results)
            print(report_table(results, target, f"Test split, seeds {args.seeds}, "
                                                f"{args.epochs:g} epoch(s), GPT {args.size}, "
                                                f"context {args.context}"))
            for line in ratio_lines(results, target):
                print(line)
    finally:
        save(args.json, results)
    print(f"\nload average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

