"""Reaching hosts: OpenSSH's ``ssh`` client as a subprocess.

The real ``ssh`` (not a Python SSH library) so that a host resolves exactly as the user's
own ``ssh`` resolves it: ~/.ssh/config aliases, ports, ``IdentityFile``, ``ProxyJump``,
the agent, and ``known_hosts``. Three options are always set:

* ``BatchMode=yes``: a missing key or an unknown host fails at once instead of asking for
  a password or a yes/no on a terminal nobody watches.
* ``StrictHostKeyChecking=yes``: an unknown or changed host key is refused, never
  accepted silently. The error says how to check and accept it.
* ``ControlMaster=auto`` with a socket in a private folder made for this process: the
  several commands one ``ddlf up`` sends a host share one connection (a new SSH
  connection costs ~0.3-0.5 s of key exchange). :meth:`SSHTransport.close` ends those
  masters; ``ControlPersist`` ends them anyway a minute after a crash.

A failure is one line naming the host and the cause (:func:`describe_failure`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading

from ..errors import DDLFError
from .cluster_file import HostSpec

__all__ = ["HostError", "SSHTransport", "describe_failure", "SSH_FAILED"]

# What ssh exits with when it, not the remote command, failed.
SSH_FAILED = 255
_PERSIST_S = 60


class HostError(DDLFError):
    """Something went wrong on (or on the way to) one host; ``str()`` is one line.

    ``kind`` says where: ``"ssh"`` (the host was not reached), ``"setup"`` (a setup
    command failed), ``"install"`` (no Python or no DDLF there), ``"agent"`` (DDLF on the
    host refused or failed).
    """

    def __init__(self, host: str, cause: str, kind: str = "agent"):
        super().__init__(f"{host}: {cause}")
        self.host = host
        self.cause = cause
        self.kind = kind


def describe_failure(host: str, stderr: str) -> str:
    """The cause of an ssh failure (exit status 255), from ssh's stderr, as one line that
    says what to do."""
    text = stderr.strip()
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "has changed and you have requested strict" in text:
        return ("its host key does not match the one in known_hosts, so ssh refused it (the "
                "host was reinstalled, or someone is in the middle); if you know why it "
                f"changed, remove the old key with `ssh-keygen -R {_bare(host)}` and connect once "
                f"with `ssh {host}` to check and accept the new one")
    if "host key is known for" in text or "Host key verification failed" in text:
        return ("its host key is not in known_hosts, and ddlf never accepts a key unseen: "
                f"connect once with `ssh {host}`, check the fingerprint and accept it")
    if "Permission denied" in text:
        return (f"the key was refused ({last}): put your public key in the host's "
                "~/.ssh/authorized_keys (ssh-copy-id), load it into ssh-agent, or name it "
                "with ssh.key in the cluster file")
    if "Could not resolve hostname" in text:
        return f"unreachable: the name does not resolve ({last})"
    for sign in ("Connection timed out", "timed out", "No route to host", "Connection refused",
                 "Network is unreachable", "Connection closed by", "Connection reset"):
        if sign in text:
            return f"unreachable ({last})"
    return f"ssh failed: {last or 'no message (exit status 255)'}"


def _bare(host: str) -> str:
    return host.rsplit("@", 1)[-1]


class SSHTransport:
    """Runs commands on hosts over ``ssh``; one per ``ddlf`` command. Use as a context
    manager (or call :meth:`close`) so the shared connections end with it."""

    def __init__(self, multiplex: bool = True):
        # A short private folder for the control sockets: a socket path must stay under
        # ~104 bytes, and nobody else may connect through our connections.
        self._dir = tempfile.mkdtemp(prefix="ddlf-ssh-") if multiplex else None
        self._masters: dict = {}
        self._lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def argv(self, host: HostSpec, command: str, *, keepalive: bool = False) -> list:
        """The ssh command line that runs ``command`` (one shell string) on ``host``."""
        base = self._base(host)
        extra = ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"] if keepalive else []
        with self._lock:
            self._masters[(tuple(base), host.host)] = True
        return [*base, *extra, "-T", "--", host.host, command]

    def _base(self, host: HostSpec) -> list:
        o = host.ssh
        argv = ["ssh"]
        if o.config:
            argv += ["-F", o.config]
        argv += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                 "-o", f"ConnectTimeout={max(1, round(o.connect_timeout))}"]
        if self._dir:
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self._dir}/%C",
                     "-o", f"ControlPersist={_PERSIST_S}"]
        if o.user:
            argv += ["-l", o.user]
        if o.port:
            argv += ["-p", str(o.port)]
        if o.key:
            argv += ["-i", o.key]
        return argv

    def run(self, host: HostSpec, command: str, stdin: bytes = b"",
            timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run ``command`` on ``host`` with ``stdin``; the completed process (bytes).
        ``HostError`` if it runs past ``timeout`` (ssh is killed)."""
        try:
            return subprocess.run(self.argv(host, command), input=stdin, capture_output=True,
                                  timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise HostError(host.host, f"no answer within {timeout:g} s (ssh was stopped)",
                            "ssh") from None
        except FileNotFoundError:
            raise HostError(host.host, "the `ssh` command is not installed on this machine "
                                       "(OpenSSH's client: apt install openssh-client)",
                            "ssh") from None

    def popen(self, host: HostSpec, command: str, **kwargs) -> subprocess.Popen:
        """Start ``command`` on ``host`` and return the ssh process. It runs in a session of
        its own, so the terminal's Ctrl-C reaches the caller only, which decides."""
        return subprocess.Popen(self.argv(host, command, keepalive=True),
                                start_new_session=True, **kwargs)

    def close(self) -> None:
        """End the shared connections this transport opened, and remove their folder."""
        if self._dir is None:
            return
        with self._lock:
            masters, self._masters = dict(self._masters), {}
        for base, dest in masters:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run([*base, "-O", "exit", dest], capture_output=True, timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
