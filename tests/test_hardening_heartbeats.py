"""Node liveness: stalls within the bound are tolerated, a node declared dead comes back,
and a cluster without live nodes says so."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from helpers_modules.clusters import start_cluster
from helpers_modules.remote_defs import Counter, square
from helpers_modules.util import wait_for, wait_gone

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError, UnschedulableError
from ddlf_actors.runtime.client.current import get_core


@pytest.fixture
def short_bound(monkeypatch):
    """A node is declared dead after 6 missed heartbeat intervals of 0.5 s (~3 s).

    The cluster's processes inherit these from the environment.
    """
    monkeypatch.setenv("DDLF_NODE_DEAD_AFTER_S", "3")
    monkeypatch.setenv("DDLF_HEARTBEAT_INTERVAL_S", "0.5")


def _head_pid() -> int:
    return get_core().cluster.procs[0].pid


def _alive_nodes() -> dict:
    return {n["node_id"]: n for n in ddlf.nodes() if n["alive"]}


def _pause(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_stalls_shorter_than_the_bound_or_of_the_head_do_not_kill_a_node(short_bound):
    with start_cluster(num_cpus=1):
        (node_id, node), = _alive_nodes().items()
        a = Counter.remote()
        assert ddlf.get(a.incr.remote(), timeout=20) == 1

        # The node itself goes quiet for two intervals: well within the bound.
        _pause(node["pid"], 1.0)
        time.sleep(1.5)
        assert [n["node_id"] for n in ddlf.nodes()] == [node_id], "a node was declared dead"

        # The head is starved (here: stopped) for longer than the bound. It must not wake
        # up and judge every node by the wall-clock time that passed meanwhile.
        _pause(_head_pid(), 4.5)
        time.sleep(1.5)
        assert [n["node_id"] for n in ddlf.nodes()] == [node_id], "a node was declared dead"
        assert ddlf.get(a.incr.remote(), timeout=20) == 2


def test_a_node_declared_dead_registers_again_as_a_new_node(short_bound):
    with start_cluster(num_cpus=1):
        (old_id, node), = _alive_nodes().items()
        a = Counter.remote()
        old_worker = ddlf.get(a.pid.remote(), timeout=20)

        os.kill(node["pid"], signal.SIGSTOP)
        try:
            assert wait_for(lambda: old_id not in _alive_nodes(), timeout=10), \
                "a stopped node was never declared dead"
        finally:
            os.kill(node["pid"], signal.SIGCONT)

        # Same daemon, new identity; its old actors stay dead and their processes go.
        assert wait_for(lambda: len(_alive_nodes()) == 1, timeout=15), ddlf.nodes()
        (new_id, renewed), = _alive_nodes().items()
        assert new_id != old_id and renewed["pid"] == node["pid"]
        with pytest.raises(ActorDiedError):
            ddlf.get(a.incr.remote(), timeout=20)
        assert not wait_gone([old_worker], timeout=10)
        assert ddlf.cluster_resources()["CPU"] == 1.0

        b = Counter.remote()
        assert ddlf.get(b.incr.remote(), timeout=20) == 1
        assert ddlf.get(square.remote(3), timeout=20) == 9


def test_no_live_nodes_is_said_plainly():
    with start_cluster(num_cpus=1):
        (node_id, node), = _alive_nodes().items()
        os.kill(node["pid"], signal.SIGKILL)
        assert wait_for(lambda: not _alive_nodes(), timeout=10)
        with pytest.raises(UnschedulableError, match="no live nodes") as info:
            ddlf.get(Counter.remote().incr.remote(), timeout=20)
        assert "num_cpus" not in str(info.value)
        with pytest.raises(UnschedulableError, match="no live nodes"):
            ddlf.get(square.remote(2), timeout=20)
        with pytest.raises(UnschedulableError, match=f"pinned to node {node_id}, which is dead"):
            ddlf.get(Counter.options(node_id=node_id).remote().incr.remote(), timeout=20)
        # Its workers and forkserver follow the dead daemon (checked by the leak guard).
        assert wait_for(lambda: not psutil.pid_exists(node["pid"])
                        or psutil.Process(node["pid"]).status() == psutil.STATUS_ZOMBIE)
