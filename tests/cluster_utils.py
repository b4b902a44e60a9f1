"""Multi-node clusters for tests: a head and N nodes as child processes on 127.0.0.1.

They run what ``ddlf-node start`` runs, hold a stdin lifeline to the test process, and
stay its descendants, so the leak check in conftest sees every one of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

from ddlf_actors.runtime.process import start_child as _start
from ddlf_actors.runtime.process import stop_children
from ddlf_actors.runtime.wire.auth import read_token_file


class MultiNodeCluster:
    def __init__(self, node_cpus=(1, 1), node_resources=None, head_env=None, host="127.0.0.1"):
        self.host = host
        self.nodes: list[dict] = []
        old = dict(os.environ)
        os.environ.update(head_env or {})
        try:
            self.head, info = _start(["ddlf_actors.runtime.head", "--host", host, "--port", "0",
                                      "--stdin-lifeline"], "head", new_session=False)
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.address = info["address"]
        self.token_file = info["token_file"]
        self.token = read_token_file(self.token_file)
        resources = node_resources or [None] * len(node_cpus)
        for cpus, res in zip(node_cpus, resources):
            self.add_node(cpus, res)

    def add_node(self, num_cpus=1, resources=None) -> dict:
        args = ["ddlf_actors.runtime.node", "--address", self.address, "--host", self.host,
                "--token-file", self.token_file, "--num-cpus", str(num_cpus), "--stdin-lifeline"]
        if resources:
            args += ["--resources", json.dumps(resources)]
        proc, info = _start(args, "node", new_session=False)
        node = {"proc": proc, **info}
        self.nodes.append(node)
        return node

    def kill_node(self, index: int, sig=signal.SIGKILL) -> None:
        """Fault injection: signal a node daemon (not its workers)."""
        os.kill(self.nodes[index]["proc"].pid, sig)

    def stop(self) -> None:
        stop_children([n["proc"] for n in self.nodes] + [self.head], 15)


@contextlib.contextmanager
def joined(cluster: MultiNodeCluster):
    """This driver joined to ``cluster`` for the block; then shut down and the cluster
    stopped, whatever happens."""
    import ddlf_actors as ddlf

    try:
        ddlf.init(address=cluster.address, token=cluster.token)
        yield cluster
    finally:
        ddlf.shutdown()
        cluster.stop()
