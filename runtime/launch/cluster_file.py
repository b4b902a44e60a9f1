"""The cluster file ``ddlf up`` reads: which hosts, how to reach them, what to run there.

    cluster_name: lab                # optional; several clusters may share hosts
    hosts:                           # the head first
      - gpu1                         # anything `ssh` resolves, ~/.ssh/config aliases too
      - host: gpu2
        num_cpus: 8                  # optional, per host: num_cpus, num_gpus, memory,
        num_gpus: 2                  #   resources, address, python, venv, ssh,
      - 10.0.0.13                    #   setup_commands
    ssh: {user: alice, port: 22, key: ~/.ssh/id_ed25519}
    venv: ~/venvs/ddlf               # or python: python3.11
    setup_commands: ["pip install ddlf-actors==0.1.0"]
    port: 6380
    dashboard: {port: 8265}          # or false
    tls: {cert: /etc/ddlf/host.pem, key: /etc/ddlf/host.key, ca: /etc/ddlf/ca.pem}

Everything is checked when the file is read: an unknown key, a value of the wrong type or
a host named twice is a :class:`ClusterFileError` naming the file and the key, before any
host is contacted. The cluster token never goes in this file (``ddlf up`` makes one on the
head and hands it to the nodes over SSH): a ``token`` key is refused.

``python``, ``venv``, ``tls`` and ``setup_commands`` are read on the hosts; ``ssh.key`` and
``ssh.config`` on this machine.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, replace

__all__ = ["ClusterFileError", "SSHOptions", "HostSpec", "DashboardSpec", "TLSPaths",
           "ClusterSpec", "load", "from_hosts", "parse"]

_TOP_KEYS = ("cluster_name", "hosts", "ssh", "python", "venv", "setup_commands", "port",
             "dashboard", "tls", "env", "start_timeout", "setup_timeout")
_HOST_KEYS = ("host", "address", "num_cpus", "num_gpus", "memory", "resources", "python",
              "venv", "setup_commands", "ssh")
_SSH_KEYS = ("user", "port", "key", "config", "connect_timeout")
_DASHBOARD_KEYS = ("port", "host")
_TLS_KEYS = ("cert", "key", "ca")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ClusterFileError(ValueError):
    """The cluster file (or ``--hosts``) is wrong; the message names the file and the key."""


@dataclass(frozen=True)
class SSHOptions:
    """How to reach a host: each None leaves the choice to ``ssh`` and ~/.ssh/config."""

    user: str | None = None
    port: int | None = None
    key: str | None = None           # IdentityFile, on this machine
    config: str | None = None        # an ssh_config file for ``ssh -F``, on this machine
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class HostSpec:
    """One host of the cluster, with the cluster-wide settings filled in."""

    host: str                        # the ssh destination
    ssh: SSHOptions = field(default_factory=SSHOptions)
    python: str = "python3"
    venv: str | None = None
    setup_commands: tuple = ()
    address: str | None = None       # the IP DDLF binds and advertises (default: the one sshd answered on)
    num_cpus: float | None = None
    num_gpus: int | None = None
    memory: int | None = None
    resources: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DashboardSpec:
    port: int | None = None          # None: 8265, or any free port if taken
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class TLSPaths:
    """The certificate, its key and the cluster CA: paths on every host."""

    cert: str
    key: str
    ca: str


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    hosts: tuple                     # HostSpec, the head first
    port: int = 6380
    dashboard: DashboardSpec | None = field(default_factory=DashboardSpec)
    tls: TLSPaths | None = None
    env: dict = field(default_factory=dict)
    start_timeout: float = 120.0     # bounds the wait for every node to register
    setup_timeout: float = 900.0     # bounds a host's setup commands (pip can be slow)
    source: str = "cluster file"

    @property
    def head(self) -> HostSpec:
        return self.hosts[0]

    def find(self, host: str) -> HostSpec:
        """The host named ``host`` (as written in the file); ``ClusterFileError`` if none."""
        for h in self.hosts:
            if h.host == host:
                return h
        raise ClusterFileError(f"{self.source}: no host {host!r}; its hosts are "
                               f"{', '.join(h.host for h in self.hosts)}")


# -- reading -------------------------------------------------------------------------------------
def load(path: str) -> ClusterSpec:
    """Read and check a cluster file; ``ClusterFileError`` names what is wrong."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ClusterFileError(f"cannot read the cluster file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ClusterFileError(f"{path}: not valid YAML{where}: {problem}") from None
    return parse(data, path)


