"""The embedded cluster behind ``ddlf.init()``: a head and one node as child processes.

It runs exactly what ``ddlf-node start --head`` runs on a real host, so the embedded
default exercises the same code path as a multi-host cluster. Both children hold a
pipe to the driver on stdin and stop when it closes, so a driver that dies (even by
SIGKILL) takes its cluster with it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from . import tls
from .auth import read_token_file
from .errors import DDLFError

__all__ = ["LocalCluster"]

_START_TIMEOUT_S = 60.0


def _child_env() -> dict:
    env = dict(os.environ)
    # Children must import the same ddlf_actors as this driver, even from a source tree.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    here = os.path.dirname(os.path.abspath(__file__))
    roots = {pkg_parent, os.path.dirname(here)}
    extra = [r for r in roots if os.path.isfile(os.path.join(r, "pyproject.toml"))]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(extra + [env["PYTHONPATH"]] if env.get("PYTHONPATH") else extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _start(args: list, what: str, *, stdin=subprocess.PIPE, stderr=None,
           new_session: bool = True, prefix: list | None = None,
           env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    """Start ``python -m args`` and wait for its ``DDLF_READY {json}`` line.

    ``prefix`` goes before the interpreter, e.g. ``["ip", "netns", "exec", "h1"]``.
    """
    proc = subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", *args], stdin=stdin, stdout=subprocess.PIPE,
        stderr=stderr, env={**_child_env(), **(env or {})}, start_new_session=new_session,
    )
    deadline = time.monotonic() + _START_TIMEOUT_S
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.split(b"\n"):
                if line.startswith(b"DDLF_READY "):
                    return proc, json.loads(line[len(b"DDLF_READY "):])
        elif proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    where = "printed above" if stderr is None else "in its log file"
    raise DDLFError(f"the DDLF {what} failed to start (exit code {proc.returncode}); "
                    f"its error is {where}: {buf.decode(errors='replace').strip()[-500:]}")


class LocalCluster:
    def __init__(self, num_cpus: float | None = None, token: str | None = None,
                 resources: dict | None = None, num_gpus: float | None = None,
                 memory: float | None = None):
        self.procs: list[subprocess.Popen] = []
        # DDLF_TLS_* turn on TLS for the embedded cluster too. Checked here, so a bad path
        # raises in the driver naming the variable, and passed on as absolute paths.
        tls_env = tls.to_env(tls.check())
        head_args = ["ddlf_actors.runtime.head", "--port", "0", "--stdin-lifeline"]
        # The token goes through the environment, never the command line: every local
        # user can read /proc/<pid>/cmdline. The node reads the head's 0600 token file.
        head, info = _start(head_args, "head",
                            env={**tls_env, **({"DDLF_AUTH_TOKEN": token} if token else {})})
        self.procs.append(head)
        self.address = info["address"]
        self.token = token or read_token_file(info["token_file"])
        node_args = ["ddlf_actors.runtime.node", "--address", self.address, "--stdin-lifeline",
                     "--token-file", info["token_file"]]
        if num_cpus is not None:
            node_args += ["--num-cpus", str(num_cpus)]
        if resources:
            node_args += ["--resources", json.dumps(resources)]
        if num_gpus is not None:
            node_args += ["--num-gpus", str(num_gpus)]
        if memory is not None:
            node_args += ["--memory", str(memory)]
        try:
            node, _ = _start(node_args, "node", env=tls_env)
        except Exception:
            self.stop()
            raise
        self.procs.append(node)

    def stop(self, timeout: float = 10.0) -> None:
        """Close the children's lifelines and wait; kill whatever is still there."""
        for p in reversed(self.procs):
            try:
                p.stdin.close()
            except Exception:
                pass
        deadline = time.monotonic() + timeout
        for p in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        self.procs = []
