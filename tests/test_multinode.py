"""A head and two nodes as separate processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from cluster_utils import MultiNodeCluster, joined

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError, UnschedulableError
from ddlf_actors.runtime.client import current


@ddlf.remote(num_cpus=1)
class Where:
    def __init__(self, tag=None):
        self.tag = tag
        self.calls = 0

    def pid(self):
        return os.getpid()

    def echo(self, x):
        self.calls += 1
        return x

    def slow(self, seconds):
        time.sleep(seconds)
        return seconds

    def say(self, msg):
        print(msg, flush=True)
        return True

    def lookup_and_call(self, name, x):
        other = ddlf.get_actor(name)
        return ddlf.get(other.echo.remote(x))


@pytest.fixture
def multi(no_leaks):
    with joined(MultiNodeCluster(node_cpus=(1, 1), node_resources=[None, {"special": 1}],
                                 head_env={"DDLF_NODE_DEAD_AFTER_S": "3"})) as c:
        yield c


def _views():
    return {v["actor_id"]: v for v in current.get_core().head_call("list_actors")}


def node_of(handle) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        v = _views()[handle._actor_id]
        if v["node_id"]:
            return v["node_id"]
        time.sleep(0.05)
    raise AssertionError(f"{handle} was never placed")


def _wait_for(predicate, timeout=15.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def test_nodes_and_resources(multi):
    nodes = ddlf.nodes()
    assert len(nodes) == 2 and all(n["alive"] for n in nodes)
    assert {n["node_id"] for n in nodes} == {n["node_id"] for n in multi.nodes}
    assert _without_memory(ddlf.cluster_resources()) == {"CPU": 2.0, "special": 1.0}


def test_placement_spreads_by_free_resources(multi):
    a, b = Where.remote(), Where.remote()
    ddlf.get([a.pid.remote(), b.pid.remote()], timeout=20)
    assert node_of(a) != node_of(b)


def test_pinning_by_node_id(multi):
    for n in multi.nodes:
        h = Where.options(num_cpus=0, node_id=n["node_id"]).remote()
        ddlf.get(h.pid.remote(), timeout=20)
        assert node_of(h) == n["node_id"]


def test_custom_resources_honoured(multi):
    h = Where.options(num_cpus=0, resources={"special": 1}).remote()
    ddlf.get(h.pid.remote(), timeout=20)
    assert node_of(h) == multi.nodes[1]["node_id"]
    with pytest.raises(UnschedulableError, match="special"):
        Where.options(num_cpus=0, resources={"special": 2}).remote()


def test_named_actor_from_another_driver_and_from_an_actor(multi):
    shared = Where.options(name="shared", num_cpus=0).remote()
    assert ddlf.get(shared.echo.remote(1), timeout=20) == 1
    script = textwrap.dedent(f"""
        import ddlf_actors as ddlf
        ddlf.init(address={multi.address!r}, token={multi.token!r})
        h = ddlf.get_actor("shared")
        print("RESULT", ddlf.get(h.echo.remote(41), timeout=20) + 1)
        ddlf.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "RESULT 42" in out.stdout, out.stderr
    caller = Where.options(num_cpus=0, node_id=multi.nodes[1]["node_id"]).remote()
    assert ddlf.get(caller.lookup_and_call.remote("shared", 7), timeout=20) == 7
    # Both drivers' calls reached the same actor.
    assert ddlf.get(shared.echo.remote(0), timeout=20) == 0


def test_node_sigkill_fails_pending_calls_and_restarts_elsewhere(multi):
    survivor = Where.options(max_restarts=1).remote("restartable")
    old_pid = ddlf.get(survivor.pid.remote(), timeout=20)
    doomed_node = node_of(survivor)
    index = [n["node_id"] for n in multi.nodes].index(doomed_node)
    pinned = Where.options(num_cpus=0, node_id=doomed_node).remote()
    pinned_pid = ddlf.get(pinned.pid.remote(), timeout=20)
    pending = [pinned.slow.remote(30)] + [pinned.echo.remote(i) for i in range(10)]
    time.sleep(0.3)
    multi.kill_node(index)

    t0 = time.monotonic()
    for ref in pending:
        with pytest.raises(ActorDiedError):
            ddlf.get(ref, timeout=20)
    assert time.monotonic() - t0 < 20
    with pytest.raises(ActorDiedError):
        ddlf.get(pinned.echo.remote(1), timeout=20)

    # The restartable actor comes back on the other node, with __init__ run again.
    def restarted():
        try:
            return ddlf.get(survivor.pid.remote(), timeout=5) != old_pid
        except ActorDiedError:
            return False

    assert _wait_for(restarted, timeout=20)
    assert node_of(survivor) != doomed_node
    assert ddlf.get(survivor.echo.remote("after"), timeout=20) == "after"

    # The dead node's workers exit by themselves: no orphans.
    def gone(pid):
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert _wait_for(lambda: gone(pinned_pid) and gone(old_pid), timeout=10)
    assert _wait_for(lambda: not {n["node_id"]: n for n in ddlf.nodes()}[doomed_node]["alive"])


