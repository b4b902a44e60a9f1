"""The ``torch-ddp`` column of ``torch_compare.py``: ``DistributedDataParallel`` over gloo,
two processes of one thread under ``torchrun`` (``--standalone`` on one host, or one
torchrun per emulated host with ``--link``). Each rank runs ``torch_compare.py --ddp-rank``
(``script`` below), which calls :func:`run_ddp_rank`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta

from benchmarks.emulation.link_hosts import LinkMeter, torchrun_node_cmd
from benchmarks.peers.torch_common import (
    BATCH,
    Timeline,
    build,
    child_flags,
    eval_marks,
    evaluate,
    load_split,
    order,
    parse_child,
    relay_epochs,
    sgd,
    start_in,
    wait_all,
)


def run_ddp_rank(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    TorchAdapter.configure_threads(1)
    t0 = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, xe, ye = load_split(args.split, args.limit, args.eval_limit)
    model = build(args.seed)
    ddp = DDP(model)   # broadcasts rank 0's weights (the same seed built the same anyway)
    opt = sgd(ddp.parameters(), args.lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    steps = len(x) // (BATCH * world)
    marks = eval_marks(steps, args.evals_per_epoch)
    meter = LinkMeter()   # --link: this host's interface (nothing otherwise)
    dist.barrier()
    ready_s = time.perf_counter() - t0
    meter.start()
    tl = Timeline()
    for epoch in range(args.epochs):
        idx = torch.from_numpy(order(args.seed, epoch, len(x)))
        ddp.train()
        for step in range(1, steps + 1):
            g = (step - 1) * BATCH * world + rank * BATCH   # rank's half of global batch
            b = idx[g:g + BATCH]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(xt[b]), yt[b]).backward()   # the all-reduce is in here
            opt.step()
            if step in marks:
                tl.pause()
                dist.barrier()
                if rank == 0:
                    e0 = time.perf_counter()
                    loss, acc = evaluate(model, xe, ye, threads=args.eval_threads)
                    tl.record(epoch + step / steps, loss, acc, time.perf_counter() - e0)
                dist.barrier()
                ddp.train()
                tl.resume()
    meter.stop()
    if rank == 0:   # one all-reduce of the gradients per step (one bucket: 2 MB < 25 MB)
        print(json.dumps({"startup_s": ready_s, "train_s": tl.train_s, "timeline": tl.rows,
                          "link": meter.record(args.epochs * steps, args.epochs * steps)}),
              flush=True)
    dist.destroy_process_group()


def run_ddp(args, script: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", script, "--ddp-rank", *child_flags(args)]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=args.timeout)
    return parse_child(proc, "torchrun")


def linked_ddp(args, hosts, script: str) -> dict:
    """torchrun on each host (``--nnodes 2 --node-rank i``, one process of one thread),
    the static rendezvous on host A's agent's TCP store, gloo over the veths."""
    rank_cmd = [script, "--ddp-rank", *child_flags(args)]
    started = [start_in(hosts, i, torchrun_node_cmd(i, hosts.ips[0], rank_cmd))
               for i in (0, 1)]
    outs = wait_all([p for p, _ in started], [f for _, f in started], args.timeout,
                    ["torchrun on host A", "torchrun on host B"])
    relay_epochs(outs[0].stderr)
    return parse_child(outs[0], "torchrun on host A", other=outs[1])
