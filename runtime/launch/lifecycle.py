"""``ddlf up``, ``ddlf down`` and ``ddlf status``, run from the user's machine.

Up, in four steps, each over every host at once (one thread per host):

1. **Probe** each host: reachable? its DDLF and Python versions? what runs there already?
2. **The head host**: run its setup commands and start the head and its node, if missing.
   The head makes the token; it comes back in the agent's answer over SSH and stays in
   this process's memory.
3. **The other hosts**: setup, then start a node wherever none runs; the token goes on
   the agent's stdin.
4. **Wait** (bounded by ``start_timeout``) until the head lists every node as alive.

A host that fails gets one line naming it and the cause; the rest still come up, unless
``all_or_nothing``: then a failed probe starts nothing, and a failed start stops what
this ``up`` started. The agent on a host stops what it started there if its own start
fails, so nothing is left running on such a host.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .. import config, process
from .cluster_file import ClusterSpec, HostSpec
from .remote import call, request, version_problem
from .ssh import HostError

__all__ = ["HostOutcome", "UpResult", "up", "down", "status", "connect_info"]

# Seconds a probe or status call may take on top of ssh's own connect timeout.
_QUICK_S = 45.0


@dataclass
class HostOutcome:
    """What ``up`` (or ``down``) did on one host."""

    host: str
    roles: str                     # "head+node" or "node"
    state: str                     # "started", "running", "restarted", "failed", "skipped"
    detail: str = ""
    node: dict | None = None       # the node's record (pid, node_id, address)
    head: dict | None = None


@dataclass
class UpResult:
    spec: ClusterSpec
    outcomes: list = field(default_factory=list)
    head_address: str | None = None
    dashboard_url: str | None = None
    dashboard_note: str | None = None
    nodes: list = field(default_factory=list)       # the head's table at the end
    unregistered: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list:
        return [o for o in self.outcomes if o.state in ("failed", "skipped")]

    @property
    def ok(self) -> bool:
        return self.head_address is not None and not self.failed and not self.unregistered


def _roles(spec: ClusterSpec, host: HostSpec) -> list:
    return ["head", "node"] if host is spec.head else ["node"]


def _start_request(spec: ClusterSpec, host: HostSpec, roles: list) -> dict:
    return request(
        spec, "start", roles=roles, versions=process.versions(), address=host.address,
        port=spec.port, env=spec.env, num_cpus=host.num_cpus, num_gpus=host.num_gpus,
        memory=host.memory, resources=host.resources,
        dashboard={"port": spec.dashboard.port, "host": spec.dashboard.host}
        if spec.dashboard else None)


def _start_timeout(spec: ClusterSpec, host: HostSpec) -> float:
    setup = spec.setup_timeout if host.setup_commands else 0.0
    return host.ssh.connect_timeout + setup + 2 * config.START_TIMEOUT_S


def _parallel(fn, items) -> list:
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        return list(pool.map(fn, items))


def _probe(transport, spec: ClusterSpec, host: HostSpec):
    """The host's probe answer, or the HostError that says why there is none."""
    try:
        return call(transport, host, request(spec, "probe", want_token=host is spec.head),
                    timeout=host.ssh.connect_timeout + _QUICK_S)
    except HostError as e:
        return e


def _needs_start(spec: ClusterSpec, host: HostSpec, probe, head_epoch: str | None = None) -> bool:
    """True unless everything ``host`` should run is running (a node: joined to the head
    of ``head_epoch``; one left from an earlier head holds a token nobody accepts)."""
    if isinstance(probe, HostError):
        return True
    if any(not probe[r]["running"] for r in _roles(spec, host)):
        return True
    return head_epoch is not None and probe["node"].get("head_epoch") != head_epoch


def _probe_failure(spec: ClusterSpec, host: HostSpec, probe) -> str | None:
    """Why this host cannot be started, known from its probe alone (None: go on)."""
    if isinstance(probe, HostError):
        # No DDLF (or no Python) yet: its setup commands may install it.
        if probe.kind == "install" and host.setup_commands:
            return None
        return probe.cause
    problem = version_problem(probe["versions"], process.versions())
    if problem and not (host.setup_commands and _needs_start(spec, host, probe)):
        return problem
    return None


