"""``ddlf up/submit/status/logs/down`` over real SSH: hosts are network namespaces, each
running Debian's sshd (tests/ssh_hosts.py). Runs as root, as CI does; skips elsewhere."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ssh_hosts import SSHHosts, ssh_unavailable

_why = ssh_unavailable()
pytestmark = [pytest.mark.skipif(_why is not None, reason=f"SSH hosts unavailable: {_why}"),
              pytest.mark.timeout(420)]

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "helpers_modules", "submit_train.py")


@pytest.fixture(scope="module")
def hosts():
    h = SSHHosts(5).up()
    try:
        yield h
    finally:
        h.down()
        assert not h.namespaces_left(), "the test's namespaces must be gone"


@pytest.fixture(autouse=True)
def _clusters_down_after(hosts):
    """Whatever a test leaves up (it failed, or skipped, mid-way) goes down after it: the
    module's hosts are shared, and a head left on a host's port 6380 would fail every
    later test's ``ddlf up`` with "address already in use" instead of its own error."""
    before = set(glob.glob(os.path.join(hosts.dir, "*.yaml")))
    yield
    for path in sorted(set(glob.glob(os.path.join(hosts.dir, "*.yaml"))) - before):
        name = os.path.basename(path)[:-len(".yaml")]
        if any(_record(hosts, i, name, role) for i in range(hosts.n) for role in ("head", "node")):
            hosts.ddlf("down", path)


