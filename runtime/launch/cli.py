"""``ddlf``: start a cluster on several machines over SSH, run jobs on it, stop it.

    ddlf up [cluster.yaml | --hosts a,b,c] [--all-or-nothing]
    ddlf status [cluster.yaml | --hosts a,b,c]
    ddlf down [cluster.yaml | --hosts a,b,c]
    ddlf submit [--cluster cluster.yaml] [--working-dir DIR] [--exclude GLOB] script.py [args...]
    ddlf logs [--cluster cluster.yaml] [JOB_ID | --node HOST | --head] [--tail N]

Without a file or ``--hosts``, the file is ``$DDLF_CLUSTER``, else ``./cluster.yaml``.
See docs/deploy.md for the cluster file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..errors import DDLFError
from . import cluster_file, jobs, lifecycle
from .cluster_file import ClusterFileError, ClusterSpec
from .ssh import HostError, SSHTransport

__all__ = ["main", "resolve_spec", "format_status"]


def resolve_spec(path: str | None, hosts: str | None) -> tuple[ClusterSpec, str]:
    """The cluster from a file or ``--hosts``, and how to name it again in a command
    (``cluster.yaml`` or ``--hosts a,b``)."""
    if path and hosts:
        raise ClusterFileError("give a cluster file or --hosts, not both")
    if hosts:
        return cluster_file.from_hosts(hosts), f"--hosts {hosts}"
    path = path or os.environ.get("DDLF_CLUSTER") or "cluster.yaml"
    if not os.path.exists(path):
        raise ClusterFileError(f"no cluster file {path}: give one (ddlf up cluster.yaml), "
                               "set DDLF_CLUSTER, or list hosts with --hosts a,b,c (the head "
                               "first); docs/deploy.md has a full example")
    return cluster_file.load(path), path


def _say(line: str) -> None:
    print(line, flush=True)


def _dashboard_line(spec: ClusterSpec, url: str | None) -> str | None:
    if not url:
        return None
    if "//127.0.0.1:" in url or "//localhost:" in url:
        port = url.rsplit(":", 1)[-1].strip("/")
        return (f"{url} on {spec.head.host}; from here: ssh -N -L {port}:127.0.0.1:{port} "
                f"{spec.head.host}, then http://127.0.0.1:{port}")
    return url


def cmd_up(a) -> int:
    spec, name = resolve_spec(a.cluster, a.hosts)
    print(f"ddlf up: cluster {spec.name!r}, {len(spec.hosts)} host(s), head {spec.head.host}",
          flush=True)
    with SSHTransport() as transport:
        r = lifecycle.up(spec, transport, all_or_nothing=a.all_or_nothing, say=_say)
    failed = [o for o in r.outcomes if o.state == "failed"]
    if r.head_address is None:
        print(f"ddlf up: nothing started: {len(failed)} host(s) failed, named above "
              f"({r.seconds:.1f} s)", file=sys.stderr)
        return 1
    alive = [n for n in r.nodes if n.get("alive")]
    cpus = sum(n["resources"].get("CPU", 0) for n in alive)
    gpus = sum(n["resources"].get("GPU", 0) for n in alive)
    hosts_up = len(spec.hosts) - len(r.failed)
    print(f"\nCluster {spec.name!r} is up on {hosts_up} of {len(spec.hosts)} hosts: "
          f"{len(alive)} nodes registered, {cpus:g} CPUs" + (f", {gpus:g} GPUs" if gpus else "")
          + f" ({r.seconds:.1f} s)")
    print(f"  head:      {r.head_address}")
    dash = _dashboard_line(spec, r.dashboard_url)
    if dash:
        print(f"  dashboard: {dash}")
    elif r.dashboard_note:
        print(f"  dashboard: {r.dashboard_note}")
    flag = f"--cluster {name}" if not name.startswith("--") else name
    print(f"  run a job: ddlf submit {flag} script.py [args]")
    print(f"  connect:   ddlf.init(address=\"{name}\")   # a driver on this machine"
          if not name.startswith("--") else
          f"  connect:   ddlf.init(address=\"{r.head_address}\")   # on {spec.head.host}")
    print(f"  status:    ddlf status {name}      stop: ddlf down {name}")
    if failed:
        print(f"ddlf up: {len(failed)} host(s) failed, named above: "
              f"{', '.join(o.host for o in failed)}", file=sys.stderr)
    if r.unregistered:
        print(f"ddlf up: {len(r.unregistered)} node(s) did not register within "
              f"{spec.start_timeout:g} s: {', '.join(r.unregistered)} (see ddlf logs --node HOST)",
              file=sys.stderr)
    return 0 if r.ok else 1


def cmd_down(a) -> int:
    spec, _ = resolve_spec(a.cluster, a.hosts)
    t0 = time.monotonic()
    print(f"ddlf down: cluster {spec.name!r}, {len(spec.hosts)} host(s)", flush=True)
    with SSHTransport() as transport:
        outcomes = lifecycle.down(spec, transport, say=_say)
    failed = [o for o in outcomes if o.state == "failed"]
    print(f"ddlf down: done in {time.monotonic() - t0:.1f} s"
          + (f"; {len(failed)} host(s) could not be reached" if failed else ""))
    return 1 if failed else 0


def cmd_status(a) -> int:
    spec, name = resolve_spec(a.cluster, a.hosts)
    with SSHTransport() as transport:
        answers = lifecycle.status(spec, transport)
    if a.json:
        print(json.dumps({h: (v if isinstance(v, dict) else {"error": str(v)})
                          for h, v in answers.items()}, indent=1, default=str))
    else:
        print(format_status(spec, answers))
    head = answers[spec.head.host]
    return 0 if isinstance(head, dict) and head["head"]["running"] else 1


def format_status(spec: ClusterSpec, answers: dict) -> str:
    """The table ``ddlf status`` prints, from each host's status answer (or HostError)."""
    head = answers[spec.head.host]
    lines = []
    if isinstance(head, dict) and head["head"]["running"]:
        lines.append(f"Cluster {spec.name!r}: head at {head['head']['address']} on "
                     f"{spec.head.host}")
        dash = _dashboard_line(spec, head["head"].get("dashboard_url"))
        if dash:
            lines.append(f"Dashboard: {dash}")
    else:
        lines.append(f"Cluster {spec.name!r}: the head is NOT RUNNING on {spec.head.host}")
    table = {n["node_id"]: n for n in (head.get("nodes") or [])} if isinstance(head, dict) else {}
    rows = [("HOST", "ROLE", "STATE", "PID", "NODE ID", "ADDRESS", "CPU used/total", "GPU",
             "OTHER")]
    missing = []
    for h in spec.hosts:
        ans = answers[h.host]
        role = "head+node" if h is spec.head else "node"
        if isinstance(ans, HostError):
            rows.append((h.host, role, "UNREACHABLE", "-", "-", "-", "-", "-", "-"))
            missing.append(f"{h.host}: {ans.cause}")
            continue
        node = ans["node"]
        n = table.get(node.get("node_id")) if node.get("running") else None
        if node.get("running") and n and n["alive"]:
            tot, av = n["resources"], n["available"]
            extra = {k: v for k, v in tot.items() if k not in ("CPU", "GPU", "memory")
                     and not k.startswith("node:")}
            rows.append((h.host, role, "running", str(node["pid"]), node["node_id"],
                         node["address"], f"{tot.get('CPU', 0) - av.get('CPU', 0):g}/"
                         f"{tot.get('CPU', 0):g}",
                         f"{tot['GPU']:g}" if tot.get("GPU") else "-",
                         json.dumps(extra) if extra else "-"))
            continue
        state = "NOT RUNNING"
        if node.get("running"):
            why = "its process runs but the head does not list it as alive"
            state = "NOT REGISTERED"
        elif node.get("started"):
            why = f"the node (pid {node['pid']}) died; `ddlf up` starts it again"
            state = "DIED"
        else:
            why = "never started here; `ddlf up` starts it"
        rows.append((h.host, role, state, "-", node.get("node_id") or "-", "-", "-", "-", "-"))
        missing.append(f"{h.host}: {why}")
        if h is spec.head and not ans["head"]["running"]:
            missing.append(f"{h.host}: the head is not running; `ddlf up` starts it (and "
                           "restarts every node, which must join the new head)")
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines += [""] + ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in rows]
    if missing:
        lines += ["", "Not running:"] + [f"  {m}" for m in missing]
    jobs_running = head.get("jobs", []) if isinstance(head, dict) else []
    if jobs_running:
        lines += ["", "Jobs:"] + [f"  {j['job_id']}  {j['status']}  {j['script']} "
                                  f"{' '.join(j.get('args', []))}".rstrip() for j in jobs_running]
    return "\n".join(lines)


