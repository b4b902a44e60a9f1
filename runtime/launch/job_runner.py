"""A submitted job on the head host: unpack its files, run its driver, stream its output.

``ddlf submit`` sends the request line, then the zipped working directory (the
``runtime_env`` rules: :func:`runtime_env.pack`, size-capped), and keeps the agent's stdin
open: it is the job's lifeline. When it ends (the user pressed Ctrl-C and ``ddlf submit``
closed it, or the SSH connection died) the job's process group is stopped; the cluster is
not touched.

The driver runs ``python script.py args`` in the unpacked folder with ``DDLF_ADDRESS`` set
to the head, so its ``ddlf.init()`` joins this cluster (as Ray's jobs read
``RAY_ADDRESS``), and ``DDLF_RUNTIME_ENV`` naming the folder as the job's ``working_dir``,
so its actors on other hosts import the same files. The token is not handed over: the
driver finds the head's own token file on this host, as any driver here would.

Output (stdout and stderr, merged) goes to this agent's stdout, which ssh carries back,
and to ``output.log`` for ``ddlf logs``. Start and end are reported on stderr as
``DDLF_JOB {json}`` lines.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time

from .. import runtime_env
from ..errors import DDLFError
from .records import HostState, process_start_time

__all__ = ["JOB_PREFIX", "new_job_id", "run_job", "report"]

JOB_PREFIX = "DDLF_JOB "
STOP_GRACE_S = 10.0


def new_job_id() -> str:
    return time.strftime("job-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def report(**info) -> None:
    sys.stderr.write(JOB_PREFIX + json.dumps(info) + "\n")
    sys.stderr.flush()


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(1 << 20, n - got))
        if not chunk:
            raise DDLFError(f"the job's files were cut short ({got} of {n} bytes came)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def run_job(state: HostState, req: dict, stdin_fd: int = 0) -> int:
    """Run the job ``req`` describes; return its exit status (the agent exits with it)."""
    head = state.running("head")
    if head is None:
        raise DDLFError(f"cluster {state.cluster!r} is not running on this host: run `ddlf up` "
                        "first")
    size = int(req["size"])
    if size > runtime_env.MAX_PACKAGE_BYTES:
        raise DDLFError(f"the job's files are {size} bytes, over the cap of "
                        f"{runtime_env.MAX_PACKAGE_BYTES}")
    data = _read_exactly(stdin_fd, size)
    job_id = req.get("job_id") or new_job_id()
    job_dir = state.job_dir(job_id)
    os.makedirs(job_dir, mode=0o700)
    wd = os.path.join(job_dir, "wd")
    runtime_env.unpack(data, wd)
    script = os.path.normpath(os.path.join(wd, req["script"]))
    if not script.startswith(wd + os.sep) or not os.path.isfile(script):
        raise DDLFError(f"{req['script']} is not among the job's files")
    env = {**os.environ, **req.get("env", {}), "DDLF_ADDRESS": head["address"],
           "DDLF_RUNTIME_ENV": json.dumps({"working_dir": wd}), "PYTHONUNBUFFERED": "1"}
    env.pop("DDLF_AUTH_TOKEN", None)
    log_path = os.path.join(job_dir, "output.log")
    proc = subprocess.Popen([sys.executable, script, *req.get("args", [])], cwd=wd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    rec = {"job_id": job_id, "pid": proc.pid, "start_time": process_start_time(proc.pid),
           "script": req["script"], "args": req.get("args", []), "started": time.time(),
           "status": "RUNNING", "head": head["address"]}
    state.write_job(rec)
    report(event="started", job_id=job_id, head=head["address"])
    status, message = _pump(proc, log_path, stdin_fd)
    code = proc.returncode
    rec.update(status=status, exit_code=code, ended=time.time(), message=message)
    state.write_job(rec)
    report(event="ended", job_id=job_id, status=status, exit_code=code, message=message)
    if status == "STOPPED":
        return 130
    return code if code is not None and code >= 0 else 1


def _pump(proc: subprocess.Popen, log_path: str, stdin_fd: int) -> tuple[str, str]:
    """Copy the job's output to our stdout and its log until it exits; stop it when our
    stdin ends. Returns (status, message)."""
    assert proc.stdout is not None
    out_fd = proc.stdout.fileno()
    watch = [out_fd, stdin_fd]
    stopped = None
    with open(log_path, "ab") as log:
        while True:
            ready, _, _ = select.select(watch, [], [], 1.0)
            if out_fd in ready:
                chunk = os.read(out_fd, 65536)
                if not chunk:
                    break
                log.write(chunk)
                log.flush()
                try:
                    os.write(1, chunk)
                except OSError:   # nobody reads us any more: the submitter is gone
                    stopped = stopped or "the connection to ddlf submit was lost"
                    _stop_group(proc)
            if stdin_fd in ready and stdin_fd in watch:
                try:
                    more = os.read(stdin_fd, 4096)
                except OSError:
                    more = b""
                if not more:
                    watch.remove(stdin_fd)
                    stopped = "stopped from ddlf submit (Ctrl-C, or its connection ended)"
                    _stop_group(proc)
        proc.wait()
        if stopped:
            log.write(f"\n[ddlf] job {stopped}\n".encode())
    if stopped:
        return "STOPPED", stopped
    if proc.returncode == 0:
        return "SUCCEEDED", ""
    if proc.returncode < 0:
        return "FAILED", f"killed by signal {-proc.returncode}"
    return "FAILED", f"exit status {proc.returncode}"


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the job's process group; SIGKILL it if still there after a grace period
    (run in the background so output keeps flowing meanwhile)."""
    import threading

    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        return

    def later():
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    threading.Thread(target=later, daemon=True).start()
