"""Same-host objects through shared memory (runtime/shm_store.py).

Each test gets a private shared-memory root under /dev/shm (``DDLF_SHM_ROOT``), so what
it finds there is exactly what its own processes created.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import psutil
import pytest
from cluster_utils import MultiNodeCluster
from helpers_modules.clusters import no_leaked_processes, start_cluster

import ddlf_actors as ddlf
from ddlf_actors.runtime import config, shm_store

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")

MB = 1 << 20


def _chain(x) -> list[str]:
    """Type names along ``x.base`` / ``memoryview.obj``: where an array's memory comes from."""
    out = []
    while x is not None and len(out) < 20:
        out.append(type(x).__name__)
        x = x.obj if isinstance(x, memoryview) else getattr(x, "base", None)
    return out


@ddlf.remote(num_cpus=0)
class Holder:
    def __init__(self):
        self.kept = None

    def inspect(self, arr):
        return {"writeable": arr.flags.writeable, "chain": _chain(arr),
                "sum": float(arr.sum()), "pid": os.getpid()}

    def keep(self, arr):
        self.kept = arr
        return float(arr.sum())

    def kept_sum(self):
        return float(self.kept.sum())

    def drop(self):
        self.kept = None

    def make(self, n, value):
        return np.full(n, value, dtype=np.float64)

    def pid(self):
        return os.getpid()


@ddlf.remote
def make_task(n, value):
    return np.full(n, value, dtype=np.float64)


@pytest.fixture
def shm_env(monkeypatch):
    """A private shared-memory root, fast pool expiry and sweeps, for this process and the
    cluster it starts (children read the environment at start-up)."""
    root = tempfile.mkdtemp(prefix="ddlf-test-", dir="/dev/shm")
    settings = {"DDLF_SHM_ROOT": root, "DDLF_SHM_POOL_IDLE_S": "0.3",
                "DDLF_SHM_SWEEP_INTERVAL_S": "0.3"}
    for k, v in settings.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(config, "SHM_ROOT", root)
    monkeypatch.setattr(config, "SHM_POOL_IDLE_S", 0.3)
    shm_store.reset()
    try:
        yield root
    finally:
        shm_store.release_all()
        shm_store.reset()
        shutil.rmtree(root, ignore_errors=True)


def _files(root) -> list[str]:
    out = []
    for d in os.listdir(root):
        out += os.listdir(os.path.join(root, d))
    return out


def _owned_by(root, pid) -> list[str]:
    return [f for f in _files(root) if f.split("-")[0] == str(pid)]


def _owners(root) -> str:
    """Each segment left in ``root`` and whether the process its name holds is alive: what
    a failed sweep test needs to say (the sweep removes only the dead's)."""
    out = []
    for f in _files(root):
        pid = int(f.split("-")[0])
        try:
            p = psutil.Process(pid)
            who = f"pid {pid} {p.status()} ({' '.join(p.cmdline()[:4])})"
        except psutil.Error:
            who = f"pid {pid} gone"
        out.append(f"{f}: {who}")
    return "; ".join(out) or "none"


def _wait_for(cond, timeout=15.0, what="condition", detail=None):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}"
                        + (f"; {detail()}" if detail else ""))
        time.sleep(0.1)


@pytest.fixture
def shm_cluster(shm_env):
    with start_cluster(num_cpus=2):
        yield shm_env


# -- zero copy, both directions -------------------------------------------------------------------
def test_put_to_actor_is_zero_copy_read_only_mapping(shm_cluster):
    arr = np.arange(2 * MB, dtype=np.float64)          # 16 MB
    ref = ddlf.put(arr)
    assert len(_owned_by(shm_cluster, os.getpid())) == 1, "put did not write a segment"
    a = Holder.remote()
    info = ddlf.get(a.inspect.remote(ref), timeout=30)
    assert info["sum"] == float(arr.sum())
    assert info["writeable"] is False
    assert info["chain"][-1] == "mmap", info["chain"]   # a view of the mapped segment, no copy
    # put() still snapshots: changing the caller's array afterwards changes nothing.
    arr[:] = 0
    assert ddlf.get(a.inspect.remote(ref), timeout=30)["sum"] == float(np.arange(2 * MB).sum())


def test_actor_and_task_results_to_driver_through_shared_memory(shm_cluster):
    a = Holder.remote()
    out = ddlf.get(a.make.remote(2 * MB, 3.0), timeout=30)
    assert out.shape == (2 * MB,) and float(out.sum()) == 3.0 * 2 * MB
    assert not out.flags.writeable and _chain(out)[-1] == "mmap"
    worker = ddlf.get(a.pid.remote(), timeout=30)
    assert _owned_by(shm_cluster, worker), "the actor's result did not go through a segment"
    t = ddlf.get(make_task.remote(2 * MB, 5.0), timeout=30)
    assert float(t.sum()) == 5.0 * 2 * MB and _chain(t)[-1] == "mmap"


