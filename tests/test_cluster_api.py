"""init / shutdown / second drivers, options, named actors, cluster resource views."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from helpers_modules.remote_defs import Accumulator, Counter, square
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError, DDLFError


@ddlf.remote(num_cpus=1)
class OneCpu:
    def ping(self):
        return "pong"


@ddlf.remote(num_cpus=0, resources={"custom": 1}, max_restarts=1, max_concurrency=2,
             name="decorated-with-everything")
class FullyOptioned:
    def ping(self):
        return "pong"


@ddlf.remote
def add(a, b):
    return a + b


@ddlf.remote(num_cpus=2, max_retries=0)
def two_cpu_task(x):
    return x + 1


def _name_is_free(name) -> bool:
    try:
        ddlf.get_actor(name)
    except ValueError:
        return True
    return False


def _cpu(d):
    return d.get("CPU", 0.0)


# -- init / shutdown ----------------------------------------------------------------------------

def test_init_returns_host_port_address(cluster):
    assert ddlf.is_initialized()
    m = re.fullmatch(r"([0-9.]+|[\w.-]+):(\d+)", cluster.address)
    assert m, cluster.address
    assert m.group(1) == "127.0.0.1"
    assert 0 < int(m.group(2)) < 65536
    assert isinstance(cluster.token, str) and cluster.token


def test_second_init_without_shutdown_raises(cluster):
    with pytest.raises(DDLFError):
        ddlf.init(num_cpus=1)
    with pytest.raises(DDLFError):
        ddlf.init(address=cluster.address, token=cluster.token)
    # The failed init left the first session usable.
    assert ddlf.is_initialized()
    assert ddlf.get(add.remote(2, 3), timeout=20) == 5


def test_shutdown_then_init_again(no_leaks):
    assert not ddlf.is_initialized()
    first = ddlf.init(num_cpus=2)
    try:
        assert ddlf.is_initialized()
        c = Counter.remote()
        assert ddlf.get(c.incr.remote(), timeout=20) == 1
    finally:
        ddlf.shutdown()
    assert not ddlf.is_initialized()
    ddlf.shutdown()  # a second shutdown is a no-op
    second = ddlf.init(num_cpus=2)
    try:
        assert ddlf.is_initialized()
        assert second.address != first.address or second.token != first.token
        c = Counter.remote(10)
        assert ddlf.get(c.incr.remote(), timeout=20) == 11
        assert ddlf.get(add.remote(1, 2), timeout=20) == 3
    finally:
        ddlf.shutdown()
    assert not ddlf.is_initialized()


def test_api_before_init_raises_when_auto_init_is_off(no_leaks, monkeypatch):
    # By default the first call starts a cluster (tests/test_auto_init.py); with
    # DDLF_AUTO_INIT=0 it must fail instead.
    monkeypatch.setenv("DDLF_AUTO_INIT", "0")
    assert not ddlf.is_initialized()
    with pytest.raises(DDLFError):
        Counter.remote()
    with pytest.raises(DDLFError):
        add.remote(1, 2)
    with pytest.raises(DDLFError):
        ddlf.put(1)


def test_second_driver_joins_and_calls_named_actor(cluster):
    shared = Counter.options(name="shared-counter").remote(100)
    assert ddlf.get(shared.incr.remote(), timeout=20) == 101
    script = textwrap.dedent("""
        import os, sys
        import ddlf_actors as ddlf
        info = ddlf.init(address=sys.argv[1], token=os.environ["TEST_DDLF_TOKEN"])
        h = ddlf.get_actor("shared-counter")
        print("RESULT", ddlf.get(h.incr.remote(10), timeout=20), flush=True)
        ddlf.shutdown()
    """)
    env = dict(os.environ, TEST_DDLF_TOKEN=cluster.token)
    out = subprocess.run([sys.executable, "-c", script, cluster.address], capture_output=True,
                         text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr
    assert "RESULT 111" in out.stdout, (out.stdout, out.stderr)
    # The second driver reached the very same actor (its state moved), and leaving did not kill it.
    assert ddlf.get(shared.read.remote(), timeout=20) == 111
    assert ddlf.get(shared.incr.remote(), timeout=20) == 112


# -- remote() and options --------------------------------------------------------------------------

def test_remote_bare_and_with_options_return_handles_and_refs(cluster):
    c = Counter.remote()
    assert isinstance(c, ddlf.ActorHandle)
    ref = c.incr.remote()
    assert isinstance(ref, ddlf.ObjectRef)
    assert ddlf.get(ref, timeout=20) == 1
    t = add.remote(1, 2)
    assert isinstance(t, ddlf.ObjectRef)
    assert ddlf.get(t, timeout=20) == 3
    # (the 2-CPU task first: while a 1-CPU actor lives it could not be placed)
    assert ddlf.get(two_cpu_task.remote(41), timeout=20) == 42
    one = OneCpu.remote()
    assert isinstance(one, ddlf.ActorHandle)
    assert ddlf.get(one.ping.remote(), timeout=20) == "pong"


def test_options_on_class_and_function(cluster):
    assert ddlf.get(add.options(num_cpus=2).remote(20, 22), timeout=20) == 42
    c = Counter.options(num_cpus=1, max_concurrency=1, max_restarts=0).remote(5)
    assert isinstance(c, ddlf.ActorHandle)
    assert ddlf.get(c.incr.remote(2), timeout=20) == 7
    assert ddlf.get(add.options(num_cpus=0.5, max_retries=1).remote("a", "b"), timeout=20) == "ab"


def test_options_num_cpus_reserves_resources(cluster):
    big = Counter.options(num_cpus=2).remote()
    ddlf.get(big.incr.remote(), timeout=20)
    assert wait_for(lambda: _cpu(ddlf.available_resources()) == 0.0, timeout=10), \
        ddlf.available_resources()
    ddlf.kill(big)
    assert wait_for(lambda: _cpu(ddlf.available_resources()) == 2.0, timeout=10), \
        ddlf.available_resources()


def test_all_options_in_decorator_with_custom_resource(no_leaks):
    ddlf.init(num_cpus=2, resources={"custom": 2})
    try:
        assert _without_memory(ddlf.cluster_resources()) == {"CPU": 2.0, "custom": 2.0}
        a = FullyOptioned.remote()
        assert ddlf.get(a.ping.remote(), timeout=20) == "pong"
        assert ddlf.get_actor("decorated-with-everything") == a
        assert wait_for(lambda: ddlf.available_resources().get("custom") == 1.0, timeout=10), \
            ddlf.available_resources()
        b = Counter.options(resources={"custom": 1}).remote()
        assert ddlf.get(b.incr.remote(), timeout=20) == 1
        assert wait_for(lambda: ddlf.available_resources().get("custom") == 0.0, timeout=10), \
            ddlf.available_resources()
        ddlf.kill(b)
        assert wait_for(lambda: ddlf.available_resources().get("custom") == 1.0, timeout=10), \
            ddlf.available_resources()
    finally:
        ddlf.shutdown()


@pytest.mark.parametrize("bad", [{"bogus": 1}, {"num_tpus": 1}, {"max_retries": 1}])
def test_unknown_actor_option_raises_value_error(bad):
    class Plain:
        pass

    with pytest.raises(ValueError):
        ddlf.remote(**bad)(Plain)
    with pytest.raises(ValueError):
        Counter.options(**bad)


@pytest.mark.parametrize("bad", [{"bogus": 1}, {"max_restarts": 1}, {"max_concurrency": 2}])
def test_unknown_task_option_raises_value_error(bad):
    def plain():
        return 1

    with pytest.raises(ValueError):
        ddlf.remote(**bad)(plain)
    with pytest.raises(ValueError):
        add.options(**bad)


def test_direct_calls_raise_type_error_mentioning_remote(cluster):
    with pytest.raises(TypeError, match=r"\.remote\("):
        Counter()
    c = Counter.remote()
    with pytest.raises(TypeError, match=r"\.remote\("):
        c.incr()
    with pytest.raises(TypeError, match=r"\.remote\("):
        add(1, 2)
    # Nothing of the above reached the actor.
    assert ddlf.get(c.read.remote(), timeout=20) == 0


def test_direct_calls_raise_type_error_before_init():
    with pytest.raises(TypeError, match=r"\.remote\("):
        Counter(1)
    with pytest.raises(TypeError, match=r"\.remote\("):
        square(3)


def test_class_and_function_from_helper_module(cluster):
    acc = Accumulator.remote(10)
    assert ddlf.get([acc.add.remote(1), acc.add.remote(2)], timeout=20) == [11, 13]
    assert ddlf.get([square.remote(i) for i in range(5)], timeout=20) == [0, 1, 4, 9, 16]


# -- named actors -----------------------------------------------------------------------------------

def test_get_actor_finds_named_actor(cluster):
    c = Counter.options(name="finder").remote(7)
    assert ddlf.get(c.read.remote(), timeout=20) == 7  # the actor is up
    h = ddlf.get_actor("finder")
    assert isinstance(h, ddlf.ActorHandle)
    assert h == c
    assert ddlf.get(h.incr.remote(), timeout=20) == 8
    assert ddlf.get(c.read.remote(), timeout=20) == 8


def test_get_actor_right_after_creation(cluster):
    # As in Ray, the name belongs to the actor once .remote() has returned.
    c = Counter.options(name="finder-now").remote(7)
    h = ddlf.get_actor("finder-now")
    assert isinstance(h, ddlf.ActorHandle)
    assert h == c
    assert ddlf.get(h.incr.remote(), timeout=20) == 8
    assert ddlf.get(c.read.remote(), timeout=20) == 8


def test_get_actor_unknown_name_raises_value_error(cluster):
    with pytest.raises(ValueError):
        ddlf.get_actor("no-such-actor-anywhere")


def test_duplicate_name_raises(cluster):
    first = Counter.options(name="dup").remote(1)
    assert ddlf.get(first.read.remote(), timeout=20) == 1
    with pytest.raises((ValueError, DDLFError), match="dup"):
        second = Counter.options(name="dup").remote(2)
        # Creation is asynchronous: if .remote() did not raise, the first call must.
        ddlf.get(second.read.remote(), timeout=20)
    # The original keeps its name and state.
    assert ddlf.get_actor("dup") == first
    assert ddlf.get(ddlf.get_actor("dup").read.remote(), timeout=20) == 1


def test_name_is_free_again_after_kill(cluster):
    a = Counter.options(name="reusable").remote(1)
    assert ddlf.get(a.read.remote(), timeout=20) == 1
    ddlf.kill(a)
    with pytest.raises(ActorDiedError):
        ddlf.get(a.read.remote(), timeout=20)

    assert wait_for(lambda: _name_is_free("reusable"), timeout=10)
    b = Counter.options(name="reusable").remote(2)
    assert ddlf.get(ddlf.get_actor("reusable").read.remote(), timeout=20) == 2
    assert ddlf.get_actor("reusable") == b


def test_name_is_released_when_creation_fails_before_reaching_the_head(cluster):
    @ddlf.remote
    def fail():
        raise ValueError("no")

    bad = Counter.options(name="released").remote(fail.remote())  # its argument fails
    with pytest.raises(ddlf.errors.DDLFError):
        ddlf.get(bad.read.remote(), timeout=20)

    assert wait_for(lambda: _name_is_free("released"), timeout=10)
    good = Counter.options(name="released").remote(3)
    assert ddlf.get(ddlf.get_actor("released").read.remote(), timeout=20) == 3
    assert ddlf.get_actor("released") == good


# -- cluster views ----------------------------------------------------------------------------------

def test_nodes(cluster):
    nodes = ddlf.nodes()
    assert isinstance(nodes, list) and len(nodes) == 1
    n = nodes[0]
    for key in ("node_id", "address", "alive", "resources"):
        assert key in n, n
    assert n["alive"] is True
    assert isinstance(n["node_id"], str) and n["node_id"]
    host, port = n["address"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert n["resources"]["CPU"] == 2.0


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_nodes_follow_fixture_size(cluster):
    assert ddlf.nodes()[0]["resources"]["CPU"] == 3.0
    assert _without_memory(ddlf.cluster_resources()) == {"CPU": 3.0}


def test_cluster_resources(cluster):
    assert _without_memory(ddlf.cluster_resources()) == {"CPU": 2.0}


def test_available_resources_track_actor_lifetime(cluster):
    assert wait_for(lambda: _cpu(ddlf.available_resources()) == 2.0, timeout=10), \
        ddlf.available_resources()
    a = OneCpu.remote()
    assert ddlf.get(a.ping.remote(), timeout=20) == "pong"
    assert wait_for(lambda: _cpu(ddlf.available_resources()) == 1.0, timeout=10), \
        ddlf.available_resources()
    time.sleep(0.3)  # and it stays reserved while the actor lives
    assert _cpu(ddlf.available_resources()) == 1.0
    assert _without_memory(ddlf.cluster_resources()) == {"CPU": 2.0}
    ddlf.kill(a)
    assert wait_for(lambda: _cpu(ddlf.available_resources()) == 2.0, timeout=10), \
        ddlf.available_resources()


def test_available_resources_come_back_after_tasks(cluster):
    assert ddlf.get([two_cpu_task.remote(i) for i in range(4)], timeout=30) == [1, 2, 3, 4]
    assert wait_for(lambda: _cpu(ddlf.available_resources()) == 2.0, timeout=10), \
        ddlf.available_resources()


def test_more_default_actors_than_cpus_all_run(cluster):
    actors = [Counter.remote() for _ in range(4)]  # more actors than CPUs
    assert ddlf.get([a.incr.remote() for a in actors], timeout=30) == [1, 1, 1, 1]


def _without_memory(res: dict) -> dict:
    """Every node also offers its RAM as "memory" (bytes), which differs by machine."""
    return {k: v for k, v in res.items() if k != "memory"}
