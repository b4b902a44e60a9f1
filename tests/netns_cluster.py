"""A DDLF cluster across Linux network namespaces: real hosts with distinct IPs on one box.

    sudo python tests/netns_cluster.py          # run the scenario and print what happened

Four namespaces hang off one bridge: h0 runs the head, h1 and h2 run nodes, h3 runs the
driver. The driver places one actor on each node, then the link of one node is cut
(``ip link set ... down``: no FIN, no RST, just silence) and the driver checks that the
cluster notices the node is dead, fails the calls pending there, and keeps working.
Needs root and iproute2; ``tests/test_netns.py`` runs it under pytest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

SUBNET = "10.213.0"


def netns_unavailable() -> str | None:
    """Why this machine cannot run the scenario, or None if it can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command"
    probe = f"ddlfprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` failed here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args, ns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class NetnsHosts:
    """``n`` namespaces on a bridge, host i at ``subnet.(i+1)``; ``label`` starts the
    namespaces' names (so a test's namespaces say whose they are)."""

    _made = 0   # a fresh tag per instance: the kernel frees a deleted veth's name lazily

    def __init__(self, n: int = 4, subnet: str = SUBNET, label: str = "ddlf"):
        NetnsHosts._made += 1
        tag = f"{os.getpid() % 100000}{NetnsHosts._made % 10}"
        self.bridge = f"ddlfbr{tag}"
        self.ns = [f"{label}{tag}h{i}" for i in range(n)]
        self.veth = [f"dv{tag}h{i}" for i in range(n)]
        self.ips = [f"{subnet}.{i + 1}" for i in range(n)]
        self.procs: list[subprocess.Popen] = []

    def up(self) -> NetnsHosts:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for ns, veth, ip in zip(self.ns, self.veth, self.ips):
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", veth + "p")
            _ip("link", "set", veth + "p", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("addr", "add", f"{ip}/24", "dev", veth + "p", ns=ns)
            _ip("link", "set", veth + "p", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
        return self

    def prefix(self, i: int) -> list:
        return ["ip", "netns", "exec", self.ns[i]]

    def shape(self, rate: str, burst: str = "512kb") -> None:
        """Limit every host's link to ``rate`` (``"100mbit"``) each way, full duplex, with
        a token bucket (``tc qdisc replace ... tbf``; ``netem`` is not available here).

        One qdisc on the bridge side of each veth shapes what reaches the host, one on its
        namespace side what it sends. ``burst`` must exceed the largest (GSO) packet the
        veth hands the qdisc, else tbf drops it.
        """
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", "100ms"]
        for ns, veth in zip(self.ns, self.veth):
            subprocess.run(["tc", "qdisc", "replace", "dev", veth, *tbf], check=True,
                           capture_output=True, text=True)
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev",
                            veth + "p", *tbf], check=True, capture_output=True, text=True)

    def cut(self, i: int) -> None:
        """Take host i off the network without telling anyone (no FIN, no RST)."""
        _ip("link", "set", self.veth[i], "down")

    def down(self) -> None:
        from ddlf_actors.runtime.process import stop_children

        stop_children(self.procs, 15)
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def start_head_and_nodes(hosts: NetnsHosts, env: dict, head: int = 0,
                         nodes=(1, 2), num_cpus: float = 1) -> tuple[dict, list]:
    """A head in host ``head`` and a ``num_cpus`` node in each host of ``nodes``, each
    bound to its host's address only; returns (the head's info, the nodes' infos). The
    processes are in ``hosts.procs``, so ``hosts.down()`` stops them."""
    from ddlf_actors.runtime.process import start_child as _start

    proc, info = _start(["ddlf_actors.runtime.head", "--host", hosts.ips[head], "--port", "0",
                         "--stdin-lifeline"], "head", prefix=hosts.prefix(head), env=env,
                        new_session=False)
    hosts.procs.append(proc)
    infos = []
    for i in nodes:
        node, ninfo = _start(["ddlf_actors.runtime.node", "--address", info["address"],
                              "--host", hosts.ips[i], "--num-cpus", str(num_cpus),
                              "--stdin-lifeline"],
                             "node", prefix=hosts.prefix(i), env=env, new_session=False)
        hosts.procs.append(node)
        infos.append(ninfo)
    return info, infos