def test_result_ref_passed_on_to_another_actor_stays_zero_copy(shm_cluster):
    a, b = Holder.remote(), Holder.remote()
    ref = a.make.remote(2 * MB, 2.0)        # never fetched by the driver
    info = ddlf.get(b.inspect.remote(ref), timeout=30)
    assert info["sum"] == 2.0 * 2 * MB and info["chain"][-1] == "mmap"


def test_small_objects_stay_in_process(shm_cluster):
    small = np.ones(MB // 8 // 2, dtype=np.float64)     # 512 KB, under SHM_MIN_BYTES
    ref = ddlf.put(small)
    assert _files(shm_cluster) == []
    info = ddlf.get(Holder.remote().inspect.remote(ref), timeout=30)
    assert "mmap" not in info["chain"] and info["sum"] == float(small.sum())


# -- lifetime -----------------------------------------------------------------------------------
def test_segment_freed_after_last_ref_drops(shm_cluster):
    me = os.getpid()
    a = Holder.remote()
    ref = ddlf.put(np.ones(2 * MB))
    assert ddlf.get(a.inspect.remote(ref), timeout=30)["sum"] == 2 * MB
    assert len(_owned_by(shm_cluster, me)) == 1
    del ref
    _wait_for(lambda: not _owned_by(shm_cluster, me), what="the put's segment to be unlinked")
    # A result: the worker's segment goes once the driver has dropped the value.
    out = ddlf.get(a.make.remote(2 * MB, 1.0), timeout=30)
    worker = ddlf.get(a.pid.remote(), timeout=30)
    assert _owned_by(shm_cluster, worker)
    time.sleep(1.5)   # past the pool expiry: a value still in use keeps its segment
    assert _owned_by(shm_cluster, worker)
    assert float(out.sum()) == 2 * MB
    del out
    _wait_for(lambda: not _owned_by(shm_cluster, worker), what="the result's segment to be unlinked")


def test_segment_a_receiver_still_holds_is_never_reused(shm_cluster):
    a = Holder.remote()
    ref = ddlf.put(np.full(2 * MB, 1.0))
    assert ddlf.get(a.keep.remote(ref), timeout=30) == 2 * MB
    del ref                                   # the owner is done; the actor is not
    for value in (2.0, 3.0, 4.0):             # new puts of the same size
        r = ddlf.put(np.full(2 * MB, value))
        assert ddlf.get(a.inspect.remote(r), timeout=30)["sum"] == value * 2 * MB
        del r
    assert ddlf.get(a.kept_sum.remote(), timeout=30) == 2 * MB   # unchanged
    # Once the actor lets go, the block becomes reusable (the pool stays bounded).
    ddlf.get(a.drop.remote(), timeout=30)
    _wait_for(lambda: len(_owned_by(shm_cluster, os.getpid())) == 0, what="idle segments to expire")


def test_values_stay_valid_after_their_segment_is_unlinked(shm_cluster):
    a = Holder.remote()
    out = ddlf.get(a.make.remote(2 * MB, 7.0), timeout=30)
    ddlf.kill(a)                                  # its segments are swept
    worker_files = lambda: [f for f in _files(shm_cluster) if f.split("-")[0] != str(os.getpid())]  # noqa: E731
    _wait_for(lambda: not worker_files(), what="the dead actor's segments to be swept")
    assert float(out.sum()) == 7.0 * 2 * MB       # POSIX: the mapping outlives the name


# -- a driver killed with SIGKILL leaves nothing behind ------------------------------------------
_CHILD = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import ddlf_actors as ddlf
    from ddlf_actors.runtime.client.current import get_core

    ddlf.init(num_cpus=1)

    @ddlf.remote(num_cpus=0)
    class Keeper:
        def keep(self, arr):
            self.arr = arr
            return os.getpid()
        def make(self):
            return np.ones(1 << 21)

    k = Keeper.remote()
    ref = ddlf.put(np.ones(1 << 21))
    worker = ddlf.get(k.keep.remote(ref))
    out = ddlf.get(k.make.remote())
    cluster = [p.pid for p in get_core().cluster.procs]
    print("READY " + json.dumps({"worker": worker, "cluster": cluster}), flush=True)
    time.sleep(600)
""")


def test_sigkilled_driver_leaves_no_segments(shm_env):
    import json

    with no_leaked_processes():
        child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
        cluster = []
        try:
            line = ""
            deadline = time.monotonic() + 60
            while not line.startswith("READY") and time.monotonic() < deadline:
                line = child.stdout.readline()
                if not line and child.poll() is not None:
                    break
            assert line.startswith("READY"), f"the child driver did not start: {line!r}"
            info = json.loads(line.split(" ", 1)[1])
            cluster = info["cluster"]
            assert _owned_by(shm_env, child.pid), "the child's put is not in shared memory"
            assert _owned_by(shm_env, info["worker"]), "the actor's result is not in shared memory"
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            # The child's node daemon sees its lifeline close, kills its workers and sweeps
            # (at once: the killed driver may still be an unreaped zombie then, which the
            # sweep counts as gone; see the test below).
            _wait_for(lambda: not _files(shm_env), timeout=30, what="the killed driver's segments to go",
                      detail=lambda: f"left: {_owners(shm_env)}; cluster {cluster}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            # The child's head and node were its children: see them exit, or end them (by pid).
            deadline = time.monotonic() + 15
            for pid in cluster:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
                    try:
                        p.wait(max(0.1, deadline - time.monotonic()))
                    except psutil.TimeoutExpired:
                        p.kill()
                        pytest.fail(f"the killed driver's cluster process {pid} did not exit")


# -- two hosts: the TCP path stays -----------------------------------------------------------------
@pytest.fixture
def two_hosts(shm_env, no_leaks, monkeypatch):
    """Two nodes on this machine, the second configured as another host."""
    c = MultiNodeCluster(node_cpus=(), node_resources=[])
    try:
        c.add_node(1, {"here": 1})
        monkeypatch.setenv("DDLF_SHM_HOST_ID", "another-host")
        c.add_node(1, {"there": 1})
        monkeypatch.delenv("DDLF_SHM_HOST_ID")
        ddlf.init(address=c.address, token=c.token)
        yield shm_env
    finally:
        ddlf.shutdown()
        c.stop()


def test_cross_host_objects_keep_the_tcp_path(two_hosts):
    here = Holder.options(resources={"here": 1}).remote()
    there = Holder.options(resources={"there": 1}).remote()
    arr = np.arange(2 * MB, dtype=np.float64)
    ref = ddlf.put(arr)
    near = ddlf.get(here.inspect.remote(ref), timeout=60)
    far = ddlf.get(there.inspect.remote(ref), timeout=60)
    assert near["sum"] == far["sum"] == float(arr.sum())
    assert near["chain"][-1] == "mmap"
    assert "mmap" not in far["chain"]
    out = ddlf.get(there.make.remote(2 * MB, 2.0), timeout=60)
    assert float(out.sum()) == 4.0 * MB and "mmap" not in _chain(out)
    assert not _owned_by(two_hosts, ddlf.get(there.pid.remote(), timeout=60))
    out = ddlf.get(here.make.remote(2 * MB, 2.0), timeout=60)
    assert float(out.sum()) == 4.0 * MB and _chain(out)[-1] == "mmap"


# -- the bound --------------------------------------------------------------------------------------
def test_past_the_capacity_objects_fall_back_to_tcp(shm_env, monkeypatch):
    monkeypatch.setenv("DDLF_SHM_CAPACITY", str(8 * MB))
    monkeypatch.setattr(config, "SHM_CAPACITY", 8 * MB)
    with start_cluster(num_cpus=2):
        a = Holder.remote()
        fits = ddlf.put(np.ones(MB // 4))                 # 2 MB: within the bound
        assert ddlf.get(a.inspect.remote(fits), timeout=30)["chain"][-1] == "mmap"
        big = np.arange(2 * MB, dtype=np.float64)         # 16 MB: past it
        ref = ddlf.put(big)
        assert len(_files(shm_env)) == 1                  # only the 2 MB segment
        info = ddlf.get(a.inspect.remote(ref), timeout=30)
        assert info["sum"] == float(big.sum()) and "mmap" not in info["chain"]
        out = ddlf.get(a.make.remote(2 * MB, 1.0), timeout=30)   # a result past it too
        assert float(out.sum()) == 2 * MB and "mmap" not in _chain(out)
        assert not ddlf.get(ref, timeout=30).flags.writeable      # put still snapshots read-only


# -- the sweep: a creator that has exited but is not yet reaped ---------------------------------
def test_sweep_unlinks_the_segments_of_an_exited_unreaped_creator(shm_env):
    """A SIGKILLed driver is a zombie until its parent reaps it. Its node daemon sees the
    lifeline close and sweeps at once, often before that: a zombie still has its pid and
    start time, so the sweep must not count it as running (it used to keep its segments,
    and with the node gone nobody swept them again)."""
    store = shm_store._Store(shm_env)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        _wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE,
                  what="the child to exit (it stays unreaped)")
        start = shm_store._start_time(zombie.pid)
        dead = os.path.join(store.dir, f"{zombie.pid}-{start}-1-abcdef")
        mine = os.path.join(store.dir, f"{store.tag}-1-abcdef")   # a running creator's
        for path in (dead, mine):
            with open(path, "wb") as f:
                f.write(b"x")
        assert shm_store.sweep(store) == 1
        assert not os.path.exists(dead), "the exited creator's segment was kept"
        assert os.path.exists(mine), "a running creator's segment was unlinked"
        os.unlink(mine)
    finally:
        zombie.wait()
