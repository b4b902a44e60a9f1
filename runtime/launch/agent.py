"""The agent ``ddlf`` runs on each host over SSH: ``python -m ddlf_actors.runtime.launch.agent``.

It reads one JSON request on stdin (see :mod:`remote`), does it, and prints one answer
line, ``DDLF_AGENT {"ok": ...}``, on stdout. Its verbs:

=========  ==========================================================================
probe      versions, and what of the cluster runs here (+ the token, on the head host)
start      start the head and/or the node if not running (``host_procs.start``)
stop       stop what up started here (``host_procs.stop``)
status     what runs here; on the head host also the head's node table
connect    the head's address and token (``ddlf.init("cluster.yaml")``)
logs       a job's output, the node's or the head's log, or the list of jobs
job        run a job's driver here, streaming its output (``job_runner``)
=========  ==========================================================================

Errors are answers too (``{"ok": false, "error": "one line"}``), so the driver can name
the host and the cause; the agent never prints the token anywhere but in an answer.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ..errors import DDLFError
from . import host_procs
from .job_runner import report, run_job
from .records import HostState, alive
from .remote import ANSWER_PREFIX, version_problem

__all__ = ["main", "handle"]

_MAX_REQUEST = 1 << 20


def _answer(payload: dict) -> None:
    sys.stdout.write(ANSWER_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _read_request(fd: int = 0) -> dict:
    """One line of JSON from ``fd``, read byte by byte so that a job's files that follow
    it stay unread for :func:`job_runner.run_job`."""
    buf = bytearray()
    while len(buf) < _MAX_REQUEST:
        b = os.read(fd, 1)
        if not b or b == b"\n":
            break
        buf += b
    return json.loads(buf.decode())


def _head_nodes(state: HostState, timeout: float = 10.0) -> list:
    """The head's node table (from the head running here)."""
    from ..client.core import Core

    head = state.running("head")
    if head is None:
        raise DDLFError("the head is not running here")
    token = host_procs.head_token(state)
    core = Core(head["address"], token or "", is_driver=False)
    try:
        core.connect(timeout=timeout)
        return core.head_call("nodes")
    finally:
        core.close()


def _wait_nodes(state: HostState, node_ids: list, timeout: float) -> dict:
    """Poll the head until every node in ``node_ids`` is registered and alive."""
    deadline = time.monotonic() + timeout
    nodes: list = []
    while True:
        nodes = _head_nodes(state)
        alive_ids = {n["node_id"] for n in nodes if n["alive"]}
        missing = [i for i in node_ids if i not in alive_ids]
        if not missing or time.monotonic() > deadline:
            return {"nodes": nodes, "missing": missing}
        time.sleep(0.2)


def _logs(state: HostState, req: dict) -> dict:
    what, tail = req.get("what"), int(req.get("tail") or 0)
    if what == "jobs":
        return {"jobs": state.jobs()}
    if what == "job":
        path = os.path.join(state.job_dir(req["job_id"]), "output.log")
        if not os.path.exists(path):
            known = ", ".join(j["job_id"] for j in state.jobs()[-5:]) or "none yet"
            raise DDLFError(f"no job {req['job_id']} on this cluster (the latest: {known})")
    elif what in ("node", "head"):
        path = state.log_path(what)
        if not os.path.exists(path):
            raise DDLFError(f"no {what} log here: ddlf up has not started a {what} on this host")
    else:
        raise DDLFError(f"unknown log {what!r}")
    with open(path, "rb") as f:
        text = f.read().decode(errors="replace")
    if tail:
        text = "\n".join(text.splitlines()[-tail:]) + "\n"
    return {"text": text, "path": path}


def handle(req: dict) -> dict:
    """Do ``req`` (every verb but ``job``); the answer's fields."""
    state = HostState(req["cluster"])
    verb = req["verb"]
    if verb == "status":   # it asks the head: over TLS if the cluster speaks it
        os.environ.update(host_procs.tls_env(req))
    if verb == "probe":
        return host_procs.probe(state, want_token=bool(req.get("want_token")))
    if verb == "start":
        problem = version_problem(host_procs.probe(state)["versions"], req["versions"])
        if problem:
            raise DDLFError(problem)
        return host_procs.start(state, req)
    if verb == "stop":
        return host_procs.stop(state, req.get("only"))
    if verb == "status":
        out = host_procs.probe(state)
        running_jobs = [j for j in state.jobs() if j.get("status") == "RUNNING"]
        for j in running_jobs:   # a job whose agent died with it (host reboot, SIGKILL)
            if not alive(j, marker=""):
                j["status"] = "LOST"
        out["jobs"] = running_jobs
        if req.get("wait_nodes") is not None:
            out.update(_wait_nodes(state, req["wait_nodes"], float(req.get("timeout", 60))))
        elif out["head"]["running"]:
            out["nodes"] = _head_nodes(state)
        return out
    if verb == "connect":
        head = state.running("head")
        if head is None:
            raise DDLFError(f"cluster {state.cluster!r} is not running here: run `ddlf up`")
        return {"address": head["address"], "token": host_procs.head_token(state),
                "dashboard_url": head.get("dashboard_url")}
    if verb == "logs":
        return _logs(state, req)
    raise DDLFError(f"unknown request {verb!r}")


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    text = msg[0] if msg else type(e).__name__
    if len(msg) > 1:   # a start failure: the process's own last words, kept short
        text += " | " + " | ".join(m.strip() for m in msg[-3:] if m.strip())
    return text


def main() -> int:
    req: dict = {}
    try:
        req = _read_request()
        if req.get("verb") == "job":   # its driver joins the cluster: TLS as the cluster
            os.environ.update(host_procs.tls_env(req))
            return run_job(HostState(req["cluster"]), req)
        result = handle(req)
    except (DDLFError, OSError, ValueError, KeyError) as e:
        if req.get("verb") == "job":   # its stdout is the job's output: report on stderr
            report(event="error", message=_one_line(e))
        else:
            _answer({"ok": False, "error": _one_line(e)})
        return 1
    _answer({"ok": True, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
