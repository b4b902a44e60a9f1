"""The agent ``ddlf`` runs on each host, run here without SSH (no root, no sshd): it starts
the head and a node, answers status, runs a job, and stops only what it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from ddlf_actors.runtime import process, runtime_env
from ddlf_actors.runtime.launch import records, remote

HERE = os.path.dirname(os.path.abspath(__file__))


def _agent(env: dict, request: dict, payload: bytes = b"", timeout: float = 120):
    return subprocess.run([sys.executable, "-m", remote.AGENT_MODULE],
                          input=remote.request_bytes(request) + payload, capture_output=True,
                          timeout=timeout, env=env)


def _job(env: dict, request: dict, payload: bytes, tmp_path) -> tuple[int, bytes, bytes]:
    """A job through the agent, its stdin held open until it ends (as ddlf submit does:
    the end of stdin is the submitter going away)."""
    with open(tmp_path / "out", "w+b") as out, open(tmp_path / "err", "w+b") as err:
        proc = subprocess.Popen([sys.executable, "-m", remote.AGENT_MODULE],
                                stdin=subprocess.PIPE, stdout=out, stderr=err, env=env)
        proc.stdin.write(remote.request_bytes(request) + payload)
        proc.stdin.flush()
        code = proc.wait(120)
        proc.stdin.close()
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def _answer(proc) -> dict:
    answer = remote.parse_answer(proc.stdout)
    assert answer is not None, proc.stderr.decode()
    return answer


@pytest.fixture
def host_env(tmp_path):
    env = {**os.environ, "DDLF_TEMP_DIR": str(tmp_path / "host")}
    env.pop("DDLF_AUTH_TOKEN", None)
    env.pop("SSH_CONNECTION", None)
    return env


def _node_pids(temp_dir: str) -> set:
    """Node processes that run under ``temp_dir``: only this test's, since the other xdist
    worker's tests start nodes of their own at the same time (a machine-wide count failed CI)."""
    pids = set()
    for p in psutil.process_iter(["cmdline"]):
        if "ddlf_actors.runtime.node" not in " ".join(p.info["cmdline"] or []):
            continue
        try:
            if p.environ().get("DDLF_TEMP_DIR") == temp_dir:
                pids.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return pids


def _start(env, **extra) -> dict:
    return _answer(_agent(env, {"verb": "start", "cluster": "local", "roles": ["head", "node"],
                                "versions": process.versions(), "address": "127.0.0.1",
                                "port": 0, "dashboard": None, "num_cpus": 2, **extra}))


