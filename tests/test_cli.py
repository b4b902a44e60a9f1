"""The ``ddlf-node`` CLI: start (background and --block), join, status, stop."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers_modules.util import recorded_tree, wait_gone

import ddlf_actors as ddlf

CLI = [sys.executable, "-m", "ddlf_actors.runtime.cli"]


def _cli(*args, timeout=90, **kwargs):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


def _start_blocking_head():
    """``ddlf-node start --head --block``; returns the CLI process and its process tree
    (head, node and the node's workers) once all of them are up."""
    proc = subprocess.Popen([*CLI, "start", "--head", "--port", "0", "--num-cpus", "1", "--block"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    deadline = time.monotonic() + 60
    while "DDLF head started" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    tree: set = set()
    if "DDLF head started" in line:
        # The node pre-starts its workers in the background after the banner: wait for them.
        deadline = time.monotonic() + 30
        while len(tree) < 3 and time.monotonic() < deadline:
            tree = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            time.sleep(0.1)
    return proc, line, tree


def _end(proc, tree=()):
    for pid in tree:  # only if the test failed: end what it started, by pid
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()


@ddlf.remote
class Probe:
    def pid(self):
        return os.getpid()


def test_start_join_status_auto_and_stop(session_dir, tmp_path):
    started = _cli("start", "--head", "--port", "0", "--num-cpus", "1")
    assert started.returncode == 0, started.stderr
    assert "DDLF head started at 127.0.0.1:" in started.stdout
    assert "ddlf-node start --address" in started.stdout and "ddlf.init(" in started.stdout
    address = started.stdout.split("DDLF head started at ")[1].split()[0]
    token_file = started.stdout.split("token file: ")[1].split()[0]
    assert os.stat(token_file).st_mode & 0o777 == 0o600

    # Same host: the joining node finds the token in the head's token file.
    joined = _cli("start", "--address", address, "--num-cpus", "1", "--resources", '{"disk": 3}')
    assert joined.returncode == 0, joined.stderr
    assert "joined " + address in joined.stdout
    try:
        ddlf.init(address="auto")
        try:
            assert _without_memory(ddlf.cluster_resources()) == {"CPU": 2.0, "disk": 3.0}
            p = Probe.options(name="cli-probe").remote()
            pid = ddlf.get(p.pid.remote(), timeout=20)
            status = _cli("status")
            assert status.returncode == 0, status.stderr
            assert status.stdout.count("127.0.0.1:") >= 3  # head line + two nodes
            assert "cli-probe" in status.stdout and str(pid) in status.stdout
        finally:
            ddlf.shutdown()

        # The paper's read_config(): a TOML list of host:port.
        toml = tmp_path / "cluster.toml"
        toml.write_text(f'hosts = ["127.0.0.1:1", "{address}"]\n')
        ddlf.init(address=str(toml))
        try:
            assert ddlf.cluster_resources()["CPU"] == 2.0
        finally:
            ddlf.shutdown()
    finally:
        tree = recorded_tree(session_dir)
        stopped = _cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 3 DDLF process(es)" in stopped.stdout  # head + two node daemons
    assert len(tree) >= 3
    assert not wait_gone(tree), "ddlf-node stop left processes behind"
    assert not glob.glob(str(session_dir / "procs" / "*.json"))


def test_block_mode_stops_everything_on_sigterm(session_dir):
    proc, line, tree = _start_blocking_head()
    try:
        assert "DDLF head started" in line
        assert len(tree) >= 3  # head, node, and the node's workers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not wait_gone(tree)
    finally:
        _end(proc)


def test_block_mode_children_exit_when_the_cli_is_sigkilled(session_dir):
    """SIGKILL cannot be caught: the head, node and workers must notice on their own."""
    proc, line, tree = _start_blocking_head()
    try:
        assert "DDLF head started" in line
        assert len(tree) >= 3
        proc.kill()
        proc.wait(10)
        assert not wait_gone(tree)
    finally:
        _end(proc, tree)


def test_join_without_token_is_a_clear_error(session_dir):
    out = _cli("start", "--address", "127.0.0.1:9")
    assert out.returncode == 2
    assert "no token" in out.stderr and "--token" in out.stderr


def test_join_with_wrong_token_is_refused(session_dir):
    started = _cli("start", "--head", "--port", "0", "--num-cpus", "1")
    assert started.returncode == 0, started.stderr
    address = started.stdout.split("DDLF head started at ")[1].split()[0]
    try:
        out = _cli("start", "--address", address, "--token", "wrong")
        assert out.returncode == 1
        assert "rejected our token" in out.stderr
    finally:
        tree = recorded_tree(session_dir)
        _cli("stop")
    assert not wait_gone(tree)


def test_init_auto_without_a_head_says_how_to_start_one(session_dir):
    with pytest.raises(ddlf.errors.DDLFError, match="ddlf-node start --head"):
        ddlf.init(address="auto")
    assert not ddlf.is_initialized()


def _without_memory(res: dict) -> dict:
    """Every node also offers its RAM as "memory" (bytes), which differs by machine."""
    return {k: v for k, v in res.items() if k != "memory"}


_SLOW_NODE = """\
import os, time
with open("/proc/self/cmdline", "rb") as f:
    if b"ddlf_actors.runtime.node" in f.read():
        time.sleep(float(os.environ.get("DDLF_TEST_NODE_START_DELAY_S", "0")))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_client_connecting_as_the_head_opens_its_port_waits_for_its_node(session_dir, tmp_path):
    """``start --head --block`` starts the head's own node once the head serves. A client
    that connects in between (polling the port) and at once creates an actor must get the
    node, not "the cluster has no live nodes". The node is made to start 3 s late (a
    sitecustomize that sleeps in the node process only), so the client is always first."""
    (tmp_path / "sitecustomize.py").write_text(_SLOW_NODE)
    token_file = tmp_path / "token"
    token_file.write_text("t" * 32)
    token_file.chmod(0o600)
    env = {**os.environ, "DDLF_TEST_NODE_START_DELAY_S": "3",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    port = _free_port()
    proc = subprocess.Popen([*CLI, "start", "--head", "--port", str(port), "--num-cpus", "1",
                             "--dashboard-port", "0", "--token-file", str(token_file), "--block"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    tree: set = set()
    try:
        import socket

        deadline = time.monotonic() + 60
        while True:   # the moment the head's port opens
            assert proc.poll() is None and time.monotonic() < deadline, "the head did not start"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.01)
        tree = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        ddlf.init(address=f"127.0.0.1:{port}", token="t" * 32)
        try:
            probe = Probe.options(num_cpus=1).remote()   # was: "the cluster has no live nodes"
            assert ddlf.get(probe.pid.remote(), timeout=30) > 0
            assert ddlf.cluster_resources()["CPU"] == 1.0
        finally:
            ddlf.shutdown()
        tree |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not wait_gone(tree)
    finally:
        _end(proc, tree)