def _start_cluster(hosts: NetnsHosts, env: dict, driver_mode: str):
    """Head in h0, a 1-CPU node in h1 and h2, and this file as a driver in h3."""
    info, nodes = start_head_and_nodes(hosts, env)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    driver = subprocess.Popen(
        [*hosts.prefix(3), sys.executable, os.path.abspath(__file__), driver_mode,
         info["address"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, **env, "PYTHONPATH": path})
    hosts.procs.append(driver)
    return info, nodes, driver


def run_scenario(dead_after_s: float = 3.0, verbose: bool = False) -> dict:
    """Build the hosts, run the driver in h3, cut h2's link; return the driver's findings."""
    from ddlf_actors.runtime.wire.auth import generate_token

    token = generate_token()
    env = {"DDLF_NODE_DEAD_AFTER_S": str(dead_after_s), "DDLF_AUTH_TOKEN": token}
    hosts = NetnsHosts(4).up()
    try:
        info, nodes, driver = _start_cluster(hosts, env, "driver")
        ready = _read_tagged(driver, "READY", 60)
        if verbose:
            print("driver sees:", json.dumps(ready, indent=1))
        victim = nodes[1]["node_id"]
        t_cut = time.monotonic()
        hosts.cut(2)
        driver.stdin.write(f"CUT {victim}\n")
        driver.stdin.flush()
        result = _read_tagged(driver, "RESULT", 90)
        result["cut_to_result_s"] = round(time.monotonic() - t_cut, 2)
        result["ready"] = ready
        result["nodes"] = nodes
        result["head"] = info["address"]
        driver.stdin.close()
        driver.wait(30)
        return result
    finally:
        hosts.down()


def run_training_scenario(dead_after_s: float = 3.0) -> dict:
    """Train on h1 and h2 from a driver in h3, cut h2's link after round 2; return what the
    driver saw (events, history) and when the link was cut (wall clock)."""
    from ddlf_actors.runtime.wire.auth import generate_token

    env = {"DDLF_NODE_DEAD_AFTER_S": str(dead_after_s), "DDLF_AUTH_TOKEN": generate_token()}
    hosts = NetnsHosts(4).up()
    try:
        info, nodes, driver = _start_cluster(hosts, env, "train-driver")
        _read_tagged(driver, "ROW2", 120)
        cut_at = time.time()
        hosts.cut(2)
        result = _read_tagged(driver, "RESULT", 120)
        result.update(cut_at=cut_at, nodes=nodes, victim=nodes[1]["node_id"])
        driver.wait(30)
        return result
    finally:
        hosts.down()


def train_driver(address: str) -> None:
    """Runs inside h3: train_sync with one numpy trainer per node, printing ``ROW2`` once
    round 2 is reported (the parent then cuts h2's link) and the run's record at the end."""
    from helpers_modules.numpy_trainer import SigkillOnce, hard_blobs_dataset, softmax_model_fn

    import ddlf_actors as ddlf
    from ddlf_actors.apps import train_sync
    from ddlf_actors.apps.callbacks import Callback

    class Signal(Callback):
        def __init__(self):
            self.lost_at = None

        def on_row(self, row, run):
            if row["round"] == 2:
                print("ROW2 {}", flush=True)
                time.sleep(0.5)   # the parent cuts the link meanwhile

        def on_event(self, event, run):
            if event["kind"] == "trainer_lost" and self.lost_at is None:
                self.lost_at = time.time()

    ddlf.init(address=address)
    signal = Signal()
    result = train_sync(softmax_model_fn(64, 4), hard_blobs_dataset, workers=2,
                        master_epochs=4, rounds_per_epoch=3, trainer_cls=SigkillOnce,
                        progress=False, callbacks=[signal], trainer_options={
                            "runtime_env": {"env_vars": {"DDLF_TEST_FIT_SLEEP": "0.3"}}})
    print("RESULT " + json.dumps({"events": result.events, "lost_at": signal.lost_at,
                                  "history": [{k: r[k] for k in ("round", "workers", "samples",
                                                                 "test_accuracy")}
                                              for r in result.history]}), flush=True)
    ddlf.shutdown()


def _read_tagged(proc: subprocess.Popen, tag: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"driver exited before printing {tag} (code {proc.wait()})")
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    raise TimeoutError(f"no {tag} line from the driver within {timeout} s")


def driver(address: str) -> None:
    """Runs inside h3: a driver on its own host, talking to the cluster over the bridge."""
    import ddlf_actors as ddlf
    from ddlf_actors.runtime import context

    @ddlf.remote(num_cpus=1)
    class Probe:
        def where(self):
            return {"node_id": context.current.node_id, "pid": os.getpid()}

        def slow(self, s):
            time.sleep(s)
            return s

    ddlf.init(address=address)
    probes = [Probe.remote(), Probe.remote()]
    placed = ddlf.get([p.where.remote() for p in probes], timeout=60)
    print("READY " + json.dumps({"placed": placed, "nodes": [n["address"] for n in ddlf.nodes()]}),
          flush=True)
    victim = sys.stdin.readline().split()[1]
    doomed = next(p for p, w in zip(probes, placed) if w["node_id"] == victim)
    healthy = next(p for p, w in zip(probes, placed) if w["node_id"] != victim)
    pending = doomed.slow.remote(120)
    t0 = time.monotonic()
    seen_dead_after = None
    while time.monotonic() - t0 < 30:
        alive = {n["node_id"]: n["alive"] for n in ddlf.nodes()}
        if not alive.get(victim, True):
            seen_dead_after = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.1)
    try:
        ddlf.get(pending, timeout=30)
        pending_outcome = "returned"
    except ddlf.errors.ActorDiedError:
        pending_outcome = "ActorDiedError"
    except ddlf.errors.GetTimeoutError:
        pending_outcome = "hung"
    healthy_answer = ddlf.get(healthy.where.remote(), timeout=30)
    print("RESULT " + json.dumps({
        "victim": victim, "node_dead_after_s": seen_dead_after, "pending_call": pending_outcome,
        "healthy_still_answers": healthy_answer["node_id"] != victim,
        "cluster_cpus_after": ddlf.cluster_resources().get("CPU"),
    }), flush=True)
    ddlf.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "driver":
        driver(sys.argv[2])
    elif len(sys.argv) > 2 and sys.argv[1] == "train-driver":
        train_driver(sys.argv[2])
    else:
        why = netns_unavailable()
        if why:
            sys.exit(f"cannot run: {why}")
        print(json.dumps(run_scenario(verbose=True), indent=1))