def _ok(proc: subprocess.CompletedProcess, what: str):
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _record(hosts: SSHHosts, i: int, cluster: str, role: str) -> dict | None:
    try:
        with open(os.path.join(hosts.state_dirs[i], "clusters", cluster, f"{role}.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _down_leaves_nothing(hosts: SSHHosts, path: str, name: str, used) -> None:
    _ok(hosts.ddlf("down", path), "ddlf down")
    left = hosts.wait_no_processes([*used, hosts.n])   # the hosts and the driver's machine
    assert not left, f"processes left behind: {left}"
    for i in used:
        assert _record(hosts, i, name, "head") is None and _record(hosts, i, name, "node") is None
        assert not glob.glob(os.path.join(hosts.state_dirs[i], "clusters", name, "token"))
        assert not glob.glob(os.path.join(hosts.state_dirs[i], "head-*", "token"))


def _token_is_nowhere_but_its_files(hosts: SSHHosts, token: str, outputs: list) -> None:
    for text in outputs:
        assert token not in text
    ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    assert token not in ps
    for i in range(hosts.n + 1):   # no process of any host holds it in its environment
        for pid in hosts.pids(i):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    assert token.encode() not in f.read(), pid
            except OSError:
                pass
    for path in glob.glob(os.path.join(hosts.dir, "**", "*"), recursive=True):
        if os.path.isfile(path) and os.path.basename(path) != "token":
            with open(path, "rb") as f:
                assert token.encode() not in f.read(), path


def _greeting(hosts: SSHHosts, address: str) -> str:
    """What the head at ``address`` sends a new connection in its first 2 s: a plain DDLF
    server sends its challenge at once, a TLS one waits for the client's hello."""
    host, port = address.rsplit(":", 1)
    probe = subprocess.run([*hosts.driver_prefix, sys.executable, "-c", (
        "import socket\n"
        f"s = socket.create_connection(('{host}', {port}), 5)\n"
        "s.settimeout(2)\n"
        "try:\n    print(repr(s.recv(8)))\nexcept TimeoutError:\n    print('silent')\n")],
        capture_output=True, text=True, timeout=30)
    return probe.stdout.strip()


def test_a_users_session_up_submit_train_status_down(hosts, tmp_path):
    # Hosts by their ssh_config aliases (lab0 ...), as ~/.ssh/config names lab machines.
    aliases = [hosts.alias(i) for i in range(4)]
    path = hosts.cluster_file("session", aliases)
    up = _ok(hosts.ddlf("up", path), "ddlf up")
    assert "Cluster 'session' is up on 4 of 4 hosts: 4 nodes registered" in up.stdout
    # DDLF binds the address sshd answered on: the alias's HostName.
    assert f"head:      {hosts.ips[0]}:6380" in up.stdout
    assert "  lab3: started: node " in up.stdout and f"at {hosts.ips[3]}:" in up.stdout
    assert f"ddlf submit --cluster {path} script.py" in up.stdout
    assert _greeting(hosts, f"{hosts.ips[0]}:6380") == "b'DDLFAUTH'"   # no TLS asked for

    # The token: made on the head, 0600 on every host, the same everywhere, nowhere else.
    head = _record(hosts, 0, "session", "head")
    assert os.stat(head["token_file"]).st_mode & 0o777 == 0o600
    with open(head["token_file"]) as f:
        token = f.read().strip()
    for i in (1, 2, 3):
        node_token = os.path.join(hosts.state_dirs[i], "clusters", "session", "token")
        assert os.stat(node_token).st_mode & 0o777 == 0o600
        with open(node_token) as f:
            assert f.read().strip() == token
    assert len({_record(hosts, i, "session", "node")["node_id"] for i in range(4)}) == 4

    # A training run through ddlf submit: its files travel with it (numpy_trainer.py).
    job = _ok(hosts.ddlf("submit", "--cluster", path, JOB, "4"), "ddlf submit")
    result = json.loads(next(ln for ln in job.stdout.splitlines()
                             if ln.startswith("RESULT "))[7:])
    assert result["nodes"] == 4 and result["rounds"] == 6 and result["accuracy"] > 0.5
    assert "/clusters/session/jobs/" in result["cwd"]   # it ran in the uploaded folder
    failing = hosts.ddlf("submit", "--cluster", path, JOB, "2", "--fail")
    assert failing.returncode == 3, failing.stderr   # the job's own exit status
    listed = _ok(hosts.ddlf("logs", "--cluster", path), "ddlf logs").stdout.splitlines()
    assert [ln.split()[1] for ln in listed] == ["SUCCEEDED", "FAILED"]
    first = listed[0].split()[0]
    shown = _ok(hosts.ddlf("logs", "--cluster", path, first), "ddlf logs JOB").stdout
    assert "RESULT " in shown
    _ok(hosts.ddlf("logs", "--cluster", path, "--node", "lab2", "--tail", "5"), "logs --node")
    unknown = hosts.ddlf("logs", "--cluster", path, "job-nope")
    assert unknown.returncode == 1 and f"no job job-nope on this cluster (the latest: {first}" \
        in unknown.stderr

    # Ctrl-C stops the job, not the cluster.
    sleeper = hosts.popen_ddlf("submit", "--cluster", path, JOB, "--sleep")
    assert sleeper.stdout is not None
    assert sleeper.stdout.readline().strip() == "SLEEPING"
    sleeper.send_signal(signal.SIGINT)
    _, err = sleeper.communicate(timeout=60)
    assert sleeper.returncode == 130, err
    assert "stopping the job (the cluster stays up)" in err
    jobs = _ok(hosts.ddlf("logs", "--cluster", path), "ddlf logs").stdout.splitlines()
    assert jobs[-1].split()[1] == "STOPPED"
    assert not [p for i in range(4) for p in hosts.ddlf_pids(i)
                if "submit_train" in open(f"/proc/{p}/cmdline").read()]

    # ddlf-train trains on it, its driver on this machine: with PyTorch where the torch
    # extra is installed (its trainers start sooner), else with README's Keras.
    from helpers_modules.fake_data import write_fake_fashion_mnist

    framework, saved = (("torch", "model.pt") if importlib.util.find_spec("torch")
                        else ("keras", "model.keras"))
    data = tmp_path / "data"
    data.mkdir()
    write_fake_fashion_mnist(str(data), n_train=300, n_test=60)
    out = tmp_path / "out"
    train = _ok(hosts.ddlf("run", "--cluster", path, "--framework", framework, "--dataset",
                           "fashion-mnist", "--data-dir", str(data), "--workers", "3",
                           "--master-epochs", "1", "--no-progress", "--out", str(out),
                           tool="ddlf-train"), "ddlf-train run --cluster")
    assert f"Wrote {saved}" in train.stdout
    assert os.path.exists(out / saved)

    status = _ok(hosts.ddlf("status", path), "ddlf status").stdout
    rows = [ln.split() for ln in status.splitlines() if ln.strip().startswith("lab")]
    assert [(r[0], r[2]) for r in rows] == [(a, "running") for a in aliases]
    assert "Not running" not in status

    _token_is_nowhere_but_its_files(hosts, token, [up.stdout, up.stderr, job.stdout,
                                                   job.stderr, status, train.stdout,
                                                   train.stderr])
    _down_leaves_nothing(hosts, path, "session", range(4))


def test_up_again_restarts_only_the_killed_node_and_adds_new_hosts(hosts):
    path = hosts.cluster_file("again", [0, 1, 2])
    _ok(hosts.ddlf("up", path), "ddlf up")
    before = {i: _record(hosts, i, "again", "node") for i in range(3)}
    head = _record(hosts, 0, "again", "head")
    os.kill(before[2]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{before[2]['pid']}") and time.monotonic() < deadline:
        time.sleep(0.05)
    status = hosts.ddlf("status", path).stdout
    assert f"{hosts.ips[2]}: the node (pid {before[2]['pid']}) died" in status

    path = hosts.cluster_file("again", [0, 1, 2, 3])   # and a host joins the file
    again = _ok(hosts.ddlf("up", path), "ddlf up again")
    assert f"{hosts.ips[0]}: already running" in again.stdout
    assert f"{hosts.ips[1]}: already running" in again.stdout
    assert f"{hosts.ips[2]}: restarted" in again.stdout
    assert f"{hosts.ips[3]}: started" in again.stdout
    assert "4 nodes registered" in again.stdout
    after = {i: _record(hosts, i, "again", "node") for i in range(4)}
    assert _record(hosts, 0, "again", "head")["pid"] == head["pid"]
    assert after[0]["pid"] == before[0]["pid"] and after[1]["pid"] == before[1]["pid"]
    assert after[2]["pid"] != before[2]["pid"]
    third = _ok(hosts.ddlf("up", path), "ddlf up a third time")
    assert third.stdout.count("already running") == 4

    # A dead head: up starts a new one (a new token), and every node again to join it.
    os.kill(head["pid"], signal.SIGKILL)
    fourth = _ok(hosts.ddlf("up", path), "ddlf up after the head died")
    assert fourth.stdout.count(": restarted: ") == 4 and "4 nodes registered" in fourth.stdout
    assert _record(hosts, 0, "again", "head")["pid"] != head["pid"]
    assert all(_record(hosts, i, "again", "node")["pid"] != after[i]["pid"] for i in range(4))
    _down_leaves_nothing(hosts, path, "again", range(4))


def test_failing_hosts_get_one_line_each_and_nothing_runs_there(hosts):
    # h1's setup fails, h2 runs another DDLF, h3's host key is not the one we know, h4
    # refuses our key, and nobody answers at .200. Only h0 (the head) comes up.
    fake = os.path.join(hosts.dir, "fakever")
    os.makedirs(fake, exist_ok=True)
    with open(os.path.join(fake, "sitecustomize.py"), "w") as f:
        f.write("import ddlf_actors.runtime\nddlf_actors.runtime.__version__ = '0.0.9'\n")
    old_python = os.path.join(hosts.dir, "python-old-ddlf")
    with open(old_python, "w") as f:
        f.write(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    os.chmod(old_python, 0o755)
    stranger = os.path.join(hosts.dir, "ssh_config_stranger")
    with open(hosts.ssh_config) as f, open(stranger, "w") as g:
        g.write(f.read().replace(hosts.user_key, hosts.stranger_key))
    wrong = os.path.join(hosts.dir, "known_hosts_wrong")
    with open(hosts.known_hosts) as f:
        lines = f.read().splitlines()
    with open(hosts.stranger_key + ".pub") as f:
        lines[3] = f"{hosts.ips[3]} {' '.join(f.read().split()[:2])}"
    with open(wrong, "w") as f:
        f.write("\n".join(lines) + "\n")
    hosts.write_ssh_config(known_hosts=wrong)
    try:
        path = hosts.cluster_file("fail", [
            0,
            {"host": hosts.ips[1], "setup_commands": [
                "echo installing", "echo 'ERROR: No matching distribution' >&2; exit 4"]},
            {"host": hosts.ips[2], "python": old_python},
            3,
            {"host": hosts.ips[4], "ssh": {"config": stranger}},
            "10.214.0.200"])
        up = hosts.ddlf("up", path)
        assert up.returncode == 1
        lines = {ln.split(":")[0].strip(): ln for ln in up.stdout.splitlines()
                 if ln.startswith("  10.214.")}
        assert "started: head at" in lines[hosts.ips[0]]
        assert ("FAILED: setup command 2 `echo 'ERROR: No matching distribution' >&2; exit 4` "
                "failed with exit status 4: ERROR: No matching distribution") in lines[hosts.ips[1]]
        assert ("FAILED: version mismatch: the host runs DDLF 0.0.9 on Python "
                f"{sys.version_info[0]}.{sys.version_info[1]}, this machine DDLF 0.1.0") \
            in lines[hosts.ips[2]]
        assert "FAILED: its host key does not match the one in known_hosts" in lines[hosts.ips[3]]
        assert "FAILED: the key was refused" in lines[hosts.ips[4]]
        assert "FAILED: unreachable (ssh: connect to host 10.214.0.200 port 22" in \
            lines["10.214.0.200"]
        assert "Cluster 'fail' is up on 1 of 6 hosts: 1 nodes registered" in up.stdout
        for i in (1, 2, 3, 4):   # nothing of DDLF runs where the start failed
            assert hosts.ddlf_pids(i) == [], i
        down = hosts.ddlf("down", path)
        assert down.returncode == 1 and f"{hosts.ips[0]}: stopped node" in down.stdout
        assert not hosts.wait_no_processes(range(5))

        # --all-or-nothing: the same failures, and nothing starts anywhere.
        strict = hosts.ddlf("up", "--all-or-nothing", path)
        assert strict.returncode == 1
        assert "nothing started: 4 host(s) failed" in strict.stderr
        assert f"{hosts.ips[0]}: not started: --all-or-nothing" in strict.stdout
        assert not hosts.wait_no_processes(range(6), timeout=5)
    finally:
        hosts.write_ssh_config()


def test_a_tls_cluster_comes_up_runs_a_job_and_speaks_only_tls(hosts, tmp_path):
    pytest.importorskip("cryptography")
    from test_tls import PKI

    pki = PKI(tmp_path)   # one certificate for every host: trust is the cluster CA
    path = hosts.cluster_file("tls", [0, 1], tls={"cert": pki.cert, "key": pki.key,
                                                  "ca": pki.ca})
    _ok(hosts.ddlf("up", path), "ddlf up with TLS")
    job = _ok(hosts.ddlf("submit", "--cluster", path, JOB, "2"), "ddlf submit with TLS")
    assert '"nodes": 2' in job.stdout
    _ok(hosts.ddlf("status", path), "ddlf status with TLS")
    assert _greeting(hosts, f"{hosts.ips[0]}:6380") == "silent"   # it waits for TLS
    _down_leaves_nothing(hosts, path, "tls", range(2))
