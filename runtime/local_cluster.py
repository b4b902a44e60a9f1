"""The embedded cluster behind ``ddlf.init()``: a head and one node as child processes.

It runs exactly what ``ddlf-node start --head`` runs on a real host, so the embedded
default exercises the same code path as a multi-host cluster. Both children hold a
pipe to the driver on stdin and stop when it closes, so a driver that dies (even by
SIGKILL) takes its cluster with it.
"""

from __future__ import annotations

import json
import subprocess

from .process import TOKEN_ENV, child_env, start_child, stop_children
from .wire import tls
from .wire.auth import read_token_file

__all__ = ["LocalCluster"]

# Older names of start_child and child_env, still imported by scripts and tests.
_start = start_child
_child_env = child_env


class LocalCluster:
    def __init__(self, num_cpus: float | None = None, token: str | None = None,
                 resources: dict | None = None, num_gpus: float | None = None,
                 memory: float | None = None, dashboard_port: int = 0):
        """``dashboard_port`` > 0 serves the web dashboard on 127.0.0.1 at that port, or at
        any free one if it is taken (``self.dashboard_url`` says where); 0: none."""
        self.procs: list[subprocess.Popen] = []
        # DDLF_TLS_* turn on TLS for the embedded cluster too. Checked here, so a bad path
        # raises in the driver naming the variable, and passed on as absolute paths.
        tls_env = tls.to_env(tls.check())
        head_args = ["ddlf_actors.runtime.head", "--port", "0", "--stdin-lifeline"]
        if dashboard_port:
            head_args += ["--dashboard-port", str(int(dashboard_port)), "--dashboard-port-fallback"]
        # The token goes through the environment, never the command line: every local
        # user can read /proc/<pid>/cmdline. The node reads the head's 0600 token file.
        head, info = start_child(head_args, "head",
                                 env={**tls_env, **({TOKEN_ENV: token} if token else {})})
        self.procs.append(head)
        self.address = info["address"]
        self.dashboard_url = info.get("dashboard_url")
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
            node, _ = start_child(node_args, "node", env=tls_env)
        except Exception:
            self.stop()
            raise
        self.procs.append(node)

    def stop(self, timeout: float = 10.0) -> None:
        """Close the children's lifelines and wait; kill whatever is still there."""
        # The node first: it stops its workers before the head goes.
        stop_children(reversed(self.procs), timeout)
        self.procs = []
