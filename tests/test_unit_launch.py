"""The launcher's parts without SSH: the cluster file (docs/deploy.md's own example), the
one-line reasons for ssh and agent failures, the agent's command line, version checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ddlf_actors.runtime import process
from ddlf_actors.runtime.launch import cluster_file, remote
from ddlf_actors.runtime.launch.cluster_file import ClusterFileError, HostSpec
from ddlf_actors.runtime.launch.ssh import describe_failure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _doc_example() -> str:
    with open(os.path.join(ROOT, "docs", "deploy.md")) as f:
        text = f.read()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/deploy.md has one full cluster file"
    return blocks[0]


def _parse(text: str):
    import yaml

    return cluster_file.parse(yaml.safe_load(text), "cluster.yaml")


def test_the_full_cluster_file_in_docs_deploy_md_reads_as_documented():
    spec = _parse(_doc_example())
    assert spec.name == "lab" and [h.host for h in spec.hosts] == ["gpu1", "gpu2", "10.0.0.13"]
    gpu1, gpu2, third = spec.hosts
    assert spec.head is gpu1
    # Cluster-wide settings fill every host; a host's own win.
    assert gpu1.ssh.user == "alice" and gpu1.ssh.port == 22 and gpu1.ssh.connect_timeout == 10
    assert gpu1.ssh.key == os.path.expanduser("~/.ssh/id_ed25519")
    assert third.ssh.user == "bob" and third.ssh.port == 2222
    assert third.ssh.key == gpu1.ssh.key
    assert gpu1.venv == "~/venvs/ddlf" and gpu2.python == "python3.11"
    assert gpu2.num_cpus == 8 and gpu2.num_gpus == 2 and gpu2.memory == 34359738368
    assert gpu2.resources == {"disk": 1} and gpu2.address == "10.0.0.12"
    assert gpu1.setup_commands == ("pip install -q ddlf-actors==0.1.0",)
    assert spec.port == 6380 and spec.dashboard.port == 8265
    assert spec.dashboard.host == "127.0.0.1"
    assert spec.tls.cert == "/etc/ddlf/host.pem" and spec.tls.ca == "/etc/ddlf/ca.pem"
    assert spec.env == {"OMP_NUM_THREADS": "1"}
    assert spec.start_timeout == 120 and spec.setup_timeout == 900


def test_hosts_alone_take_every_default():
    spec = cluster_file.from_hosts("a, b,c")
    assert [h.host for h in spec.hosts] == ["a", "b", "c"] and spec.name == "default"
    assert spec.port == 6380 and spec.tls is None and spec.dashboard.port is None
    assert spec.head.python == "python3" and spec.head.ssh.user is None


@pytest.mark.parametrize("text,says", [
    ("hosts: [a]\nnum_cpus: 4\n", "cluster.yaml: num_cpus: num_cpus is set per host: write it "
     "under the host"),
    ("hosts: [a]\nsetup_command: [x]\n", "setup_command: unknown key; did you mean "
     "'setup_commands'?"),
    ("hosts: [{host: a, num_cpu: 4}]\n", "hosts[0].num_cpu: unknown key; did you mean 'num_cpus'?"),
    ("hosts: [a]\ntoken: abc\n", "token: the cluster token does not belong in the cluster file"),
    ("hosts: [a]\nenv: {DDLF_AUTH_TOKEN: x}\n", "env.DDLF_AUTH_TOKEN: the token does not go"),
    ("hosts: [a, b, a]\n", "hosts[2]: 'a' is listed twice (also hosts[0])"),
    ("hosts: []\n", "hosts: give a list of hosts, the head first"),
    ("hosts: [a]\nport: 70000\n", "port: expected a port number (0-65535), got 70000"),
    ("hosts: [a]\nssh: {port: twenty}\n", "ssh.port: expected a port number (1-65535)"),
    ("hosts: [{host: a, num_gpus: 1.5}]\n", "hosts[0].num_gpus: a whole number >= 0"),
    ("hosts: [{host: a, resources: [1]}]\n", "hosts[0].resources: a mapping of name to number"),
    ("hosts: ['-oProxyCommand=x']\n", "hosts[0].host: '-oProxyCommand=x' is not a host name"),
    ("hosts: [a]\ntls: {cert: c.pem}\n", "tls: give tls.key, tls.ca too"),
    ("hosts: [a]\ncluster_name: 'a/b'\n", "cluster_name: 'a/b' must be letters"),
    ("hosts: [a]\nsetup_commands: [1]\n", "setup_commands: a list of shell commands"),
    ("- a\n- b\n", "expected a mapping with at least 'hosts:'"),
])
def test_a_wrong_cluster_file_names_the_key(text, says):
    with pytest.raises(ClusterFileError) as e:
        _parse(text)
    assert says in str(e.value)


def test_yaml_syntax_errors_name_the_line(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("hosts:\n  - a\n  - [b\n")
    with pytest.raises(ClusterFileError, match=r"cluster.yaml: not valid YAML \(line \d+"):
        cluster_file.load(str(path))
    with pytest.raises(ClusterFileError, match="cannot read the cluster file"):
        cluster_file.load(str(tmp_path / "missing.yaml"))


# What OpenSSH 9.2 prints in each case (copied from real runs).
_CHANGED = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
Host key for 10.214.250.2 has changed and you have requested strict checking.
Host key verification failed.
"""


