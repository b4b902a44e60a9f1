"""GPUs and memory as resources: discovery, GPU ids per task and actor, CUDA_VISIBLE_DEVICES.

No GPU here: the clusters declare theirs (ddlf.init(num_gpus=N), as ``--num-gpus N``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat

import psutil
import pytest
from helpers_modules.clusters import start_cluster
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors.errors import UnschedulableError
from ddlf_actors.runtime import cli
from ddlf_actors.runtime.errors import DDLFError
from ddlf_actors.runtime.node import GpuAllocator, detect_gpus


@pytest.fixture(autouse=True)
def no_visible_devices(monkeypatch):
    # The embedded node inherits our environment: keep a real setting out of the way.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# -- discovery and id assignment (no cluster) ---------------------------------------------------

def test_detect_gpus_from_env_nvidia_smi_or_declared(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))   # no nvidia-smi
    assert detect_gpus() == []
    assert detect_gpus(3) == [0, 1, 2]
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: Tesla (UUID: a)'\necho 'GPU 1: Tesla (UUID: b)'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert detect_gpus() == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert detect_gpus() == ["2", "3"]
    assert detect_gpus(1) == ["2"]
    with pytest.raises(DDLFError, match="lists 2 GPU"):
        detect_gpus(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == []
    with pytest.raises(DDLFError, match="whole number"):
        detect_gpus(1.5)


def test_fractions_pack_and_whole_gpus_take_unused_ones(caplog):
    gpus = GpuAllocator(range(3))
    take = gpus.take
    assert take(0) == []
    assert take(0.5) == [0] and take(0.25) == [0]   # fractions share one GPU
    assert take(1) == [1]                             # a whole one stays whole
    assert take(0.5) == [2]                           # 0.25 left on GPU 0
    assert take(0.25) == [0]                          # the fullest that fits
    assert take(1, share=False) is None   # none unused: the node waits for one
    with caplog.at_level(logging.WARNING, logger="ddlf.node"):
        assert take(1) == [2]   # and after a while shares the least used
    assert "sharing" in caplog.text
    gpus.give_back([1], 1.0)
    assert gpus.free[1] == 1.0


def test_a_gpu_demand_waits_for_a_gpu_on_its_way_back(caplog):
    # The head frees a killed actor's GPU before its process has exited on the node.
    async def main():
        gpus = GpuAllocator([0], asyncio.get_running_loop())
        assert await gpus.claim(1) == [0]
        claim = asyncio.ensure_future(gpus.claim(1))
        await asyncio.sleep(0.05)
        assert not claim.done()
        gpus.give_back([0], 1.0)
        return await asyncio.wait_for(claim, 5)

    with caplog.at_level(logging.WARNING, logger="ddlf.node"):
        assert asyncio.run(main()) == [0]
    assert "sharing" not in caplog.text


def test_gpu_and_memory_options_are_checked_at_the_call():
    @ddlf.remote
    def f():
        return 1

    with pytest.raises(ValueError, match="whole number of GPUs"):
        f.options(num_gpus=1.5)
    with pytest.raises(ValueError, match="num_gpus must be a number >= 0"):
        f.options(num_gpus=-1)
    with pytest.raises(ValueError, match="memory must be a number of bytes"):
        f.options(memory="1G")
    with pytest.raises(ValueError, match="num_gpus"):
        ddlf.init(num_gpus=0.5)
    assert not ddlf.is_initialized()


def test_ddlf_node_start_passes_gpus_and_memory_to_the_node(monkeypatch, tmp_path, session_dir):
    started = []

    class _Proc:
        pid = 0

    def fake_spawn(args, what, block, log_name, env=None):
        started.append(args)
        return _Proc(), {"node_id": "n", "address": "127.0.0.1:1"}

    monkeypatch.setattr(cli, "_spawn", fake_spawn)
    monkeypatch.setattr(cli, "_record", lambda *a: None)
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    rc = cli.main(["start", "--address", "127.0.0.1:1", "--token-file", str(token),
                   "--num-gpus", "2", "--memory", "1000"])
    assert rc == 0
    args = started[0]
    assert args[args.index("--num-gpus") + 1] == "2"
    assert args[args.index("--memory") + 1] == "1000"


# -- on a cluster --------------------------------------------------------------------------------

@ddlf.remote
def gpu_task():
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES"), ddlf.get_gpu_ids()


@ddlf.remote
class GpuActor:
    def __init__(self):
        import os

        # Set before user code: __init__ (where a framework would be imported) sees it.
        self.at_init = os.environ.get("CUDA_VISIBLE_DEVICES")

    def ids(self):
        import os

        return self.at_init, os.environ.get("CUDA_VISIBLE_DEVICES"), ddlf.get_gpu_ids()


def test_tasks_and_actors_get_gpu_ids(no_leaks):
    with start_cluster(num_cpus=4, num_gpus=2):
        assert ddlf.cluster_resources()["GPU"] == 2.0
        assert ddlf.get_gpu_ids() == []   # the driver has none, as in Ray
        assert ddlf.get(gpu_task.options(num_gpus=1).remote(), timeout=30) in (
            ("0", [0]), ("1", [1]))
        # Work that asks for no GPU is left as it is (Ray's default).
        assert ddlf.get(gpu_task.remote(), timeout=30) == (None, [])
        a, b = GpuActor.options(num_gpus=1).remote(), GpuActor.options(num_gpus=1).remote()
        got_a, got_b = ddlf.get([a.ids.remote(), b.ids.remote()], timeout=30)
        assert {got_a[0], got_b[0]} == {"0", "1"}     # distinct GPUs
        assert got_a == (got_a[0], got_a[0], [int(got_a[0])])
        # Freed when the actor dies: the next one gets that GPU.
        ddlf.kill(a)
        c = GpuActor.options(num_gpus=1).remote()
        assert ddlf.get(c.ids.remote(), timeout=30)[0] == got_a[0]
        with pytest.raises(UnschedulableError, match="GPU"):
            ddlf.get(gpu_task.options(num_gpus=3).remote(), timeout=30)


def test_fractional_gpus_share_an_id(no_leaks):
    with start_cluster(num_cpus=2, num_gpus=2):
        halves = [GpuActor.options(num_gpus=0.5).remote() for _ in range(2)]
        got = ddlf.get([h.ids.remote() for h in halves], timeout=30)
        assert got[0] == got[1] and got[0][2] in ([0], [1])
        whole = GpuActor.options(num_gpus=1).remote()
        other = ddlf.get(whole.ids.remote(), timeout=30)
        assert other[2] != got[0][2]   # the shared GPU is not handed out as a whole one


def test_memory_is_a_resource_in_bytes(no_leaks):
    with start_cluster(num_cpus=2, memory=1000):
        assert ddlf.cluster_resources()["memory"] == 1000.0
        a = GpuActor.options(memory=600).remote()
        ddlf.get(a.ids.remote(), timeout=30)
        assert ddlf.available_resources()["memory"] == 400.0
        with pytest.raises(UnschedulableError, match="memory"):
            ddlf.get(gpu_task.options(memory=2000).remote(), timeout=30)
        ddlf.kill(a)
        assert wait_for(lambda: ddlf.available_resources()["memory"] == 1000.0, timeout=10)


def test_nodes_offer_all_their_memory_by_default(cluster):
    assert ddlf.cluster_resources()["memory"] == float(psutil.virtual_memory().total)
    assert "GPU" not in ddlf.cluster_resources()   # none found here, none declared


def test_ray_get_gpu_ids(no_leaks):
    import ddlf_actors.compat.ray as ray

    ray.init(num_cpus=1, num_gpus=1)
    try:
        @ray.remote(num_gpus=1)
        def ids():
            return ray.get_gpu_ids(), os.environ["CUDA_VISIBLE_DEVICES"]

        assert ray.get(ids.remote(), timeout=30) == ([0], "0")
        assert ray.get_gpu_ids() == []
    finally:
        ray.shutdown()
