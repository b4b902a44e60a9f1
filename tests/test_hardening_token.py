"""The token never appears on a command line; the session folder must be private."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest
from helpers_modules.clusters import start_cluster
from helpers_modules.remote_defs import Counter
from helpers_modules.util import recorded_tree, wait_gone

import ddlf_actors as ddlf
from ddlf_actors.runtime import config
from ddlf_actors.runtime.errors import DDLFError
from ddlf_actors.runtime.wire.auth import generate_token, write_token_file

CLI = [sys.executable, "-m", "ddlf_actors.runtime.cli"]


def _cmdlines_with(secret: str) -> list[str]:
    """Every process on this machine whose command line contains ``secret``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if secret in cmd:
            found.append(f"pid {p.info['pid']}: {cmd[:200]}")
    return found


@pytest.mark.parametrize("explicit", [False, True], ids=["generated", "init-token"])
def test_embedded_cluster_keeps_the_token_off_command_lines(explicit):
    token = generate_token() if explicit else None
    with start_cluster(num_cpus=1, token=token) as info:
        if explicit:
            assert info.token == token
        a = Counter.remote()   # a worker process, and its forkserver, exist too
        assert ddlf.get(a.incr.remote(), timeout=20) == 1
        assert _cmdlines_with(info.token) == []


def _cli(*args, env=None, timeout=90):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_cli_head_and_joining_node_keep_the_token_off_command_lines(session_dir, tmp_path):
    token = generate_token()
    token_file = tmp_path / "token"
    write_token_file(str(token_file), token)
    head = _cli("start", "--head", "--port", "0", "--num-cpus", "1", "--token-file", str(token_file))
    try:
        assert head.returncode == 0, head.stderr
        address = head.stdout.split("DDLF head started at ")[1].split()[0]
        assert f"ddlf-node start --address {address} --token-file " in head.stdout
        assert token not in head.stdout
        # Joining: once through the environment, once through a token file.
        joined = _cli("start", "--address", address, "--num-cpus", "1",
                      env={"DDLF_AUTH_TOKEN": token})
        assert joined.returncode == 0, joined.stderr
        joined = _cli("start", "--address", address, "--num-cpus", "1",
                      "--token-file", str(token_file))
        assert joined.returncode == 0, joined.stderr
        assert "warning" not in head.stderr + joined.stderr
        ddlf.init(address=address, token=token)   # the head took the token from the file
        try:
            assert ddlf.cluster_resources()["CPU"] == 3.0
            a = Counter.remote()
            assert ddlf.get(a.incr.remote(), timeout=20) == 1
            assert _cmdlines_with(token) == []
        finally:
            ddlf.shutdown()
    finally:
        tree = recorded_tree(session_dir)
        _cli("stop")
    assert not wait_gone(tree)


def test_cli_token_flag_still_works_but_warns_and_is_not_forwarded(session_dir):
    """--token stays for compatibility: the CLI's own argv has it, its children must not."""
    head = _cli("start", "--head", "--port", "0", "--num-cpus", "1")
    assert head.returncode == 0, head.stderr
    address = head.stdout.split("DDLF head started at ")[1].split()[0]
    token = open(head.stdout.split("token file: ")[1].split()[0]).read().strip()
    proc = subprocess.Popen([*CLI, "start", "--address", address, "--num-cpus", "1", "--token",
                             token, "--block"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    tree: set = set()
    try:
        line, deadline = "", time.monotonic() + 60
        while "joined" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert "joined" in line
        tree = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        leaks = [c for c in _cmdlines_with(token) if not c.startswith(f"pid {proc.pid}:")]
        assert leaks == [], "the token was forwarded on a child's command line"
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert "--token is visible to every local user" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        tree |= recorded_tree(session_dir)
        _cli("stop")
    assert not wait_gone(tree)


# -- the session folder --------------------------------------------------------------------------


def test_session_folder_is_created_private(tmp_path, monkeypatch):
    d = tmp_path / "fresh"
    monkeypatch.setenv("DDLF_TEMP_DIR", str(d))
    assert config.session_root() == str(d)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def _squat_default_folder(tmp_path, monkeypatch):
    """Pre-create the default /tmp/ddlf-<uid> (under a private TMPDIR) as another user would."""
    monkeypatch.delenv("DDLF_TEMP_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    d = tmp_path / f"ddlf-{os.getuid()}"
    d.mkdir(mode=0o700)
    # A planted record pointing "auto" at the squatter's head (and token file).
    (d / "head.json").write_text(json.dumps({"address": "127.0.0.1:9", "pid": os.getpid(),
                                             "token_file": str(d / "token")}))
    return d


def test_session_folder_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    d = _squat_default_folder(tmp_path, monkeypatch)
    if os.geteuid() == 0:
        os.chown(d, 65534, 65534)
        owner = 65534
    else:  # cannot give a folder away: pretend to be someone else instead
        owner = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: owner + 1)
        d.rename(tmp_path / f"ddlf-{owner + 1}")
    with pytest.raises(DDLFError, match=f"owned by uid {owner}, not by you"):
        config.session_root()
    with pytest.raises(DDLFError, match=f"owned by uid {owner}"):
        ddlf.init(address="auto")
    assert not ddlf.is_initialized()


def test_session_folder_writable_by_others_is_refused(tmp_path, monkeypatch):
    d = _squat_default_folder(tmp_path, monkeypatch)
    os.chmod(d, 0o777)
    with pytest.raises(DDLFError, match="writable by group or others .*chmod 700"):
        config.session_root()
    out = _cli("stop")   # the CLI says so too, without a traceback
    assert out.returncode == 1
    assert "writable by group or others" in out.stderr and "Traceback" not in out.stderr