def up(spec: ClusterSpec, transport, *, all_or_nothing: bool = False, say=print) -> UpResult:
    """Bring ``spec``'s cluster up (only what is missing); see the module's docstring.
    ``say`` receives one line per host as it is done."""
    t0 = time.monotonic()
    result = UpResult(spec)
    probes = dict(zip([h.host for h in spec.hosts],
                      _parallel(lambda h: _probe(transport, spec, h), spec.hosts)))
    problems = {h.host: _probe_failure(spec, h, probes[h.host]) for h in spec.hosts}
    failed = {name: why for name, why in problems.items() if why}

    def fail(host: HostSpec, why: str, state: str = "failed"):
        out = HostOutcome(host.host, "+".join(_roles(spec, host)), state, why)
        result.outcomes.append(out)
        say(f"  {host.host}: {'FAILED' if state == 'failed' else 'not started'}: {why}")

    if spec.head.host in failed or (all_or_nothing and failed):
        for h in spec.hosts:
            if h.host in failed:
                fail(h, failed[h.host])
        why = ("the head host failed, so no node could join" if spec.head.host in failed
               else f"--all-or-nothing and {len(failed)} host(s) failed")
        for h in spec.hosts:
            if h.host not in failed:
                fail(h, why, "skipped")
        result.seconds = time.monotonic() - t0
        return result

    # The head host: head, then its node.
    head_probe = probes[spec.head.host]
    token = None
    started_here: dict = {}
    head_host = spec.head
    try:
        if _needs_start(spec, head_host, head_probe):
            ans = call(transport, head_host, _start_request(spec, head_host, ["head", "node"]),
                       setup=True, timeout=_start_timeout(spec, head_host))
            started_here[head_host.host] = ans["started"]
            head, node, token = ans["head"], ans["node"], ans["token"]
        else:
            head, node, token = head_probe["head"], head_probe["node"], head_probe.get("token")
            if not token:
                raise HostError(head_host.host, "the head runs but its token file is gone; "
                                "run `ddlf down` and `ddlf up` again")
    except HostError as e:
        fail(head_host, e.cause)
        for h in spec.hosts[1:]:
            fail(h, "the head host failed, so no node could join", "skipped")
        result.seconds = time.monotonic() - t0
        return result
    result.head_address = head["address"]
    result.dashboard_url = head.get("dashboard_url")
    result.dashboard_note = head.get("dashboard_note")
    result.outcomes.append(_outcome(head_host, "head+node", started_here.get(head_host.host),
                                    head_probe, head, node))
    say(_line(result.outcomes[-1]))

    # Every other host: a node, wherever none runs.
    def start_node(host: HostSpec):
        probe = probes[host.host]
        if host.host in failed:
            return HostOutcome(host.host, "node", "failed", failed[host.host])
        if not _needs_start(spec, host, probe, head["epoch"]):
            return _outcome(host, "node", [], probe, None, probe["node"])
        req = {**_start_request(spec, host, ["node"]), "token": token,
               "head_address": head["address"], "head_epoch": head["epoch"]}
        try:
            ans = call(transport, host, req, setup=True, timeout=_start_timeout(spec, host))
        except HostError as e:
            return HostOutcome(host.host, "node", "failed", e.cause)
        started_here[host.host] = ans["started"]
        return _outcome(host, "node", ans["started"], probe, None, ans["node"])

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(spec.hosts) - 1))) as pool:
        for out in pool.map(start_node, spec.hosts[1:]):
            result.outcomes.append(out)
            say(_line(out))

    if all_or_nothing and result.failed:
        say(f"--all-or-nothing: {len(result.failed)} host(s) failed; stopping what this "
            "up started")
        _undo(transport, spec, started_here)
        result.head_address = None
        result.seconds = time.monotonic() - t0
        return result

    node_ids = [o.node["node_id"] for o in result.outcomes if o.node and o.node.get("node_id")]
    try:
        ans = call(transport, head_host, request(spec, "status", wait_nodes=node_ids,
                                                 timeout=spec.start_timeout),
                   timeout=spec.start_timeout + head_host.ssh.connect_timeout + _QUICK_S)
        result.nodes, result.unregistered = ans.get("nodes", []), ans.get("missing", [])
    except HostError as e:
        say(f"  {e.host}: could not ask the head which nodes registered: {e.cause}")
        result.unregistered = node_ids
    result.seconds = time.monotonic() - t0
    return result