def from_hosts(hosts: str, source: str = "--hosts") -> ClusterSpec:
    """``ddlf up --hosts a,b,c``: those hosts (the first is the head), every default."""
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    return parse({"hosts": names}, source)


def parse(data, source: str = "cluster file") -> ClusterSpec:
    """A :class:`ClusterSpec` from the file's parsed YAML (a dict)."""
    if not isinstance(data, dict):
        raise ClusterFileError(f"{source}: expected a mapping with at least 'hosts:', got "
                               f"{_kind(data)}")
    _check_keys(data, _TOP_KEYS, source, "")
    name = data.get("cluster_name", "default")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ClusterFileError(f"{source}: cluster_name: {name!r} must be letters, digits, "
                               "'.', '_' or '-' (it names folders on every host)")
    defaults = HostSpec(
        host="",
        ssh=_ssh(data.get("ssh"), SSHOptions(), source, "ssh"),
        python=_str(data, "python", source, "", "python3"),
        venv=_str(data, "venv", source, "", None),
        setup_commands=_commands(data, source, "", ()),
    )
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise ClusterFileError(f"{source}: hosts: give a list of hosts, the head first "
                               f"(got {_kind(hosts)})")
    specs = [_host(entry, defaults, source, f"hosts[{i}]") for i, entry in enumerate(hosts)]
    seen: dict = {}
    for i, h in enumerate(specs):
        if h.host in seen:
            raise ClusterFileError(f"{source}: hosts[{i}]: {h.host!r} is listed twice (also "
                                   f"hosts[{seen[h.host]}]); a host runs one node")
        seen[h.host] = i
    return ClusterSpec(
        name=name, hosts=tuple(specs), port=_port(data, "port", source, "", 6380, allow_zero=True),
        dashboard=_dashboard(data.get("dashboard", True), source), tls=_tls(data.get("tls"), source),
        env=_env(data.get("env"), source),
        start_timeout=_number(data, "start_timeout", source, "", 120.0, positive=True),
        setup_timeout=_number(data, "setup_timeout", source, "", 900.0, positive=True),
        source=source)


def _host(entry, defaults: HostSpec, source: str, where: str) -> HostSpec:
    if isinstance(entry, str):
        entry = {"host": entry}
    if not isinstance(entry, dict):
        raise ClusterFileError(f"{source}: {where}: a host is a name or a mapping with "
                               f"'host:', got {_kind(entry)}")
    _check_keys(entry, _HOST_KEYS, source, where + ".")
    host = entry.get("host")
    if not isinstance(host, str) or not host.strip() or host.startswith("-") \
            or any(c.isspace() for c in host):
        raise ClusterFileError(f"{source}: {where}.host: {host!r} is not a host name "
                               "(an ssh destination such as gpu1, alice@10.0.0.5)")
    resources = entry.get("resources", {})
    if not isinstance(resources, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in resources.items()):
        raise ClusterFileError(f"{source}: {where}.resources: a mapping of name to number, "
                               f"e.g. {{disk: 1}}; got {resources!r}")
    p = where + "."
    num_gpus = entry.get("num_gpus")
    if num_gpus is not None and (not isinstance(num_gpus, int) or isinstance(num_gpus, bool)
                                 or num_gpus < 0):
        raise ClusterFileError(f"{source}: {p}num_gpus: a whole number >= 0, got {num_gpus!r}")
    memory = _number(entry, "memory", source, p, None, positive=True)
    return replace(
        defaults, host=host.strip(),
        ssh=_ssh(entry.get("ssh"), defaults.ssh, source, p + "ssh"),
        python=_str(entry, "python", source, p, defaults.python),
        venv=_str(entry, "venv", source, p, defaults.venv),
        setup_commands=_commands(entry, source, p, defaults.setup_commands),
        address=_str(entry, "address", source, p, None),
        num_cpus=_number(entry, "num_cpus", source, p, None, positive=True),
        num_gpus=num_gpus, memory=int(memory) if memory is not None else None,
        resources=dict(resources))


