"""How long ``ddlf up`` and ``ddlf down`` take on 4 hosts over real SSH, against doing it by
hand; and a transcript of a user's session.

    sudo python benchmarks/deploy_timing.py [--runs 3] [--hosts 4] [--json FILE]
    sudo python benchmarks/deploy_timing.py --transcript docs/deploy-session.txt

Hosts are network namespaces on one machine, each running its own sshd
(``tests/ssh_hosts.py``, as the tests use them); the ``ddlf`` commands run in a namespace of
their own, the user's machine. Each figure is one command's wall time, from the command
line to its exit: ``ddlf up`` exits once the head lists every node as alive.

The baseline, in the same run: what the issue says a user does today, scripted, one host
after another with a fresh ``ssh`` each, as typed: ``ddlf-node start --head`` on the first
host, read its token file, then on each other host write the token (on ssh's stdin) and
``ddlf-node start --address ...``; ``ddlf-node stop`` on each host to stop.

``--transcript FILE`` records a session instead: ``ddlf up``, a training run submitted
(``examples/torch_fashion_mnist.py``: real Fashion-MNIST from ~/.cache/ddlf, PyTorch),
``ddlf status``, ``ddlf logs``, ``ddlf down``, each command with its output and time.
Needs root and Debian's openssh-server.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from ssh_hosts import SSHHosts, ssh_unavailable  # noqa: E402

NODE_CLI = f"{sys.executable} -m ddlf_actors.runtime.cli"


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _check(proc, what):
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _ssh(hosts: SSHHosts, i: int, command: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*hosts.driver_prefix, "ssh", "-F", hosts.ssh_config, hosts.alias(i),
                           command], input=stdin, capture_output=True, text=True, timeout=120)


def by_hand_up(hosts: SSHHosts, n: int, port: int = 6381) -> None:
    """The head, its token read back, then each node, one host after another."""
    _check(_ssh(hosts, 0, f"{NODE_CLI} start --head --host {hosts.ips[0]} --port {port} "
                          "--dashboard-port 0"), "ddlf-node start --head")
    token = _check(_ssh(hosts, 0, f'cat "$DDLF_TEMP_DIR/head-{port}/token"'), "cat token").stdout
    for i in range(1, n):
        _check(_ssh(hosts, i, "umask 077; cat > \"$DDLF_TEMP_DIR/token\" && "
                              f"{NODE_CLI} start --address {hosts.ips[0]}:{port} "
                              f"--host {hosts.ips[i]} --token-file \"$DDLF_TEMP_DIR/token\"",
                    stdin=token), f"ddlf-node start on host {i}")


def by_hand_down(hosts: SSHHosts, n: int) -> None:
    for i in reversed(range(n)):
        _check(_ssh(hosts, i, f"{NODE_CLI} stop"), f"ddlf-node stop on host {i}")


def measure(hosts: SSHHosts, n: int, runs: int) -> dict:
    path = hosts.cluster_file("timing", [hosts.alias(i) for i in range(n)])
    rows: dict = {k: [] for k in ("up", "up_again", "status", "down", "hand_up", "hand_down")}
    for run in range(runs):
        t, proc = _timed(lambda: hosts.ddlf("up", path))
        _check(proc, "ddlf up")
        assert f"{n} nodes registered" in proc.stdout, proc.stdout
        rows["up"].append(t)
        for key, args in (("up_again", ("up", path)), ("status", ("status", path)),
                          ("down", ("down", path))):
            t, proc = _timed(lambda args=args: hosts.ddlf(*args))
            _check(proc, f"ddlf {args[0]}")
            rows[key].append(t)
        left = hosts.wait_no_processes(range(n + 1), timeout=20)
        if left:
            raise SystemExit(f"ddlf down left processes: {left}")
        t, _ = _timed(lambda: by_hand_up(hosts, n))
        rows["hand_up"].append(t)
        t, _ = _timed(lambda: by_hand_down(hosts, n))
        rows["hand_down"].append(t)
        hosts.wait_no_processes(range(n + 1), timeout=20)
        print(f"run {run + 1}/{runs}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items()),
              file=sys.stderr, flush=True)
    return rows


def print_table(rows: dict, n: int, runs: int) -> None:
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n{n} hosts in network namespaces, each with its own sshd; median of {runs} runs, "
          "seconds from the command to its exit\n")
    print("| step | `ddlf` | by hand, host after host (`ssh` + `ddlf-node`) | ratio |")
    print("|---|---|---|---|")
    print(f"| start: head + {n} nodes, every node registered | {med['up']:.1f} "
          f"(min {min(rows['up']):.1f}, max {max(rows['up']):.1f}) | {med['hand_up']:.1f} | "
          f"{med['up'] / med['hand_up']:.2f}x |")
    print(f"| stop everything | {med['down']:.1f} (min {min(rows['down']):.1f}, max "
          f"{max(rows['down']):.1f}) | {med['hand_down']:.1f} | "
          f"{med['down'] / med['hand_down']:.2f}x |")
    print(f"| `ddlf up` again, nothing to start | {med['up_again']:.1f} | - | - |")
    print(f"| `ddlf status` | {med['status']:.1f} | - | - |")


def transcript(hosts: SSHHosts, n: int, out: str) -> None:
    """A user's session: each command as typed, then what it printed, then its time."""
    import shutil

    # The user's folder: the cluster file, and the training script (its folder is uploaded).
    home = os.path.join(hosts.dir, "lab-user")
    os.makedirs(home)
    shutil.copy(os.path.join(ROOT, "examples", "torch_fashion_mnist.py"), home)
    text = "\n".join([
        "cluster_name: lab", "hosts:          # the head first; names from ~/.ssh/config",
        *[f"  - {hosts.alias(i)}" for i in range(n)],
        "ssh: {config: ~/.ssh/config}", "python: ~/venvs/ddlf/bin/python", ""])
    shown = os.path.join(home, "cluster.yaml")
    with open(shown, "w") as f:
        f.write(text)
    with open(shown + ".real", "w") as f:   # what ddlf reads: the harness's ssh_config
        f.write(text.replace("~/.ssh/config", hosts.ssh_config)
                .replace("~/venvs/ddlf/bin/python", sys.executable))
    commands = [
        ["up", "cluster.yaml"],
        ["submit", "--cluster", "cluster.yaml", "torch_fashion_mnist.py", "--workers", "4",
         "--master-epochs", "2", "--limit", "12000", "--out", "runs/fmnist"],
        ["status", "cluster.yaml"],
        ["logs", "--cluster", "cluster.yaml"],
        ["down", "cluster.yaml"],
    ]
    lines = [f"# A user's session with `ddlf` on {n} hosts (lab0..lab{n - 1}: network "
             "namespaces on one 2-core machine, each with its own sshd; the user's machine "
             "is a namespace of its own).",
             f"# Recorded by benchmarks/deploy_timing.py --transcript on "
             f"{time.strftime('%Y-%m-%d %H:%M')}; each command's wall time follows it.",
             "# cluster.yaml as shown names ~/.ssh/config and ~/venvs/ddlf; the run used the "
             "harness's private ssh_config (lab0.. aliases, its keys and known_hosts) and this "
             "machine's venv in their place.",
             "", "$ cat cluster.yaml", text.rstrip(), ""]
    for args in commands:
        real_args = [a if a != "cluster.yaml" else shown + ".real" for a in args]
        t0 = time.perf_counter()
        proc = subprocess.run([*hosts.driver_prefix, sys.executable, "-m",
                               "ddlf_actors.runtime.launch.cli", *real_args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=900, env=hosts.env(), cwd=home)
        took = time.perf_counter() - t0
        # A progress bar redraws its line with \r: each redraw on a line of its own here.
        output = proc.stdout.replace(shown + ".real", "cluster.yaml").replace("\r", "\n")
        output = "\n".join(ln for ln in output.split("\n") if ln.strip())
        lines += [f"$ ddlf {shlex.join(args)}", output.rstrip(),
                  f"[exit status {proc.returncode}, {took:.1f} s]", ""]
        print(f"ddlf {args[0]}: {took:.1f} s, exit {proc.returncode}", file=sys.stderr,
              flush=True)
    with open(out, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {out}", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    p.add_argument("--transcript", metavar="FILE", help="record a user's session instead")
    a = p.parse_args()
    why = ssh_unavailable()
    if why:
        raise SystemExit(f"cannot run: {why}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    hosts = SSHHosts(a.hosts).up()
    try:
        if a.transcript:
            transcript(hosts, a.hosts, a.transcript)
            return 0
        rows = measure(hosts, a.hosts, a.runs)
    finally:
        hosts.down()
    print_table(rows, a.hosts, a.runs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "hosts": a.hosts,
                       "machine": f"{os.cpu_count()} cores", "seconds": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
