"""Talking to the agent on a host: the command ssh runs there, the request, the answer.

Every ``ddlf`` command reaches a host as one ssh command that runs

    /bin/sh -c '[export PATH=VENV/bin:$PATH;] [setup commands;] exec PYTHON -m ddlf_actors.runtime.launch.agent'

The request is one JSON line on the agent's **stdin**, so nothing secret (the cluster
token that ``up`` hands a node) is ever on a command line, where every local user of the
host could read it in ``ps``. The answer is the last stdout line that starts with
``DDLF_AGENT``; a job streams its output before that.

Setup commands run each in a subshell, with their stdin closed (they must not eat the
request) and their output on stderr; the first that fails stops the command with status 97 and a
``DDLF_SETUP_FAILED <i> <status>`` line, which :func:`host_failure` turns into one line
naming the command.
"""

from __future__ import annotations

import json
import shlex

from .cluster_file import ClusterSpec, HostSpec
from .ssh import SSH_FAILED, HostError, describe_failure

__all__ = ["AGENT_MODULE", "ANSWER_PREFIX", "SETUP_FAILED", "agent_command", "request",
           "request_bytes",
           "parse_answer", "host_failure", "version_problem", "call"]

AGENT_MODULE = "ddlf_actors.runtime.launch.agent"
ANSWER_PREFIX = "DDLF_AGENT "
SETUP_FAILED = 97
_SETUP_MARK = "DDLF_SETUP_FAILED"


def remote_path(path: str) -> str:
    """``path`` quoted for the remote shell, a leading ``~/`` kept as the remote $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def python_of(host: HostSpec) -> str:
    return f"{host.venv.rstrip('/')}/bin/python" if host.venv else host.python


def agent_command(host: HostSpec, setup: bool = False) -> str:
    """The one shell string ssh runs on ``host``: optional setup, then the agent."""
    lines = []
    if host.venv:
        venv = remote_path(host.venv.rstrip("/"))
        lines.append(f"export VIRTUAL_ENV={venv} PATH={venv}/bin:\"$PATH\"")
    if setup:
        for i, cmd in enumerate(host.setup_commands):
            # A subshell each: a command's own `exit` ends only it (as each of Ray's
            # setup_commands is a command of its own).
            lines.append(f"( {cmd}\n) </dev/null >&2 || {{ echo \"{_SETUP_MARK} {i} $?\" >&2; "
                         f"exit {SETUP_FAILED}; }}")
    lines.append(f"exec {remote_path(python_of(host))} -m {AGENT_MODULE}")
    return "/bin/sh -c " + shlex.quote("\n".join(lines))


def request(spec: ClusterSpec, verb: str, **fields) -> dict:
    """A request to the agent about ``spec``'s cluster. It carries the TLS paths, so an
    agent that talks to the head (status, a job's driver) does so as the cluster does."""
    return {"verb": verb, "cluster": spec.name, "tls": vars(spec.tls) if spec.tls else None,
            **fields}


def request_bytes(request: dict) -> bytes:
    return (json.dumps(request) + "\n").encode()


def parse_answer(stdout: bytes) -> dict | None:
    """The agent's answer in ``stdout``, or None if it gave none."""
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith(ANSWER_PREFIX):
            try:
                return json.loads(line[len(ANSWER_PREFIX):])
            except ValueError:
                return None
    return None


def host_failure(host: HostSpec, returncode: int, stderr: bytes) -> HostError:
    """Why the command on ``host`` gave no answer: a :class:`HostError` whose cause is one
    line and whose ``kind`` says where it failed.

    Never built from stdout: an answer can carry the token.
    """
    err = stderr.decode(errors="replace")
    last = next((ln.strip() for ln in reversed(err.splitlines())
                 if ln.strip() and not ln.startswith(_SETUP_MARK)), "")
    if returncode == SSH_FAILED and ("ssh:" in err or "Permission denied" in err
                                     or "Host key" in err or "host key" in err):
        return HostError(host.host, describe_failure(host.host, err), "ssh")
    if returncode == SETUP_FAILED:
        mark = [ln.split() for ln in err.splitlines() if ln.startswith(_SETUP_MARK)]
        if mark:
            i, status = int(mark[-1][1]), mark[-1][2]
            cmd = host.setup_commands[i] if i < len(host.setup_commands) else "?"
            return HostError(host.host, f"setup command {i + 1} `{cmd}` failed with exit "
                             f"status {status}" + (f": {last}" if last else ""), "setup")
    python = python_of(host)
    if returncode in (126, 127) and ("not found" in err or "No such file" in err
                                     or "Permission denied" in err):
        return HostError(host.host, f"no Python at {python!r} ({last}): set python: or venv: "
                         "for this host in the cluster file", "install")
    if "No module named" in err and "ddlf_actors" in err:
        return HostError(host.host, f"DDLF is not installed for {python} ({last}): add a setup "
                         "command such as `pip install ddlf-actors` to the cluster file, or "
                         "point python:/venv: at an environment that has it", "install")
    return HostError(host.host, f"the DDLF agent failed (exit status {returncode}): "
                     f"{last or 'no message'}")


def version_problem(theirs: dict, ours: dict) -> str | None:
    """Why a host's DDLF and Python (``theirs``, from ``process.versions()``) cannot join a
    driver running ``ours``, or None when they match."""
    if theirs.get("version") == ours.get("version") and theirs.get("python") == ours.get("python"):
        return None
    return (f"version mismatch: the host runs DDLF {theirs.get('version')} on Python "
            f"{theirs.get('python')}, this machine DDLF {ours.get('version')} on Python "
            f"{ours.get('python')}; install the same DDLF and Python major.minor on every "
            "host (a setup command such as `pip install ddlf-actors==VERSION` does it)")


def call(transport, host: HostSpec, request: dict, *, setup: bool = False,
         timeout: float = 60.0) -> dict:
    """Send ``request`` to the agent on ``host``; its answer. ``HostError`` (one line) when
    the host cannot be reached, setup fails, or the agent refuses."""
    proc = transport.run(host, agent_command(host, setup), request_bytes(request), timeout)
    answer = parse_answer(proc.stdout)
    if answer is None:
        raise host_failure(host, proc.returncode, proc.stderr)
    if not answer.get("ok"):
        raise HostError(host.host, answer.get("error") or "the agent refused, without a reason")
    return answer
