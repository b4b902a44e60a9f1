"""Hosts reachable over real SSH: network namespaces, each running Debian's sshd.

``SSHHosts(n)`` builds ``n`` hosts plus one more namespace for the user's machine (the
driver) on a bridge. Each host runs its own ``sshd`` on its own address with a host key
made for it; the user has a key made for the test, a ``known_hosts`` listing the hosts'
keys, and a private ``ssh_config`` that the cluster file names (``ssh.config``: ``ssh -F``),
so the real ~/.ssh is never read or written. ``ddlf`` commands run in the driver's
namespace (:meth:`SSHHosts.ddlf`).

The namespaces share this machine's file system, so each host gets a DDLF session folder
of its own, set by its sshd (``SetEnv DDLF_TEMP_DIR=...``) as a separate machine's /tmp
would be. :meth:`SSHHosts.down` ends every process left in the namespaces (by pid: they
are all the test's) and deletes them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from netns_cluster import NetnsHosts, netns_unavailable

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SUBNET = "10.214.0"
LABEL = "ddlfssh"


def ssh_unavailable() -> str | None:
    """Why these tests cannot run here (None: they can)."""
    why = netns_unavailable()
    if why:
        return why
    if not os.path.exists(SSHD):
        return "needs OpenSSH's sshd (apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs OpenSSH's {tool}"
    return None


def _keygen(path: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    with open(path + ".pub") as f:
        return f.read().strip()


class SSHHosts:
    """``n`` SSH hosts (host i at ``ips[i]``) and a driver namespace."""

    def __init__(self, n: int = 5):
        self.n = n
        self.net = NetnsHosts(n + 1, subnet=SUBNET, label=LABEL)
        self.ips = self.net.ips[:n]
        self.dir = tempfile.mkdtemp(prefix="ddlf-ssh-test-")
        os.chmod(self.dir, 0o700)
        self.sshd: list[subprocess.Popen] = []
        self.state_dirs = [os.path.join(self.dir, f"h{i}") for i in range(n)]
        self.driver_dir = os.path.join(self.dir, "driver")
        self.ssh_config = os.path.join(self.dir, "ssh_config")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.user_key = os.path.join(self.dir, "id_user")
        self.stranger_key = os.path.join(self.dir, "id_stranger")   # in no authorized_keys
        self.host_keys: list[str] = []

    # -- building -------------------------------------------------------------------------
    def up(self) -> SSHHosts:
        try:
            self.net.up()
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege separation
            user_pub = _keygen(self.user_key)
            _keygen(self.stranger_key)
            auth = os.path.join(self.dir, "authorized_keys")
            with open(auth, "w") as f:
                f.write(user_pub + "\n")
            os.makedirs(self.driver_dir, mode=0o700)
            known = []
            for i, ip in enumerate(self.ips):
                os.makedirs(self.state_dirs[i], mode=0o700)
                hostkey = os.path.join(self.dir, f"hostkey{i}")
                self.host_keys.append(_keygen(hostkey))
                known.append(f"{ip} {' '.join(self.host_keys[-1].split()[:2])}")
                cfg = os.path.join(self.dir, f"sshd_config{i}")
                with open(cfg, "w") as f:
                    f.write("\n".join([
                        f"ListenAddress {ip}", "Port 22", f"HostKey {hostkey}",
                        f"PidFile {self.dir}/sshd{i}.pid", f"AuthorizedKeysFile {auth}",
                        "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                        "UsePAM no", "PermitRootLogin prohibit-password", "StrictModes no",
                        "MaxStartups 50", "MaxSessions 50", "LogLevel ERROR",
                        f"SetEnv DDLF_TEMP_DIR={self.state_dirs[i]} OMP_NUM_THREADS=1",
                        ""]))
                self.sshd.append(subprocess.Popen(
                    [*self.net.prefix(i), SSHD, "-D", "-f", cfg, "-E",
                     os.path.join(self.dir, f"sshd{i}.log")], stdin=subprocess.DEVNULL))
            with open(self.known_hosts, "w") as f:
                f.write("\n".join(known) + "\n")
            self.write_ssh_config()
            self._wait_listening()
        except BaseException:
            self.down()
            raise
        return self

    def write_ssh_config(self, known_hosts: str | None = None) -> None:
        """The user's ssh_config: an alias ``labI`` for host I (as a ~/.ssh/config would
        name lab machines), the test's key, and the test's known_hosts."""
        aliases = [f"Host {self.alias(i)}\n  HostName {ip}" for i, ip in enumerate(self.ips)]
        with open(self.ssh_config, "w") as f:
            f.write("\n".join([
                *aliases, "Host *", "  User root", f"  IdentityFile {self.user_key}",
                "  IdentitiesOnly yes", f"  UserKnownHostsFile {known_hosts or self.known_hosts}",
                "  GlobalKnownHostsFile /dev/null", "  LogLevel ERROR", ""]))

    @staticmethod
    def alias(i: int) -> str:
        return f"lab{i}"

    def _wait_listening(self, timeout: float = 20.0) -> None:
        code = ("import socket,sys,time\n"
                f"for ip in {self.ips!r}:\n"
                "    for _ in range(200):\n"
                "        try: socket.create_connection((ip, 22), 0.5).close(); break\n"
                "        except OSError: time.sleep(0.05)\n"
                "    else: sys.exit(f'no sshd at {ip}')\n")
        subprocess.run([*self.driver_prefix, sys.executable, "-c", code], check=True,
                       timeout=timeout)

    @property
    def driver_prefix(self) -> list:
        return self.net.prefix(self.n)

    # -- using ----------------------------------------------------------------------------
    def cluster_file(self, name: str, hosts: list, **extra) -> str:
        """A cluster file for hosts (indexes, or entries as the file takes them)."""
        import yaml

        entries = [self.ips[h] if isinstance(h, int) else h for h in hosts]
        data = {"cluster_name": name, "hosts": entries, "ssh": {"config": self.ssh_config,
                                                                "connect_timeout": 5},
                "python": sys.executable, "dashboard": False, "start_timeout": 60,
                "env": {"DDLF_NODE_DEAD_AFTER_S": "3"}, **extra}
        path = os.path.join(self.dir, f"{name}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(data, f)
        return path

    def env(self) -> dict:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, "DDLF_TEMP_DIR": self.driver_dir, "PYTHONPATH": path}

    def ddlf(self, *args: str, timeout: float = 240, tool: str = "ddlf",
             input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``ddlf ARGS`` (or ``ddlf-train``) on the driver's machine."""
        module = {"ddlf": "ddlf_actors.runtime.launch.cli",
                  "ddlf-train": "ddlf_actors.apps.cli"}[tool]
        return subprocess.run([*self.driver_prefix, sys.executable, "-m", module, *args],
                              capture_output=True, text=True, timeout=timeout, env=self.env(),
                              input=input)

    def popen_ddlf(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([*self.driver_prefix, sys.executable, "-m",
                                 "ddlf_actors.runtime.launch.cli", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env(), start_new_session=True)

    def pids(self, i: int) -> list:
        """Every process in namespace ``i`` but its sshd listener."""
        out = subprocess.run(["ip", "netns", "pids", self.net.ns[i]], capture_output=True,
                             text=True).stdout.split()
        skip = {self.sshd[i].pid} if i < len(self.sshd) else set()
        return [int(p) for p in out if int(p) not in skip]

    def ddlf_pids(self, i: int) -> list:
        """The DDLF processes (head, node, workers, agents, jobs) in namespace ``i``."""
        out = []
        for pid in self.pids(i):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"ddlf" in f.read():
                        out.append(pid)
            except OSError:
                pass
        return out

    def wait_no_processes(self, hosts, timeout: float = 20.0) -> dict:
        """Wait until no process but sshd's listener is left in each of ``hosts``
        (sshd's per-connection processes take a moment to go); what is left."""
        deadline = time.monotonic() + timeout
        while True:
            left = {i: self.pids(i) for i in hosts}
            left = {i: p for i, p in left.items() if p}
            if not left or time.monotonic() > deadline:
                return {i: [_cmdline(p) for p in ps] for i, ps in left.items()}
            time.sleep(0.2)

    # -- tearing down ---------------------------------------------------------------------
    def down(self) -> None:
        for p in self.sshd:
            if p.poll() is None:
                p.terminate()
        for p in self.sshd:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # Whatever is left in our namespaces is ours (a test that failed half-way).
        for i in range(len(self.net.ns)):
            for pid in self.pids(i):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.net.down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def namespaces_left(self) -> list:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [ns for ns in self.net.ns if ns in out.split()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"{pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"{pid}: (gone)"