def test_the_agent_starts_runs_a_job_and_stops_only_what_it_started(host_env, tmp_path):
    started = _start(host_env)
    assert started["ok"] and started["started"] == ["head", "node"]
    head, node = started["head"], started["node"]
    try:
        assert os.stat(head["token_file"]).st_mode & 0o777 == 0o600
        with open(head["token_file"]) as f:
            assert started["token"] == f.read().strip()
        # The processes are in sessions of their own: they outlive the agent.
        for rec in (head, node):
            assert os.getsid(rec["pid"]) == rec["pid"]
        # Again: nothing new starts.
        again = _start(host_env)
        assert again["started"] == [] and again["node"]["pid"] == node["pid"]

        status = _answer(_agent(host_env, {"verb": "status", "cluster": "local"}))
        assert [n["node_id"] for n in status["nodes"] if n["alive"]] == [node["node_id"]]

        # A job: its folder as a package, its output streamed, its exit status kept.
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        (job_dir / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
        (job_dir / "main.py").write_text(
            "import sys\nimport ddlf_actors as ddlf\nimport helper\n"
            "ddlf.init()\n"
            "@ddlf.remote\ndef f(x):\n    import helper\n    return helper.twice(x)\n"
            "print('sum', sum(ddlf.get([f.remote(i) for i in range(4)])), sys.argv[1:])\n"
            "sys.exit(5)\n")
        _pkg, data = runtime_env.pack(str(job_dir), (), "working_dir")
        code, out, err = _job(host_env, {"verb": "job", "cluster": "local", "script": "main.py",
                                         "args": ["x"], "size": len(data)}, data, tmp_path)
        assert code == 5, err.decode()
        assert b"sum 12 ['x']" in out
        events = [json.loads(ln[len("DDLF_JOB "):]) for ln in err.decode().splitlines()
                  if ln.startswith("DDLF_JOB ")]
        assert [e["event"] for e in events] == ["started", "ended"]
        assert events[1]["status"] == "FAILED" and events[1]["exit_code"] == 5
        logs = _answer(_agent(host_env, {"verb": "logs", "cluster": "local", "what": "job",
                                         "job_id": events[0]["job_id"]}))
        assert "sum 12" in logs["text"]

        # A job whose submitter goes away (its stdin closes) is stopped, with its group.
        (job_dir / "sleep.py").write_text("import time\nprint('up', flush=True)\n"
                                          "time.sleep(300)\n")
        _pkg, data2 = runtime_env.pack(str(job_dir), (), "working_dir")
        sleeper = subprocess.Popen([sys.executable, "-m", remote.AGENT_MODULE],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=host_env)
        sleeper.stdin.write(remote.request_bytes({"verb": "job", "cluster": "local",
                                                  "script": "sleep.py", "size": len(data2)})
                            + data2)
        sleeper.stdin.flush()
        assert sleeper.stdout.readline() == b"up\n"
        sleeper.stdin.close()
        assert sleeper.wait(30) == 130
        jobs = _answer(_agent(host_env, {"verb": "logs", "cluster": "local", "what": "jobs"}))
        assert [j["status"] for j in jobs["jobs"]] == ["FAILED", "STOPPED"]
        assert not psutil.pid_exists(jobs["jobs"][1]["pid"]) or \
            psutil.Process(jobs["jobs"][1]["pid"]).status() == psutil.STATUS_ZOMBIE

    finally:
        stopped = _answer(_agent(host_env, {"verb": "stop", "cluster": "local"}))
    assert sorted(stopped["stopped"]) == [f"head (pid {head['pid']})", f"node (pid {node['pid']})"]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(psutil.pid_exists(r["pid"]) for r in (head, node)):
        time.sleep(0.1)
    assert not any(psutil.pid_exists(r["pid"]) for r in (head, node))
    assert not os.path.exists(head["token_file"])


def test_a_process_that_merely_has_a_recorded_pid_is_never_signalled(host_env):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state_dir = os.path.join(host_env["DDLF_TEMP_DIR"], "clusters", "local")
        os.makedirs(state_dir)
        start = records.process_start_time(bystander.pid)
        for role, began in (("node", start), ("head", start - 100)):   # not DDLF; not it
            with open(os.path.join(state_dir, f"{role}.json"), "w") as f:
                json.dump({"role": role, "pid": bystander.pid, "start_time": began}, f)
        stopped = _answer(_agent(host_env, {"verb": "stop", "cluster": "local"}))
        assert stopped["stopped"] == [] and len(stopped["gone"]) == 2   # nothing signalled
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_node_host_keeps_the_token_0600_and_a_failed_start_leaves_nothing(host_env, tmp_path):
    head_env = {**host_env, "DDLF_TEMP_DIR": str(tmp_path / "headhost")}
    started = _start(head_env)
    try:
        ans = _answer(_agent(host_env, {
            "verb": "start", "cluster": "local", "roles": ["node"], "address": "127.0.0.1",
            "versions": process.versions(), "token": started["token"], "num_cpus": 1,
            "head_address": started["head"]["address"], "head_epoch": started["head"]["epoch"]}))
        token_file = os.path.join(host_env["DDLF_TEMP_DIR"], "clusters", "local", "token")
        assert os.stat(token_file).st_mode & 0o777 == 0o600
        assert ans["node"]["pid"] != started["node"]["pid"]
        # The filter below sees this host's node, so its emptiness later means something.
        assert ans["node"]["pid"] in _node_pids(host_env["DDLF_TEMP_DIR"])
        _answer(_agent(host_env, {"verb": "stop", "cluster": "local"}))
        assert not os.path.exists(token_file)

        # A wrong token: the node cannot join; the agent says so and leaves nothing running.
        before = _node_pids(host_env["DDLF_TEMP_DIR"])
        bad = _answer(_agent(host_env, {
            "verb": "start", "cluster": "local", "roles": ["node"], "address": "127.0.0.1",
            "versions": process.versions(), "token": "not-the-token", "num_cpus": 1,
            "head_address": started["head"]["address"], "head_epoch": started["head"]["epoch"]}))
        assert not bad["ok"] and "failed to start" in bad["error"]
        assert _node_pids(host_env["DDLF_TEMP_DIR"]) <= before

        # Another DDLF version is refused before anything starts.
        other = _answer(_agent(host_env, {
            "verb": "start", "cluster": "local", "roles": ["node"], "address": "127.0.0.1",
            "versions": {"version": "9.9.9", "python": "3.99"}, "token": started["token"],
            "head_address": started["head"]["address"], "head_epoch": started["head"]["epoch"]}))
        assert not other["ok"] and other["error"].startswith("version mismatch: the host runs")
    finally:
        _answer(_agent(head_env, {"verb": "stop", "cluster": "local"}))
