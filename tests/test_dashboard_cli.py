"""Starting the dashboard other ways: ``ddlf-node start --head`` (where it serves, what
status says, a port that cannot be had) and Ray's ``ray.init(include_dashboard=True)``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

import pytest

pytest.importorskip("aiohttp")

CLI = [sys.executable, "-m", "ddlf_actors.runtime.cli"]


def _cli(*args, timeout=90):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_head_serves_the_dashboard_where_asked_and_status_names_it(session_dir):
    port = _free_port()
    started = _cli("start", "--head", "--port", "0", "--num-cpus", "1",
                   "--dashboard-port", str(port))
    try:
        assert started.returncode == 0, started.stderr
        url = f"http://127.0.0.1:{port}"
        assert f"dashboard: {url}" in started.stdout
        with urllib.request.urlopen(url + "/api/nodes", timeout=10) as r:
            nodes = json.loads(r.read())
        assert len(nodes) == 1 and nodes[0]["alive"]
        status = _cli("status")
        assert status.returncode == 0, status.stderr
        assert f"Dashboard: {url}" in status.stdout
    finally:
        stopped = _cli("stop")
    assert stopped.returncode == 0, stopped.stderr


def test_a_taken_dashboard_port_fails_the_start_and_names_it(session_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = _cli("start", "--head", "--port", "0", "--num-cpus", "1",
                       "--dashboard-port", str(port))
        stopped = _cli("stop")
    assert started.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in started.stderr
    assert "--dashboard-port" in started.stderr
    assert stopped.returncode == 0, stopped.stderr


def test_ray_init_include_dashboard_starts_it_and_says_where_as_ray_does():
    from helpers_modules.clusters import no_leaked_processes

    from ddlf_actors.compat import ray

    port = _free_port()
    with no_leaked_processes():
        ctx = ray.init(num_cpus=1, include_dashboard=True, dashboard_port=port)
        try:
            assert ctx.dashboard_url == f"127.0.0.1:{port}"   # Ray's form: no scheme
            with urllib.request.urlopen(f"http://{ctx.dashboard_url}/api/nodes", timeout=10) as r:
                assert len(json.loads(r.read())) == 1
        finally:
            ray.shutdown()


def test_a_dashboard_port_without_head_is_refused(session_dir):
    got = _cli("start", "--address", "127.0.0.1:1", "--dashboard-port", "8265")
    assert got.returncode == 2 and "goes with --head" in got.stderr