@pytest.mark.parametrize("stderr,says", [
    (_CHANGED, "its host key does not match the one in known_hosts"),
    ("No ED25519 host key is known for 10.0.0.5 and you have requested strict checking.\n"
     "Host key verification failed.\n", "its host key is not in known_hosts, and ddlf never "
     "accepts a key unseen: connect once with `ssh gpu1`"),
    ("root@10.0.0.5: Permission denied (publickey).\n", "the key was refused (root@10.0.0.5: "
     "Permission denied (publickey).)"),
    ("ssh: connect to host 10.0.0.9 port 22: Connection timed out\n",
     "unreachable (ssh: connect to host 10.0.0.9 port 22: Connection timed out)"),
    ("ssh: connect to host 10.0.0.5 port 2222: Connection refused\n", "unreachable ("),
    ("ssh: Could not resolve hostname nosuch: Name or service not known\n",
     "unreachable: the name does not resolve"),
])
def test_ssh_failures_are_one_line_that_says_what_to_do(stderr, says):
    line = describe_failure("gpu1", stderr)
    assert says in line and "\n" not in line


def _run_agent_command(host: HostSpec) -> subprocess.CompletedProcess:
    """Run what ssh would run on the host, here, with /bin/sh as the login shell."""
    return subprocess.run(["/bin/sh", "-c", remote.agent_command(host, setup=True)],
                          input=b"{}\n", capture_output=True, timeout=30)


def test_setup_commands_run_in_order_and_the_failing_one_is_named(tmp_path):
    marker = tmp_path / "ran"
    host = HostSpec("gpu1", python="/bin/true", setup_commands=(
        f"echo one >> {marker}", "exit 0", "read line; echo \"stdin: $line\" >&2; exit 4",
        f"echo never >> {marker}"))
    proc = _run_agent_command(host)
    assert marker.read_text() == "one\n"      # `exit 0` ended only its own subshell
    assert b"stdin: " in proc.stderr and b"{}" not in proc.stderr   # no request to read
    err = remote.host_failure(host, proc.returncode, proc.stderr)
    assert err.kind == "setup"
    assert str(err) == ("gpu1: setup command 3 `read line; echo \"stdin: $line\" >&2; exit 4` "
                        "failed with exit status 4: stdin:")


