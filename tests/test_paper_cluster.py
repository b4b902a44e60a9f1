"""The paper's Cluster API (Table 3.5) and IWorker methods, on actors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from cluster_utils import MultiNodeCluster

import ddlf_actors as ddlf
from ddlf_actors import Cluster, read_config

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


async def calculate(self, a, b, c):
    return a + b - c


def where(self):
    return os.getpid(), self.index


async def remember(self, value):
    # A dynamic variable: it stays on this worker between calls.
    self.memory = getattr(self, "memory", []) + [value]
    return len(self.memory)


def recall(self):
    return self.memory


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def three_workers(cluster):
    c = Cluster(workers_per_node=3)
    run(c.connect())
    yield c
    run(c.close())


def test_example_3_3_shared_and_per_worker_kwargs(three_workers):
    c = three_workers
    assert len(c) == 3
    assert run(c.run_method(calculate, a=10, b=8, c=2)) == [16, 16, 16]
    assert run(c.run_method(calculate, dict(a=10, b=8, c=2), dict(a=100, b=80, c=20),
                            dict(a=1000, b=800, c=200))) == [16, 160, 1600]
    assert run(c.run_method(calculate, dict(a=10, b=8, c=2), dict(a=100, b=80, c=20))) == [16, 160]
    with pytest.raises(ValueError, match="4 argument dicts for 3 workers"):
        run(c.run_method(calculate, *[dict(a=1, b=1, c=1)] * 4))


def test_workers_are_separate_long_lived_processes(three_workers):
    first = run(three_workers.run_method(where))
    assert len({pid for pid, _ in first}) == 3
    assert [i for _, i in first] == [0, 1, 2]
    assert run(three_workers.run_method(where)) == first  # same processes, every call


def test_dynamic_variables_persist_per_worker(three_workers):
    c = three_workers
    run(c.run_method(remember, dict(value="a"), dict(value="b"), dict(value="c")))
    assert run(c.run_method(remember, value="z")) == [2, 2, 2]
    assert run(c.run_method(recall)) == [["a", "z"], ["b", "z"], ["c", "z"]]


def test_add_run_remove_method_and_run_at(three_workers):
    c = three_workers
    assert run(c.add_method(calculate)) == "calculate"
    assert run(c.run("calculate", a=1, b=2, c=3)) == [0, 0, 0]
    assert run(c.run_at(1, "calculate", a=5, b=5, c=0)) == 10
    assert run(c.run_at(c.workers[2].handle, calculate, a=2, b=2, c=1)) == 3
    assert run(c.run_at(0, where))[1] == 0
    with pytest.raises(IndexError):
        run(c.run_at(7, where))
    run(c.remove_method(calculate))
    with pytest.raises(AttributeError, match="no method 'calculate'"):
        run(c.run("calculate", a=1, b=2, c=3))


def test_run_code_and_iworker_proxy(three_workers):
    c = three_workers
    run(c.run_code("self.answer = 6 * 7"))
    assert run(c.run_method(lambda self: self.answer)) == [42, 42, 42]
    proxy = c.workers[0]
    assert run(proxy.run_method(calculate, a=3, b=3, c=3)) == 3
    assert run(proxy.add_method(recall)) == "recall"
    run(proxy.run_method(remember, value=1))
    assert run(proxy.run("recall")) == [1]
    assert run(proxy.remove_method("recall")) is True


def test_sync_wrapper_and_shutdown(cluster):
    c = Cluster(workers_per_node=2).sync()
    c.connect()
    assert c.run_method(calculate, a=1, b=1, c=1) == [1, 1]
    handles = [w.handle for w in c.workers]
    c.shutdown()
    for h in handles:
        with pytest.raises(ddlf.errors.ActorDiedError):
            ddlf.get(h.info.remote(), timeout=20)
    with pytest.raises(ddlf.errors.DDLFError, match="not connected"):
        c.run_method(calculate, a=1, b=1, c=1)


def test_one_worker_per_node_on_a_multi_node_cluster(no_leaks, tmp_path):
    mc = MultiNodeCluster(node_cpus=(1, 1))
    try:
        toml = tmp_path / "cluster.toml"
        toml.write_text(f'hosts = ["{mc.address}"]\n')
        hosts, ports = read_config(str(toml))
        os.environ["DDLF_AUTH_TOKEN"] = mc.token
        try:
            c = Cluster(hosts, ports)
            run(c.connect())
        finally:
            del os.environ["DDLF_AUTH_TOKEN"]
        try:
            assert sorted(w.node_id for w in c.workers) == sorted(n["node_id"] for n in mc.nodes)
            assert run(c.run_method(calculate, a=10, b=8, c=2)) == [16, 16]
        finally:
            run(c.close())
        assert not ddlf.is_initialized()  # the cluster closed the session it opened
    finally:
        mc.stop()


def test_read_config_rejects_bad_entries(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('hosts = ["nohostport"]\n')
    with pytest.raises(ValueError, match="not 'host:port'"):
        read_config(str(bad))


def test_paper_example_script(no_leaks):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "paper_cluster_calculate.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == [
        "Results: [16, 16, 16]", "Results: [16, 160, 1600]", "Results: [16, 160]"]
