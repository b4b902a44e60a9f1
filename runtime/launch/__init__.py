"""Starting a cluster on several machines over SSH, and running jobs on it (``ddlf``).

==============  ===========================================================================
module          holds
==============  ===========================================================================
cluster_file    the cluster file: ``ClusterSpec``, its hosts, and its checks
ssh             ``SSHTransport``: OpenSSH's client as a subprocess; one-line failures
remote          the agent's command line, request and answer (the token rides on stdin)
lifecycle       ``up``, ``down``, ``status``, ``connect_info``, run from the user's machine
jobs            ``submit`` and ``logs``, run from the user's machine
cli             the ``ddlf`` command
agent           what runs on each host: ``python -m ddlf_actors.runtime.launch.agent``
host_procs      the agent's starts and stops of the head and the node
job_runner      the agent's side of a job: unpack, run, stream, stop on Ctrl-C
records         what ``up`` started on a host (pid + start time), in the session folder
==============  ===========================================================================

Nothing here imports ``ddlf_actors``' API or ``apps``; YAML is read only by ``cluster_file``.
"""

from __future__ import annotations

from .cluster_file import ClusterFileError, ClusterSpec, HostSpec, from_hosts, load
from .lifecycle import connect_info, down, status, up
from .ssh import HostError, SSHTransport

__all__ = ["ClusterFileError", "ClusterSpec", "HostSpec", "HostError", "SSHTransport", "load",
           "from_hosts", "up", "down", "status", "connect_info", "connect"]


def connect(path: str) -> dict:
    """The running cluster of the cluster file ``path``: ``{"address", "token",
    "dashboard_url"}``, asked of its head host over SSH. ``ClusterFileError`` for a bad
    file, ``HostError`` when the head host cannot be reached or the cluster is not up."""
    spec = load(path)
    with SSHTransport() as transport:
        return connect_info(spec, transport)
