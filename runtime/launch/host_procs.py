"""The agent's work on its host: start the head and the node, stop them, say how they are.

Each start goes through :func:`process.start_daemon` (setsid, stdin closed, output to the
cluster's log folder), exactly as ``ddlf-node start`` does, so the processes outlive the
SSH session that started them. What was started is recorded (:mod:`records`), and only
recorded processes are ever stopped.

The token: the head makes it and writes its own 0600 file; a node host gets it in the
request on stdin and keeps it in a 0600 file that the node reads (``--token-file``): it is
on no command line and in no environment.
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil

from .. import process
from ..errors import DDLFError, TLSConfigError
from ..wire import tls
from ..wire.auth import read_token_file, write_token_file
from .records import HostState, alive, process_start_time

__all__ = ["bind_address", "probe", "start", "stop", "head_token", "tls_env"]

STOP_GRACE_S = 15.0


def bind_address(requested: str | None) -> str:
    """The IP this host's DDLF processes bind and advertise: the cluster file's
    ``address``, else the address sshd answered on (``SSH_CONNECTION``), which is the
    address the driver (or its ProxyJump host) reached this host by."""
    if requested:
        return requested
    parts = os.environ.get("SSH_CONNECTION", "").split()
    if len(parts) == 4:
        return parts[2]
    raise DDLFError("cannot tell which address to bind (no SSH_CONNECTION here): set "
                    "address: for this host in the cluster file")


def _describe(state: HostState, role: str) -> dict:
    rec = state.read(role)
    if rec is None:
        return {"running": False, "started": False}
    return {**rec, "running": alive(rec), "started": True}


def head_token(state: HostState) -> str | None:
    rec = state.running("head")
    if rec is None:
        return None
    try:
        return read_token_file(rec["token_file"])
    except OSError:
        return None


def probe(state: HostState, want_token: bool = False) -> dict:
    """This host's versions and what of the cluster runs here (and, from the head host
    when asked, the token, for nodes that need it)."""
    out: dict = {"versions": process.versions(), "head": _describe(state, "head"),
           "node": _describe(state, "node"), "hostname": os.uname().nodename}
    if want_token:
        out["token"] = head_token(state)
    return out


def tls_env(req: dict) -> dict:
    """``DDLF_TLS_*`` for the paths the request names (checked here, on the host), or {}."""
    paths = req.get("tls")
    if not paths:
        return {}
    files = tls.files_from_args(paths["cert"], paths["key"], paths["ca"])
    try:
        return tls.to_env(tls.check(files))
    except TLSConfigError as e:
        raise DDLFError(f"TLS: {e} (tls: in the cluster file names paths on every host)") from None


def start(state: HostState, req: dict) -> dict:
    """Start what ``req["roles"]`` asks for and is not running already; the records.

    On any failure, what this call started is stopped again before the error is raised:
    nothing is left running on a host whose start failed.
    """
    ip = bind_address(req.get("address"))
    env = {**req.get("env", {}), **tls_env(req)}
    started: list = []
    out: dict = {"started": []}
    try:
        if "head" in req["roles"]:
            head = state.running("head")
            if head is None:
                head = _start_head(state, ip, req, env)
                started.append("head")
            out["head"] = head
            out["token"] = read_token_file(head["token_file"])
            head_address, epoch = head["address"], head["epoch"]
            token_file = head["token_file"]
        else:
            head_address, epoch = req["head_address"], req["head_epoch"]
            token_file = None
        if "node" in req["roles"]:
            node = state.running("node")
            if node is not None and node.get("head_epoch") != epoch:
                # A node of an earlier head (it died, up started a new one) cannot join the
                # new one: it holds the old token. Replace it.
                _stop_recs([node])
                node = None
            if node is None:
                if token_file is None:
                    token = req.get("token")
                    if not token:
                        raise DDLFError("no token came with the request to start a node")
                    token_file = state.token_path
                    write_token_file(token_file, token)
                node = _start_node(state, ip, head_address, epoch, token_file, req, env)
                started.append("node")
            out["node"] = node
    except BaseException:
        stop(state, only=started)
        raise
    out["started"] = started
    return out


def _start_head(state: HostState, ip: str, req: dict, env: dict) -> dict:
    from ..head.dashboard import head_args

    dash = req.get("dashboard")
    try:
        dash_args, note = head_args(dash.get("port") if dash else 0,
                                    dash.get("host", "127.0.0.1") if dash else "127.0.0.1")
    except ValueError as e:
        raise DDLFError(f"dashboard: {e}") from None
    args = ["ddlf_actors.runtime.head", "--host", ip, "--port", str(req.get("port", 6380)),
            *dash_args]
    proc, info = process.start_daemon(args, "head", state.log_path("head"), env=env)
    ctime = process_start_time(proc.pid)
    rec = {"role": "head", "pid": proc.pid, "start_time": ctime, "address": info["address"],
           "token_file": info["token_file"], "dashboard_url": info.get("dashboard_url"),
           "dashboard_note": note, "epoch": f"{proc.pid}-{ctime}", "started_at": time.time()}
    state.write("head", rec)
    return rec


def _start_node(state: HostState, ip: str, head_address: str, epoch: str, token_file: str,
                req: dict, env: dict) -> dict:
    args = ["ddlf_actors.runtime.node", "--address", head_address, "--host", ip,
            "--resources", json.dumps(req.get("resources") or {}), "--token-file", token_file]
    for flag, key in (("--num-cpus", "num_cpus"), ("--num-gpus", "num_gpus"),
                      ("--memory", "memory")):
        if req.get(key) is not None:
            args += [flag, str(req[key])]
    proc, info = process.start_daemon(args, "node", state.log_path("node"), env=env)
    rec = {"role": "node", "pid": proc.pid, "start_time": process_start_time(proc.pid),
           "node_id": info["node_id"], "address": info["address"], "head_address": head_address,
           "head_epoch": epoch, "started_at": time.time()}
    state.write("node", rec)
    return rec


def _stop_recs(recs: list, grace_s: float = STOP_GRACE_S) -> list:
    """SIGTERM every recorded process that is still that process, all at once (a node
    and a head each take ~2 s to stop their workers and connections), then SIGKILL what
    is left after ``grace_s``. Returns the records that were running."""
    procs = []
    for rec in recs:
        if not alive(rec):
            continue
        try:
            procs.append((rec, psutil.Process(int(rec["pid"]))))
        except psutil.Error:
            pass
    process.terminate_then_kill([p for _, p in procs], grace_s)
    return [rec for rec, _ in procs]


def _stop_job(rec: dict) -> bool:
    """A job's driver runs in a process group of its own: stop the whole group."""
    if not alive(rec, marker=""):
        return False
    pgid = int(rec["pid"])
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(rec, marker=""):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    return True