def cmd_submit(a) -> int:
    spec, _ = resolve_spec(a.cluster, a.hosts)
    with SSHTransport() as transport:
        r = jobs.submit(spec, transport, a.script, a.args, working_dir=a.working_dir,
                        excludes=a.exclude or ())
    if r.status == "SUCCEEDED":
        print(f"ddlf: job {r.job_id} succeeded", file=sys.stderr)
    else:
        print(f"ddlf: job {r.job_id} {r.status.lower()}"
              + (f": {r.message}" if r.message else ""), file=sys.stderr)
    return r.exit_code


def cmd_logs(a) -> int:
    spec, _ = resolve_spec(a.cluster, a.hosts)
    with SSHTransport() as transport:
        ans = jobs.logs(spec, transport, job_id=a.job_id, node_host=a.node, head=a.head,
                        tail=a.tail)
    if "jobs" in ans:
        if not ans["jobs"]:
            print(f"no jobs on cluster {spec.name!r} yet (ddlf submit script.py runs one)")
        for j in ans["jobs"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j["started"]))
            print(f"{j['job_id']}  {j['status']:<9}  {when}  {j['script']} "
                  f"{' '.join(j.get('args', []))}".rstrip())
        return 0
    sys.stdout.write(ans["text"])
    return 0


def _cluster_args(p, positional: bool) -> None:
    if positional:
        p.add_argument("cluster", nargs="?", metavar="CLUSTER_FILE",
                       help="the cluster file (default $DDLF_CLUSTER, else ./cluster.yaml)")
    else:
        p.add_argument("--cluster", metavar="FILE",
                       help="the cluster file (default $DDLF_CLUSTER, else ./cluster.yaml)")
    p.add_argument("--hosts", metavar="A,B,C",
                   help="the hosts instead of a file, the head first (every setting default)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddlf", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the head and a node on every host (only what is "
                                  "missing)")
    _cluster_args(u, True)
    u.add_argument("--all-or-nothing", action="store_true",
                   help="if any host fails, start none (and stop what this up started)")
    d = sub.add_parser("down", help="stop what ddlf up started, on every host")
    _cluster_args(d, True)
    s = sub.add_parser("status", help="hosts, nodes, resources, and what is not running")
    _cluster_args(s, True)
    s.add_argument("--json", action="store_true", help="every host's answer as JSON")
    j = sub.add_parser("submit", help="run a driver script on the head host, streaming its "
                                      "output")
    _cluster_args(j, False)
    j.add_argument("--working-dir", metavar="DIR",
                   help="the folder to upload (default: the script's); it must hold the script")
    j.add_argument("--exclude", action="append", metavar="GLOB",
                   help="leave these files out of the upload (repeatable; .git, __pycache__ "
                        "... always are)")
    j.add_argument("script")
    j.add_argument("args", nargs=argparse.REMAINDER)
    lg = sub.add_parser("logs", help="a job's output, a node's or the head's log; with no "
                                     "argument, the list of jobs")
    _cluster_args(lg, False)
    lg.add_argument("job_id", nargs="?")
    lg.add_argument("--node", metavar="HOST", help="the node log of this host")
    lg.add_argument("--head", action="store_true", help="the head's log")
    lg.add_argument("--tail", type=int, default=0, metavar="N", help="the last N lines only")
    return p


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    handler = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "submit": cmd_submit,
               "logs": cmd_logs}[a.cmd]
    try:
        return handler(a)
    except (ClusterFileError, HostError, DDLFError, ValueError) as e:
        print(f"ddlf {a.cmd}: {e}", file=sys.stderr)
        return 2 if isinstance(e, ClusterFileError) else 1
    except KeyboardInterrupt:
        print(f"ddlf {a.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