def _ssh(value, base: SSHOptions, source: str, where: str) -> SSHOptions:
    if value is None:
        return base
    if not isinstance(value, dict):
        raise ClusterFileError(f"{source}: {where}: a mapping (user, port, key, config, "
                               f"connect_timeout), got {_kind(value)}")
    _check_keys(value, _SSH_KEYS, source, where + ".")
    p = where + "."
    key = _str(value, "key", source, p, None)
    config = _str(value, "config", source, p, None)
    return replace(
        base, user=_str(value, "user", source, p, base.user),
        port=_port(value, "port", source, p, base.port),
        key=os.path.expanduser(key) if key else base.key,
        config=os.path.expanduser(config) if config else base.config,
        connect_timeout=_number(value, "connect_timeout", source, p, base.connect_timeout,
                                positive=True))


def _dashboard(value, source: str) -> DashboardSpec | None:
    if value is False or value is None:
        return None
    if value is True:
        return DashboardSpec()
    if not isinstance(value, dict):
        raise ClusterFileError(f"{source}: dashboard: true, false, or a mapping with port "
                               f"and host; got {_kind(value)}")
    _check_keys(value, _DASHBOARD_KEYS, source, "dashboard.")
    return DashboardSpec(port=_port(value, "port", source, "dashboard.", None),
                         host=_str(value, "host", source, "dashboard.", "127.0.0.1"))


def _tls(value, source: str) -> TLSPaths | None:
    if value in (None, False):
        return None
    if not isinstance(value, dict):
        raise ClusterFileError(f"{source}: tls: false, or a mapping with cert, key and ca "
                               f"(paths on every host); got {_kind(value)}")
    _check_keys(value, _TLS_KEYS, source, "tls.")
    missing = [k for k in _TLS_KEYS if not isinstance(value.get(k), str) or not value[k]]
    if missing:
        raise ClusterFileError(f"{source}: tls: give {', '.join('tls.' + k for k in missing)} "
                               "too (paths on every host: its certificate, the certificate's "
                               "key, the cluster CA)")
    return TLSPaths(value["cert"], value["key"], value["ca"])


def _env(value, source: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and re.match(r"^[A-Za-z_]\w*$", k)
                                              for k in value):
        raise ClusterFileError(f"{source}: env: a mapping of environment variable names to "
                               f"values, got {value!r:.80}")
    bad = [k for k in value if k == "DDLF_AUTH_TOKEN"]
    if bad:
        raise ClusterFileError(f"{source}: env.DDLF_AUTH_TOKEN: the token does not go in the "
                               "cluster file; ddlf up makes one on the head")
    return {k: str(v) for k, v in value.items()}


# -- small checks --------------------------------------------------------------------------------
def _check_keys(data: dict, allowed, source: str, prefix: str) -> None:
    for key in data:
        if key == "token" or key == "auth_token":
            raise ClusterFileError(
                f"{source}: {prefix}{key}: the cluster token does not belong in the cluster "
                "file (anyone who reads it could join the cluster); ddlf up makes one on the "
                "head and passes it to the nodes over SSH")
        if key not in allowed:
            if not prefix:   # a host's setting written for the whole cluster
                per_host = difflib.get_close_matches(str(key), _HOST_KEYS, n=1, cutoff=0.8)
                if per_host and per_host[0] not in allowed:
                    raise ClusterFileError(
                        f"{source}: {key}: {per_host[0]} is set per host: write it under the "
                        f"host in hosts: (- host: NAME, then {per_host[0]}: ...)")
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else \
                f"; the keys here are {', '.join(allowed)}"
            raise ClusterFileError(f"{source}: {prefix}{key}: unknown key{hint}")


def _str(data: dict, key: str, source: str, prefix: str, default):
    value = data.get(key, default)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ClusterFileError(f"{source}: {prefix}{key}: expected a string, got {_kind(value)}")
    return value


def _number(data: dict, key: str, source: str, prefix: str, default, positive=False):
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (positive and value <= 0):
        need = "a number > 0" if positive else "a number"
        raise ClusterFileError(f"{source}: {prefix}{key}: expected {need}, got {value!r}")
    return value


def _port(data: dict, key: str, source: str, prefix: str, default, allow_zero=False):
    value = data.get(key, default)
    if value is None:
        return None
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 65535:
        raise ClusterFileError(f"{source}: {prefix}{key}: expected a port number "
                               f"({low}-65535), got {value!r}")
    return value


def _commands(data: dict, source: str, prefix: str, default) -> tuple:
    value = data.get("setup_commands", default)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) and c.strip()
                                                       for c in value):
        raise ClusterFileError(f"{source}: {prefix}setup_commands: a list of shell commands, "
                               f"got {value!r:.80}")
    return tuple(value)


def _kind(value) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r:.60}"
