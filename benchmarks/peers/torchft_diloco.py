"""The ``torchft-diloco`` column of ``torch_compare.py``: torchft's ``DiLoCo``, two replicas
of one thread and a lighthouse (on one host, or across the two emulated hosts with
``--link``). Each replica runs ``torch_compare.py --diloco-replica R`` (``script``
below), which calls :func:`run_diloco_replica`; ``--lighthouse-server`` calls
:func:`serve_lighthouse`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

from benchmarks.emulation.link_hosts import LinkMeter
from benchmarks.peers.torch_common import (
    BATCH,
    Timeline,
    build,
    child_flags,
    evaluate,
    load_split,
    log,
    order,
    parse_child,
    relay_epochs,
    sgd,
    start_in,
    start_to_files,
    wait_all,
)


def store_barrier(store, name: str, world: int) -> None:
    if store.add(name, 1) == world:
        store.set(name + "/go", "1")
    store.wait([name + "/go"], timedelta(seconds=600))


def run_diloco_replica(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    TorchAdapter.configure_threads(1)
    t0 = time.perf_counter()
    rank, world = args.diloco_replica, 2
    x, y, xe, ye = load_split(args.split, args.limit, args.eval_limit)
    model = build(args.seed)
    inner = sgd(model.parameters(), args.lr)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    # --link: this replica's host address (its store and manager are reached from the
    # other host) and host A's for the barrier store; else all on the loopback.
    host = args.host_ip or "localhost"
    own_store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    shared = dist.TCPStore(args.barrier_addr or "localhost", args.barrier_port,
                           is_master=False, timeout=timedelta(seconds=600))
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=120)), min_replica_size=2,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                    inner.load_state_dict(sd["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        replica_id=str(rank), store_addr=host, store_port=own_store.port, rank=0,
        world_size=1, lighthouse_addr=args.lighthouse, hostname=host,
        # Both replicas build the same initial weights from the seed, so no step-0 sync
        # (torchft's advice for that case). It would also fail across --link's hosts: a
        # healing replica fetches the weights from http://<hostname>:port, and the
        # namespaces share one hostname, which each resolves to its own loopback.
        init_sync=False,
        use_async_quorum=False, timeout=timedelta(seconds=120),
        quorum_timeout=timedelta(seconds=120), connect_timeout=timedelta(seconds=60))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    steps = len(x) // (BATCH * world)
    quarter = steps / args.evals_per_epoch
    meter = LinkMeter()
    store_barrier(shared, "ready", world)
    ready_s = time.perf_counter() - t0
    meter.start()
    tl = Timeline()
    n_evals, due = 0, quarter
    done = 0   # inner steps over all epochs
    try:
        with DiLoCo(manager, [model], inner, outer, sync_every=args.sync_every,
                    pin_memory=False):
            for epoch, step in diloco_steps(args.epochs, steps, args.sync_every):
                if step == 1:
                    idx = torch.from_numpy(order(args.seed, epoch, len(x)))
                    model.train()
                g = (step - 1) * BATCH * world + rank * BATCH
                b = idx[g:g + BATCH]
                inner.zero_grad(set_to_none=True)
                F.cross_entropy(model(xt[b]), yt[b]).backward()
                inner.step()   # every sync_every-th step also syncs (a post hook)
                done += 1
                # The global model exists right after a sync: evaluate it at the first
                # sync past each quarter epoch (both replicas decide alike, from counts).
                if done % args.sync_every or done < due:
                    continue
                while due <= done:
                    due += quarter
                n_evals += 1
                tl.pause()
                # Each replica's weights' CRC: right after a sync both hold the global model.
                shared.set(f"eval{n_evals}/crc{rank}", str(weights_crc(model)))
                store_barrier(shared, f"eval{n_evals}a", world)
                if rank == 0:
                    e0 = time.perf_counter()
                    loss, acc = evaluate(model, xe, ye, threads=args.eval_threads)
                    tl.record(done / steps, loss, acc, time.perf_counter() - e0)
                    crcs = {shared.get(f"eval{n_evals}/crc{r}") for r in range(world)}
                    tl.rows[-1]["replicas_equal"] = len(crcs) == 1
                store_barrier(shared, f"eval{n_evals}b", world)
                model.train()
                tl.resume()
    finally:
        manager.shutdown(wait=False)
    meter.stop()
    if rank == 0:
        print(json.dumps({"startup_s": ready_s, "train_s": tl.train_s, "timeline": tl.rows,
                          "link": meter.record(done, done // args.sync_every)}), flush=True)


def weights_crc(model) -> int:
    import zlib

    crc = 0
    for t in model.state_dict().values():
        crc = zlib.crc32(t.detach().numpy().tobytes(), crc)
    return crc


def diloco_steps(epochs: int, steps: int, sync_every: int):
    """``(epoch, step)`` for ``epochs`` epochs of ``steps``, then on into the next epoch's
    order up to the next sync: the last evaluation is of a global model, at the first
    sync at or after the last epoch's end (its row says at which epoch)."""
    done = 0
    for epoch in range(epochs + 1 + sync_every // max(1, steps)):
        for step in range(1, steps + 1):
            if done >= epochs * steps and done % sync_every == 0:
                return
            yield epoch, step
            done += 1


def run_diloco(args, script: str) -> dict:
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
            cmd = [sys.executable, script, "--diloco-replica", str(r),
                   "--lighthouse", lighthouse.address(), "--barrier-port", str(barrier.port),
                   *child_flags(args)]
            # Output to files, not pipes: torchft logs ~1.3 KB to stderr a sync, and while
            # this waited on replica 0, replica 1's undrained pipe filled at 64 KiB (about
            # 48 syncs: the 50,000-image split) and blocked it mid-quorum, replica 0 with it.
            proc, pair = start_to_files(subprocess.Popen, cmd, env=env)
            procs.append(proc)
            files.append(pair)
        outs = wait_all(procs, files, args.timeout, ["replica 0", "replica 1"])
        relay_epochs(outs[0].stderr)   # to this child's stderr, which run_column relays
        return parse_child(outs[0], "replica 0", other=outs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for out, err in files:
            out.close()
            err.close()
        lighthouse.shutdown()


def serve_lighthouse(args, world: int = 2) -> None:
    """``--link``'s torchft-diloco: the lighthouse (a quorum of ``world`` replicas) and the
    barrier store in host A; prints their ports (one JSON line) and serves until stdin
    closes (the parent ends the run)."""
    import torch.distributed as dist
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=world)
    barrier = dist.TCPStore(args.host_ip, 0, world_size=world + 1, is_master=True,
                            wait_for_workers=False)
    # address() names this machine's hostname, which the other namespace resolves to its
    # own loopback: the parent advertises host A's address with this port instead.
    port = int(lighthouse.address().rstrip("/").rsplit(":", 1)[1])
    print(json.dumps({"lighthouse_port": port, "barrier_port": barrier.port}), flush=True)
    try:
        sys.stdin.read()
    finally:
        lighthouse.shutdown()


def linked_diloco(args, hosts, script: str, replica_hosts=(0, 1),
                  flags: list | None = None) -> dict:
    """A lighthouse and the barrier store in host A (host 0), replica r in host
    ``replica_hosts[r]`` (by default replica 0 in A, replica 1 in B); the replicas' stores,
    managers and gloo groups on their hosts' addresses. ``script`` takes
    ``--lighthouse-server``, ``--diloco-replica R`` and, for more than two replicas,
    ``--diloco-world K``; each replica also gets ``flags`` (default: this module's
    ``child_flags(args)``)."""
    import select

    try:
        import torchft  # noqa: F401
    except ImportError as e:
        return {"unavailable": f"torchft is not installed ({e}); pip install torchft"}
    me = script
    world = len(replica_hosts)
    sized = [] if world == 2 else ["--diloco-world", str(world)]
    # The lighthouse logs every quorum (several lines a sync, thousands a run): to a file,
    # shown only if it fails to start.
    lh_err = tempfile.TemporaryFile()
    lh = hosts.popen(0, [sys.executable, me, "--lighthouse-server", "--host-ip",
                         hosts.ips[0], *sized], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=lh_err)
    ready, _, _ = select.select([lh.stdout], [], [], 120)
    line = lh.stdout.readline().decode() if ready else ""
    if not line.startswith("{"):
        lh_err.seek(0)
        tail = lh_err.read().decode(errors="replace").strip().splitlines()[-15:]
        log("the lighthouse's last lines:\n" + "\n".join("    " + ln for ln in tail))
        return {"error": f"the lighthouse did not start in host A (exit {lh.poll()})"}
    ports = json.loads(line)
    started = [start_in(hosts, h, [
        sys.executable, me, "--diloco-replica", str(r), *sized, "--lighthouse",
        f"http://{hosts.ips[0]}:{ports['lighthouse_port']}", "--barrier-addr", hosts.ips[0],
        "--barrier-port", str(ports["barrier_port"]), "--host-ip", hosts.ips[h],
        *(child_flags(args) if flags is None else flags)])
        for r, h in enumerate(replica_hosts)]
    outs = wait_all([p for p, _ in started], [f for _, f in started], args.timeout,
                    [f"replica {r} (host {h})" for r, h in enumerate(replica_hosts)])
    relay_epochs(outs[0].stderr)
    failed = [o for o in outs[1:] if o.returncode != 0]
    return parse_child(outs[0], f"replica 0 (host {replica_hosts[0]})",
                       other=(failed or outs[1:])[0])
