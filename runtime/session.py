"""Records of what ``ddlf-node`` started on this host: head address, token files, pids."""

from __future__ import annotations

import json
import os
import sys

import psutil

from . import config
from .process import resolve_token
from .wire.address import split_address
from .wire.auth import read_token_file

__all__ = ["head_record", "find_token", "read_config"]


def _procs_dir() -> str:
    d = os.path.join(config.session_root(), "procs")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def _logs_dir() -> str:
    d = os.path.join(config.session_root(), "logs")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def head_record() -> dict | None:
    """What ``start --head`` recorded on this host (address, token file), if it is alive."""
    path = os.path.join(config.session_root(), "head.json")
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if _is_ours(rec.get("pid")) else None


def find_token(address: str | None, explicit: str | None = None) -> str | None:
    """The token from --token, DDLF_AUTH_TOKEN, or the head's token file on this host."""
    token = resolve_token(explicit)
    if token:
        return token
    if address:
        try:
            path = os.path.join(config.session_root(), f"head-{split_address(address)[1]}",
                                "token")
        except ValueError:
            path = None   # not host:port: only the head record below can match it
        if path is not None and os.path.exists(path):
            return read_token_file(path)
    rec = head_record()
    if rec and (address is None or rec["address"] == address) and os.path.exists(rec["token_file"]):
        return read_token_file(rec["token_file"])
    return None


def _is_ours(pid) -> bool:
    """True if ``pid`` is alive and runs DDLF code (pids get reused: never trust a number alone)."""
    if not pid:
        return False
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return "ddlf_actors.runtime" in cmd


def read_config(path: str = "cluster.toml") -> tuple[list[str], list[int]]:
    """The paper's ``read_config()``: ``(hosts, ports)`` from a TOML file such as

        hosts = ["10.0.0.5:6380", "10.0.0.6:6380"]
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same API under its old name (a dependency there)
        import tomli as tomllib
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries = data.get("hosts") or data.get("cluster", {}).get("hosts")
    if not entries or not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of 'host:port' strings under 'hosts'")
    hosts, ports = [], []
    for entry in entries:
        host, sep, port = str(entry).rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"{path}: {entry!r} is not 'host:port'")
        hosts.append(host)
        ports.append(int(port))
    return hosts, ports