def test_hung_node_is_declared_dead_by_heartbeat_timeout(multi):
    node_id = multi.nodes[0]["node_id"]
    h = Where.options(num_cpus=0, node_id=node_id).remote()
    ddlf.get(h.pid.remote(), timeout=20)
    pending = h.slow.remote(60)
    time.sleep(0.2)
    multi.kill_node(0, signal.SIGSTOP)  # alive but silent: no FIN, no heartbeats
    try:
        t0 = time.monotonic()
        assert _wait_for(lambda: not {n["node_id"]: n for n in ddlf.nodes()}[node_id]["alive"],
                         timeout=15)
        assert time.monotonic() - t0 < 10  # configured timeout is 3 s
        with pytest.raises(ActorDiedError):
            ddlf.get(pending, timeout=20)
    finally:
        multi.kill_node(0, signal.SIGKILL)


def test_logs_from_every_node_reach_the_driver(multi, capfd):
    hs = [Where.options(num_cpus=0, node_id=n["node_id"]).remote() for n in multi.nodes]
    ddlf.get([h.say.remote(f"hello-from-{i}") for i, h in enumerate(hs)], timeout=20)
    out = ""

    def seen():
        nonlocal out
        out += capfd.readouterr().out
        return all(f"hello-from-{i}" in out for i in range(len(hs)))

    assert _wait_for(seen, timeout=10), out
    for i, n in enumerate(multi.nodes):
        line = next(ln for ln in out.splitlines() if f"hello-from-{i}" in ln)
        assert line.startswith("(Where pid=") and f"node={n['node_id'][:6]}" in line


def test_version_mismatch_is_refused(multi):
    driver = textwrap.dedent(f"""
        import ddlf_actors.runtime as runtime
        runtime.__version__ = "0.0.0-old"
        import ddlf_actors as ddlf
        ddlf.init(address={multi.address!r}, token={multi.token!r})
    """)
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "VersionMismatchError" in out.stderr and "0.0.0-old" in out.stderr

    node = textwrap.dedent(f"""
        import ddlf_actors.runtime as runtime
        import ddlf_actors.runtime.node as node
        runtime.__version__ = "0.0.0-old"
        node.main(["--address", {multi.address!r}, "--token", {multi.token!r}, "--num-cpus", "1"])
    """)
    out = subprocess.run([sys.executable, "-c", node], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "0.0.0-old" in out.stderr and "same DDLF" in out.stderr
    assert len(ddlf.nodes()) == 2


def test_wrong_token_node_is_refused(multi):
    out = subprocess.run(
        [sys.executable, "-m", "ddlf_actors.runtime.node", "--address", multi.address,
         "--token", "not-the-token", "--num-cpus", "1"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "rejected our token" in out.stderr
    assert len(ddlf.nodes()) == 2


def test_status_prints_nodes_and_actors(multi):
    h = Where.options(name="status-probe", num_cpus=0).remote()
    pid = ddlf.get(h.pid.remote(), timeout=20)
    out = subprocess.run(
        [sys.executable, "-m", "ddlf_actors.runtime.cli", "status", "--address", multi.address,
         "--token", multi.token], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for n in multi.nodes:
        assert n["node_id"] in out.stdout
    row = next(ln for ln in out.stdout.splitlines() if "status-probe" in ln)
    assert "Where" in row and str(pid) in row and "ALIVE" in row


def test_driver_sys_path_reaches_workers_on_every_node(multi, tmp_path):
    """A module the nodes cannot know about (written after they started, in a folder only
    the driver's sys.path names) unpickles on both nodes; missing entries are skipped."""
    mod_dir = tmp_path / "driver_only"
    mod_dir.mkdir()
    (mod_dir / "driver_only_mod_7f3a.py").write_text(textwrap.dedent("""
        import os
        import ddlf_actors as ddlf

        @ddlf.remote(num_cpus=0)
        class Shipped:
            def where(self):
                return os.getpid(), __file__
    """))
    missing = str(tmp_path / "does-not-exist-anywhere")
    sys.path[:0] = [str(mod_dir), missing]
    try:
        import driver_only_mod_7f3a as mod

        hs = [mod.Shipped.options(node_id=n["node_id"]).remote() for n in multi.nodes]
        out = ddlf.get([h.where.remote() for h in hs], timeout=30)
        assert len({pid for pid, _ in out}) == len(multi.nodes)
        assert all(path.startswith(str(mod_dir)) for _, path in out)
    finally:
        sys.path.remove(str(mod_dir))
        sys.path.remove(missing)
        sys.modules.pop("driver_only_mod_7f3a", None)


def _without_memory(res: dict) -> dict:
    """Every node also offers its RAM as "memory" (bytes), which differs by machine."""
    return {k: v for k, v in res.items() if k != "memory"}