def test_a_missing_python_or_ddlf_says_how_to_fix_it(tmp_path):
    host = HostSpec("gpu1", python=str(tmp_path / "no-python"))
    proc = _run_agent_command(host)
    err = remote.host_failure(host, proc.returncode, proc.stderr)
    assert err.kind == "install" and "no Python at" in err.cause and "set python: or venv:" in err.cause
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"No module named 'ddlf_actors'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    host = HostSpec("gpu1", venv=str(tmp_path) + "/")
    assert remote.python_of(host) == f"{tmp_path}/bin/python"
    proc = _run_agent_command(HostSpec("gpu1", python=str(fake)))
    err = remote.host_failure(host, proc.returncode, proc.stderr)
    assert err.kind == "install" and "DDLF is not installed" in err.cause


def test_the_agent_command_quotes_paths_and_keeps_the_remote_home():
    host = HostSpec("h", venv="~/my envs/ddlf", setup_commands=("echo 'a b'",))
    cmd = remote.agent_command(host, setup=True)
    inner = cmd[len("/bin/sh -c "):]
    import shlex

    script = shlex.split(inner)[0]
    assert 'export VIRTUAL_ENV="$HOME"/\'my envs/ddlf\'' in script
    assert "exec \"$HOME\"/'my envs/ddlf/bin/python' -m ddlf_actors.runtime.launch.agent" in script
    assert "( echo 'a b'\n) </dev/null >&2" in script
    assert remote.agent_command(host).count("echo") == 0    # setup only when asked


def test_version_problem_names_both_versions():
    ours = process.versions()
    assert remote.version_problem(dict(ours), ours) is None
    line = remote.version_problem({"version": "0.0.9", "python": "3.10"}, ours)
    assert line.startswith(f"version mismatch: the host runs DDLF 0.0.9 on Python 3.10, this "
                           f"machine DDLF {ours['version']} on Python {ours['python']}")


def test_answers_are_found_among_other_output_and_never_quoted_in_errors():
    out = b"motd line\nDDLF_AGENT {\"ok\": true, \"token\": \"s3cret\"}\n"
    assert remote.parse_answer(out) == {"ok": True, "token": "s3cret"}
    assert remote.parse_answer(b"DDLF_AGENT {broken\n") is None
    err = remote.host_failure(HostSpec("h"), 1, b"Traceback ...\nKeyError: 'x'\n")
    assert "s3cret" not in str(err) and "KeyError: 'x'" in str(err)


def test_ddlf_without_a_cluster_file_says_how_to_give_one(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ddlf_actors.runtime.launch.cli", "status"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "DDLF_CLUSTER"})
    assert proc.returncode == 2
    assert "no cluster file cluster.yaml: give one (ddlf up cluster.yaml)" in proc.stderr
    bad = tmp_path / "c.yaml"
    bad.write_text("hosts: [a]\nworkers: 3\n")
    proc = subprocess.run([sys.executable, "-m", "ddlf_actors.runtime.launch.cli", "up",
                           str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert f"{bad}: workers: unknown key" in proc.stderr


@pytest.mark.skipif(not __import__("shutil").which("ssh"), reason="needs OpenSSH's ssh client")
def test_init_with_a_cluster_file_whose_head_cannot_be_reached_says_so(tmp_path):
    import ddlf_actors as ddlf

    path = tmp_path / "cluster.yaml"
    path.write_text("hosts: [127.0.0.1]\nssh: {port: 1, connect_timeout: 3}\n")
    with pytest.raises(ddlf.errors.HeadUnreachableError) as e:
        ddlf.init(address=str(path))
    assert f"cluster file {path}: 127.0.0.1: unreachable (ssh: connect to host 127.0.0.1 " \
           "port 1: Connection refused)" in str(e.value)
    assert not ddlf.is_initialized()


def test_ddlf_train_cluster_goes_with_neither_address_nor_ray(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ddlf_actors.apps.cli", "run", "--cluster",
                           "c.yaml", "--address", "10.0.0.5:6380",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "--cluster c.yaml joins the DDLF cluster `ddlf up` started: leave out --address" \
        in proc.stderr