def stop(state: HostState, only: list | None = None) -> dict:
    """Stop what ``up`` started here (``only``: just those roles): running jobs first, then
    the node (which stops its workers) and the head together. Removes their records and
    the node's token file."""
    roles = only if only is not None else ["jobs", "node", "head"]
    stopped = []
    if "jobs" in roles:
        for job in state.jobs():
            if job.get("status") == "RUNNING" and _stop_job(job):
                job["status"] = "STOPPED"
                job["message"] = "stopped by ddlf down"
                state.write_job(job)
                stopped.append(f"job {job['job_id']}")
    wanted = [r for r in ("node", "head") if r in roles]
    recs = {role: state.read(role) for role in wanted}
    running = _stop_recs([r for r in recs.values() if r])
    for rec in running:
        stopped.append(f"{rec['role']} (pid {rec['pid']})")
    # Recorded but already gone: it died, or (in ddlf down) the head, stopping at the same
    # moment on its own host, had just told it to stop.
    gone = [f"{role} (pid {rec['pid']})" for role, rec in recs.items()
            if rec and rec.get("pid") and rec not in running]
    for role, rec in recs.items():
        state.forget(role)
        if role == "node":
            _remove(state.token_path)
        elif rec and rec.get("token_file"):
            # A head stopped by SIGKILL could not remove its own token file.
            _remove(rec["token_file"])
            try:
                os.rmdir(os.path.dirname(rec["token_file"]))
            except OSError:
                pass
    return {"stopped": stopped, "gone": gone}


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