def _outcome(host: HostSpec, roles: str, started, probe, head, node) -> HostOutcome:
    if not started:
        state = "running"
    elif isinstance(probe, dict) and any(probe[r].get("started") for r in started):
        state = "restarted"
    else:
        state = "started"
    return HostOutcome(host.host, roles, state, node=node, head=head)


def _line(o: HostOutcome) -> str:
    if o.state == "failed":
        return f"  {o.host}: FAILED: {o.detail}"
    what = []
    if o.head:
        what.append(f"head at {o.head['address']} (pid {o.head['pid']})")
    if o.node:
        what.append(f"node {o.node['node_id']} at {o.node['address']} (pid {o.node['pid']})")
    verb = {"running": "already running", "started": "started", "restarted": "restarted"}[o.state]
    return f"  {o.host}: {verb}: {', '.join(what)}"


def _undo(transport, spec: ClusterSpec, started: dict) -> None:
    """Stop what this ``up`` started (``started``: host -> roles), on every host at once."""
    def stop(host: HostSpec):
        roles = started.get(host.host)
        if roles:
            try:
                call(transport, host, request(spec, "stop", only=roles),
                     timeout=host.ssh.connect_timeout + _QUICK_S)
            except HostError:
                pass
    _parallel(stop, spec.hosts)


def down(spec: ClusterSpec, transport, say=print) -> list:
    """Stop what ``up`` started on every host, all hosts at once (each stops its jobs,
    then its node and head). Returns one HostOutcome per host (state "stopped", "none"
    or "failed")."""
    def stop(host: HostSpec):
        try:
            ans = call(transport, host, request(spec, "stop"),
                       timeout=host.ssh.connect_timeout + _QUICK_S)
        except HostError as e:
            return HostOutcome(host.host, "+".join(_roles(spec, host)), "failed", e.cause)
        stopped, gone = ans["stopped"], ans.get("gone", [])
        detail = "; ".join(part for part in (
            f"stopped {', '.join(stopped)}" if stopped else "",
            f"{', '.join(gone)} had already exited" if gone else "") if part)
        return HostOutcome(host.host, "+".join(_roles(spec, host)),
                           "stopped" if stopped or gone else "none", detail)

    outcomes = _parallel(stop, spec.hosts)
    for o in outcomes:
        if o.state == "failed":
            say(f"  {o.host}: FAILED: {o.detail} (whatever up started there still runs)")
        elif o.state == "stopped":
            say(f"  {o.host}: {o.detail}")
        else:
            say(f"  {o.host}: nothing of cluster {spec.name!r} was running")
    return outcomes


def status(spec: ClusterSpec, transport) -> dict:
    """Every host's answer (or HostError), by host name, the head host's with the head's
    node table under ``"nodes"``."""
    def ask(host: HostSpec):
        try:
            return call(transport, host, request(spec, "status"),
                        timeout=host.ssh.connect_timeout + _QUICK_S)
        except HostError as e:
            return e
    return dict(zip([h.host for h in spec.hosts], _parallel(ask, spec.hosts)))


def connect_info(spec: ClusterSpec, transport) -> dict:
    """The head's ``address``, ``token`` and ``dashboard_url``, asked of the head host over
    SSH (the token stays in memory). ``HostError`` if the cluster is not up."""
    return call(transport, spec.head, request(spec, "connect"),
                timeout=spec.head.ssh.connect_timeout + _QUICK_S)
