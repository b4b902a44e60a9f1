"""``ddlf-node``: start a head or join a node on this host; stop them; show cluster status.

    ddlf-node start --head [--host IP] [--port P] [--dashboard-port P] [--dashboard-host IP] [--num-cpus N] [--num-gpus N] [--memory BYTES] [--resources JSON] [--token-file F] [TLS] [--block]
    ddlf-node start --address HEAD_IP:PORT [--host IP] [--num-cpus N] [--num-gpus N] [--memory BYTES] [--resources JSON] [--token-file F] [TLS] [--block]
    ddlf-node stop
    ddlf-node status [--address A] [--token-file F] [TLS]

    TLS: --tls-cert CERT.pem --tls-key KEY.pem --tls-ca CA.pem (or DDLF_TLS_CERT/_KEY/_CA)

The token comes from ``--token-file``, the ``DDLF_AUTH_TOKEN`` environment variable, or
(on the head's host) the head's own token file. It reaches the head and node processes
through their environment, never their command line: ``/proc/<pid>/cmdline`` is
readable by every local user. ``--token`` still works but warns for that reason.

With TLS, every connection of the cluster is mutual TLS (:mod:`tls`). The three paths
reach the head and node (and through the node's environment, its workers) as
``DDLF_TLS_*`` variables, never as arguments.

Every process started here is recorded (pid and command) under the per-user session
folder, so ``stop`` ends exactly those processes and nothing else.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from . import config
from .errors import DDLFError, TLSConfigError
from .process import TOKEN_ENV, start_child, start_daemon, stop_children
from .session import _is_ours, _logs_dir, _procs_dir, find_token, head_record
from .wire import tls
from .wire.auth import read_token_file

__all__ = ["main", "format_status"]


def _record(proc: subprocess.Popen, role: str, info: dict) -> None:
    rec = {"pid": proc.pid, "role": role, "started": time.time(), **info}
    with open(os.path.join(_procs_dir(), f"{proc.pid}.json"), "w") as f:
        json.dump(rec, f)


def _spawn(args: list, what: str, block: bool, log_name: str, env: dict | None = None):
    if block:
        # In the foreground the children hold a pipe from us: if this process dies
        # by any signal, even SIGKILL, the pipe closes and they stop too.
        return start_child([*args, "--stdin-lifeline"], what, stdin=subprocess.PIPE,
                           stderr=None, new_session=False, env=env)
    return start_daemon(args, what, os.path.join(_logs_dir(), log_name), env=env)


def _explicit_token(a) -> str | None:
    """The token given on our own command line (--token-file, or the deprecated --token)."""
    if getattr(a, "token", None):
        print("ddlf-node: warning: --token is visible to every local user in the process "
              "list; use --token-file FILE or the DDLF_AUTH_TOKEN environment variable",
              file=sys.stderr)
        return a.token
    if getattr(a, "token_file", None):
        token = read_token_file(a.token_file)
        if not token:
            raise DDLFError(f"the token file {a.token_file} is empty")
        return token
    return None


def _tls_env(a) -> dict:
    """``DDLF_TLS_*`` for our children, from the flags or else our own environment, checked
    here so a bad file fails before anything starts, naming the flag or variable."""
    files = tls.files_from_args(a.tls_cert, a.tls_key, a.tls_ca) or tls.files_from_env()
    return tls.to_env(tls.check(files))


def cmd_start(a) -> int:
    resources = a.resources or "{}"
    try:
        json.loads(resources)
    except ValueError as e:
        print(f"--resources must be JSON, e.g. '{{\"disk\": 1}}': {e}", file=sys.stderr)
        return 2
    try:
        explicit = _explicit_token(a)
    except (OSError, DDLFError) as e:
        print(f"ddlf-node: cannot read the token: {e}", file=sys.stderr)
        return 2
    try:
        tls_env = _tls_env(a)
    except TLSConfigError as e:
        print(f"ddlf-node: {e}", file=sys.stderr)
        return 2
    try:
        dashboard_args, dashboard_note = _dashboard_args(a)
    except ValueError as e:
        print(f"ddlf-node: {e}", file=sys.stderr)
        return 2
    procs = []
    try:
        if a.head:
            head_args = ["ddlf_actors.runtime.head", "--host", a.host, "--port", str(a.port),
                         *dashboard_args]
            # Through the environment: a command line is world-readable in /proc.
            head_env = {**tls_env, **({TOKEN_ENV: explicit} if explicit else {})}
            head, info = _spawn(head_args, "head", a.block, "head.log", env=head_env)
            procs.append(head)
            _record(head, "head", info)
            address, token_file = info["address"], info["token_file"]
            with open(os.path.join(config.session_root(), "head.json"), "w") as f:
                json.dump({"address": address, "token_file": token_file, "pid": head.pid}, f)
            node_auth = ["--token-file", token_file]
        else:
            if not a.address:
                print("give --head to start a head, or --address HEAD_IP:PORT to join one",
                      file=sys.stderr)
                return 2
            address, token_file = a.address, None
            token = find_token(address, explicit)
            if not token:
                print(f"no token to join {address}: pass --token-file FILE (a copy of the head's "
                      "token file, which the head printed), or set DDLF_AUTH_TOKEN",
                      file=sys.stderr)
                return 2
            node_auth = []
        node_args = ["ddlf_actors.runtime.node", "--address", address, "--host", a.host,
                     "--resources", resources, *node_auth]
        if a.num_cpus is not None:
            node_args += ["--num-cpus", str(a.num_cpus)]
        if a.num_gpus is not None:
            node_args += ["--num-gpus", str(a.num_gpus)]
        if a.memory is not None:
            node_args += ["--memory", str(a.memory)]
        node_env = {**tls_env, **({} if a.head else {TOKEN_ENV: token})}
        node, ninfo = _spawn(node_args, "node", a.block, f"node-{os.getpid()}.log", env=node_env)
        procs.append(node)
        _record(node, "node", ninfo)
    except DDLFError as e:
        for p in procs:
            p.terminate()
        print(f"ddlf-node: {e}", file=sys.stderr)
        return 1
    if a.head:
        tls_args = " --tls-cert CERT --tls-key KEY --tls-ca CA" if tls_env else ""
        print(f"DDLF head started at {address}" + (" (mutual TLS)" if tls_env else ""))
        print(f"  token file: {token_file} (mode 0600)")
        if info.get("dashboard_url"):
            print(f"  dashboard: {info['dashboard_url']}")
        elif dashboard_note:
            print(f"  {dashboard_note}")
        print("  join other hosts with (copy the token file there first, e.g. with scp):")
        print(f"    ddlf-node start --address {address} --token-file {token_file}{tls_args}")
        print("  connect a driver with:")
        print(f"    ddlf.init(address=\"{address}\")   # on this host, or pass token=...")
        if tls_env:
            print(f"    (with {tls.ENV_CERT}, {tls.ENV_KEY} and {tls.ENV_CA} set in its environment)")
    else:
        print(f"DDLF node {ninfo['node_id']} joined {address} (listening on {ninfo['address']})")
    sys.stdout.flush()
    if not a.block:
        return 0
    return _block(procs)


def _block(procs) -> int:
    """Foreground mode: Ctrl-C or SIGTERM stops our children (which stop their workers)."""
    stopping = []

    def stop(*_):
        stopping.append(True)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while all(p.poll() is None for p in procs) and not stopping:
        time.sleep(0.2)
    stop()
    stop_children(procs, 15)
    for p in procs:
        _forget(p.pid)
    return 0


def _forget(pid: int) -> None:
    try:
        os.unlink(os.path.join(_procs_dir(), f"{pid}.json"))
    except OSError:
        pass


def cmd_stop(a) -> int:
    recs = []
    for path in glob.glob(os.path.join(_procs_dir(), "*.json")):
        try:
            with open(path) as f:
                recs.append(json.load(f))
        except (OSError, ValueError):
            pass
    # Nodes first, so their workers are stopped by their own daemon, then the head.
    recs.sort(key=lambda r: r.get("role") == "head")
    alive = []
    for r in recs:
        if _is_ours(r["pid"]):
            os.kill(r["pid"], signal.SIGTERM)
            alive.append(r)
        else:
            _forget(r["pid"])
    deadline = time.time() + 15
    for r in alive:
        try:
            psutil.Process(r["pid"]).wait(max(0.1, deadline - time.time()))
        except psutil.TimeoutExpired:
            os.kill(r["pid"], signal.SIGKILL)
        except psutil.Error:
            pass
        _forget(r["pid"])
    try:
        os.unlink(os.path.join(config.session_root(), "head.json"))
    except OSError:
        pass
    print(f"stopped {len(alive)} DDLF process(es)" if alive else "no DDLF processes to stop")
    return 0


def cmd_status(a) -> int:
    from .client.core import Core

    address = a.address
    if address in (None, "auto"):
        rec = head_record()
        if rec is None:
            print("no head started on this host; pass --address HEAD_IP:PORT", file=sys.stderr)
            return 1
        address = rec["address"]
    try:
        token = find_token(address, _explicit_token(a))
    except (OSError, DDLFError) as e:
        print(f"ddlf-node: cannot read the token: {e}", file=sys.stderr)
        return 2
    try:
        os.environ.update(_tls_env(a))  # connect() reads DDLF_TLS_* in this process
    except TLSConfigError as e:
        print(f"ddlf-node: {e}", file=sys.stderr)
        return 2
    core = Core(address, token or "", is_driver=False)
    try:
        core.connect(timeout=10)
        nodes = core.head_call("nodes")
        actors = core.head_call("list_actors")
        dashboard_url = core.head_call("dashboard_url")
    except Exception as e:
        print(f"ddlf-node status: could not query {address}: {e}", file=sys.stderr)
        return 1
    finally:
        core.close()
    print(format_status(address, nodes, actors))
    if dashboard_url:
        print(f"\nDashboard: {dashboard_url}")
    return 0


def format_status(address: str, nodes: list, actors: list) -> str:
    lines = [f"DDLF cluster at {address}", "", "Nodes:"]
    rows: list[tuple[str, ...]] = [("NODE ID", "ADDRESS", "ALIVE", "CPU used/total", "RESOURCES", "HEARTBEAT AGE")]
    for n in nodes:
        tot, av = n["resources"], n["available"]
        extra = {k: v for k, v in tot.items() if k != "CPU" and not k.startswith("node:")}
        cpu = f"{tot.get('CPU', 0) - av.get('CPU', 0):g}/{tot.get('CPU', 0):g}"
        rows.append((n["node_id"], n["address"], "yes" if n["alive"] else "NO", cpu,
                     json.dumps(extra) if extra else "-", f"{n['heartbeat_age_s']:.1f}s"))
    lines += _table(rows)
    lines += ["", "Actors:"]
    rows = [("NAME", "CLASS", "NODE", "PID", "STATE")]
    for ac in actors:
        rows.append((ac.get("name") or "-", ac["class_name"], ac.get("node_id") or "-",
                     str(ac.get("pid") or "-"), ac["state"]))
    lines += _table(rows) if len(rows) > 1 else ["  (none)"]
    return "\n".join(lines)


def _table(rows) -> list:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _tls_flags(p) -> None:
    p.add_argument("--tls-cert", metavar="PEM", help="this host's certificate, signed by the "
                   "cluster CA: turns on mutual TLS (with --tls-key and --tls-ca; default "
                   f"{tls.ENV_CERT})")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's unencrypted private key "
                   f"(default {tls.ENV_KEY})")
    p.add_argument("--tls-ca", metavar="PEM", help="the cluster CA's certificate; peers must "
                   f"present a certificate it signed (default {tls.ENV_CA})")


def _dashboard_args(a) -> tuple[list, str | None]:
    """The head's dashboard flags from ``--dashboard-port``/``--dashboard-host`` (see
    ``head.dashboard.head_args``); ``ValueError`` for a port that cannot be had."""
    from .head.dashboard import head_args

    if not a.head:
        if a.dashboard_port:
            raise ValueError("--dashboard-port goes with --head: the head serves the dashboard")
        return [], None
    return head_args(a.dashboard_port, a.dashboard_host)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ddlf-node", description="Run DDLF on this host.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start a head (--head) or join a node (--address)")
    s.add_argument("--head", action="store_true", help="start the head plus a node on this host")
    s.add_argument("--address", help="the head's HOST:PORT to join")
    s.add_argument("--host", default="127.0.0.1",
                   help="IP to bind and advertise (default 127.0.0.1: loopback only)")
    s.add_argument("--port", type=int, default=6380, help="head port (default 6380; 0 = any)")
    s.add_argument("--num-cpus", type=float)
    s.add_argument("--num-gpus", type=int, help="GPUs to offer (default: the entries of "
                   "CUDA_VISIBLE_DEVICES, else what `nvidia-smi -L` lists)")
    s.add_argument("--memory", type=int, help="bytes of memory to offer to tasks and actors "
                   "that ask for memory= (default: all of it; not enforced)")
    s.add_argument("--resources", help='custom resources as JSON, e.g. \'{"disk": 1}\'')
    s.add_argument("--token-file", help="file holding the cluster token (default: "
                   "DDLF_AUTH_TOKEN, else the head generates one / the head's file on this host)")
    s.add_argument("--token", help="deprecated: visible to every local user in the process "
                   "list; use --token-file or DDLF_AUTH_TOKEN")
    s.add_argument("--dashboard-port", type=int, help="port of the head's web dashboard (default "
                   "8265, or any free port if taken, when aiohttp is installed; 0 = none)")
    s.add_argument("--dashboard-host", default="127.0.0.1", help="IP the dashboard binds (default "
                   "127.0.0.1; anywhere else every request needs the cluster token)")
    _tls_flags(s)
    s.add_argument("--block", action="store_true", help="stay in the foreground")
    sub.add_parser("stop", help="stop the DDLF processes this user started on this host")
    st = sub.add_parser("status", help="print nodes and actors")
    st.add_argument("--address", default="auto")
    st.add_argument("--token-file", help="file holding the cluster token")
    st.add_argument("--token", help="deprecated: visible in the process list")
    _tls_flags(st)
    a = p.parse_args(argv)
    handler = {"start": cmd_start, "stop": cmd_stop, "status": cmd_status}[a.cmd]
    try:
        return handler(a)
    except DDLFError as e:  # e.g. a session folder that belongs to someone else
        print(f"ddlf-node: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

