"""Running a node daemon: ``python -m ddlf_actors.runtime.node`` (what ``ddlf-node start``
and ``ddlf.init()`` start)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from .. import config, process
from ..errors import DDLFError
from ..wire import rpc
from ..wire.eventloop import new_event_loop
from .daemon import NodeDaemon

__all__ = ["run_node", "main"]


def run_node(head_address: str, token: str, *, host: str, num_cpus, resources, node_id=None,
             stdin_lifeline: bool = False, ready_out=None, num_gpus=None, memory=None) -> None:
    """Run a node daemon in this process until it is stopped."""
    config.raise_open_file_limit()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        node = NodeDaemon(loop, head_address, token, host=host, num_cpus=num_cpus,
                          resources=resources, node_id=node_id, num_gpus=num_gpus, memory=memory)
    except DDLFError as e:
        print(f"ddlf node: {e}", file=sys.stderr)
        sys.exit(2)

    def stop(*_):
        node.background.spawn(node.shutdown())

    process.stop_on_signals(loop, stop, stdin_lifeline)
    try:
        loop.run_until_complete(node.start())
    except (DDLFError, OSError) as e:
        msg = str(e)
        if isinstance(e, rpc.RemoteRpcError) or not msg:
            msg = f"{type(e).__name__}: {e}"
        print(f"ddlf node: could not join the head at {head_address}: {msg}", file=sys.stderr)
        loop.run_until_complete(node.shutdown())
        sys.exit(1)
    if ready_out is not None:
        process.announce_ready(ready_out, {"node_id": node.node_id, "address": node.address,
                                           "pid": os.getpid()})
    loop.run_until_complete(node.stopped)
    loop.run_until_complete(asyncio.sleep(0.05))


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ddlf_actors.runtime.node")
    p.add_argument("--address", required=True, help="head host:port")
    p.add_argument("--token", help="deprecated: visible in the process list; set "
                                    "DDLF_AUTH_TOKEN in the environment or use --token-file")
    p.add_argument("--token-file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--num-cpus", type=float)
    p.add_argument("--resources", default="{}")
    p.add_argument("--num-gpus", type=float)
    p.add_argument("--memory", type=float, help="bytes of memory to offer (default: all)")
    p.add_argument("--node-id")
    p.add_argument("--stdin-lifeline", action="store_true")
    a = p.parse_args(argv)
    if a.token:
        print("ddlf node: warning: --token is visible to every local user in the process list; "
              "pass the token in DDLF_AUTH_TOKEN or with --token-file instead", file=sys.stderr)
    token = process.resolve_token(a.token, a.token_file)
    if not token:
        p.error("no token: pass --token, --token-file or set DDLF_AUTH_TOKEN")
    run_node(a.address, token, host=a.host, num_cpus=a.num_cpus, resources=json.loads(a.resources),
             node_id=a.node_id, stdin_lifeline=a.stdin_lifeline, ready_out=sys.stdout,
             num_gpus=a.num_gpus, memory=a.memory)
