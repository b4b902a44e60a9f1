"""``ddlf submit`` and ``ddlf logs``, run from the user's machine.

``submit`` zips the script's folder by the ``runtime_env`` ``working_dir`` rules (the same
default excludes, the same size cap), sends it to the agent on the head host and streams
the job's output back while it runs (:mod:`job_runner` is the other end). The first
Ctrl-C closes the agent's stdin, which stops the job and only the job; a second one
stops waiting. The exit status is the job's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from .. import runtime_env
from .cluster_file import ClusterSpec
from .job_runner import JOB_PREFIX
from .remote import agent_command, call, request, request_bytes
from .ssh import SSH_FAILED, HostError, describe_failure

__all__ = ["JobResult", "pack_job", "submit", "logs"]


class JobResult:
    def __init__(self, job_id: str | None, status: str, exit_code: int, message: str = ""):
        self.job_id = job_id
        self.status = status            # SUCCEEDED, FAILED, STOPPED, or LOST
        self.exit_code = exit_code
        self.message = message


def pack_job(script: str, working_dir: str | None = None, excludes=()) -> tuple[str, bytes]:
    """(the script's path inside the package, the zipped working directory).

    The working directory is the script's folder unless given; the script must be in it.
    ``ValueError`` naming the fix when the folder is over the size cap or the script is
    missing.
    """
    if not os.path.isfile(script):
        raise ValueError(f"{script}: no such file")
    wd = os.path.abspath(working_dir or os.path.dirname(os.path.abspath(script)))
    if not os.path.isdir(wd):
        raise ValueError(f"--working-dir {working_dir}: not a directory")
    rel = os.path.relpath(os.path.abspath(script), wd)
    if rel.startswith(".."):
        raise ValueError(f"{script} is not inside the working directory {wd}: give "
                         "--working-dir a folder that holds it")
    try:
        _pkg, data = runtime_env.pack(wd, tuple(excludes), "working_dir")
    except ValueError as e:
        raise ValueError(f"{e} (for ddlf submit: --exclude GLOB, or --working-dir a smaller "
                         "folder that holds the script)") from None
    return rel.replace(os.sep, "/"), data


def submit(spec: ClusterSpec, transport, script: str, args: list, *, working_dir=None,
           excludes=(), out=None, err=None, say=None) -> JobResult:
    """Run ``script`` with ``args`` as a driver on the head host; stream its output to
    ``out`` (bytes) and our notes to ``say``; return how it ended."""
    out = out or sys.stdout.buffer
    err = err or sys.stderr
    say = say or (lambda line: print(line, file=err, flush=True))
    rel, data = pack_job(script, working_dir, excludes)
    head = spec.head
    req = request(spec, "job", script=rel, args=list(args), size=len(data), env=spec.env)
    proc = transport.popen(head, agent_command(head), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    events: list = []
    other_err: list = []

    def pump_out():
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):
            out.write(chunk)
            out.flush()

    def pump_err():
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode(errors="replace")
            if line.startswith(JOB_PREFIX):
                ev = json.loads(line[len(JOB_PREFIX):])
                events.append(ev)
                if ev["event"] == "started":
                    say(f"ddlf: job {ev['job_id']} running on {head.host} (head "
                        f"{ev['head']}); Ctrl-C stops the job, not the cluster; its output "
                        f"stays in `ddlf logs {ev['job_id']}`")
            else:
                other_err.append(line)
                err.write(line)
                err.flush()

    threads = [threading.Thread(target=pump_out, daemon=True),
               threading.Thread(target=pump_err, daemon=True)]
    for t in threads:
        t.start()
    interrupts = []

    def on_sigint(*_):
        interrupts.append(1)
        if len(interrupts) == 1:
            say("\nddlf: stopping the job (the cluster stays up); Ctrl-C again to stop waiting")
            try:
                proc.stdin.close()
            except OSError:
                pass
        else:
            proc.kill()

    previous = signal.signal(signal.SIGINT, on_sigint) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        try:
            proc.stdin.write(request_bytes(req))
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass   # the agent ended early; its stderr says why
        proc.wait()
        for t in threads:
            t.join(5)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        try:
            proc.stdin.close()
        except OSError:
            pass
    ended = next((e for e in events if e["event"] == "ended"), None)
    if ended:
        code = 130 if ended["status"] == "STOPPED" else (ended["exit_code"] if
                                                           ended["exit_code"] >= 0 else 1)
        return JobResult(ended["job_id"], ended["status"], code, ended.get("message", ""))
    error = next((e for e in events if e["event"] == "error"), None)
    if error:
        raise HostError(head.host, error["message"])
    started = next((e for e in events if e["event"] == "started"), None)
    if started is None:
        text = "".join(other_err)
        if proc.returncode == SSH_FAILED:
            raise HostError(head.host, describe_failure(head.host, text), "ssh")
        raise HostError(head.host, f"the job did not start (exit status {proc.returncode}): "
                        f"{text.strip().splitlines()[-1] if text.strip() else 'no message'}")
    return JobResult(started["job_id"], "LOST", 1 if not interrupts else 130,
                     "the connection to the head host ended before the job did; "
                     f"`ddlf logs {started['job_id']}` shows what it printed")


def logs(spec: ClusterSpec, transport, *, job_id=None, node_host=None, head=False,
         tail=0) -> dict:
    """A job's output, a host's node log or the head's log (``text``), or with none of
    them the list of jobs (``jobs``)."""
    if job_id:
        host, req = spec.head, {"what": "job", "job_id": job_id}
    elif node_host:
        host, req = spec.find(node_host), {"what": "node"}
    elif head:
        host, req = spec.head, {"what": "head"}
    else:
        host, req = spec.head, {"what": "jobs"}
    return call(transport, host, request(spec, "logs", tail=tail, **req),
                timeout=host.ssh.connect_timeout + 60)
