"""Two-node figures: calls and 100 MB transfers within one node and between two nodes.

    python benchmarks/runtime/multinode_bench.py [--quick] [--only ddlf] [--netns]

Both frameworks get a head plus two 1-CPU nodes on this machine, tagged with the
custom resources ``n0`` and ``n1`` so that actors can be pinned. A *caller* actor on
node 0 talks to a *callee* on node 0 (within) or node 1 (between):

* sync actor calls: the caller calls ``ping`` and waits, one at a time;
* 100 MB get: the callee returns a preallocated float32 array, the caller gets it;
* actor creation across nodes: 8 actors alternating between the nodes, until each
  has answered one call.

Ray's nodes come from ``ray.cluster_utils.Cluster``. With ``--netns`` (root only) DDLF's
head, nodes and driver run in separate network namespaces joined by a bridge, so
"between" crosses veth links and a bridge instead of one loopback device.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests"))

N_FLOATS = 25_000_000  # 100 MB of float32


def make_actors(fw):
    @fw.remote(num_cpus=0)
    class Callee:
        def __init__(self):
            self.arr = np.ones(N_FLOATS, dtype=np.float32)

        def ping(self):
            return 0

        def big(self):
            return self.arr

    @fw.remote(num_cpus=0)
    class Caller:
        def sync_calls(self, callee, seconds):
            fw.get(callee.ping.remote())
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                fw.get(callee.ping.remote())
                n += 1
            return n / (time.perf_counter() - t0)

        def fetch(self, callee, reps):
            fw.get(callee.big.remote())  # warm: first-touch page faults on both sides
            best = 0.0
            for _ in range(reps):
                t0 = time.perf_counter()
                arr = fw.get(callee.big.remote())
                dt = time.perf_counter() - t0
                assert arr.nbytes == N_FLOATS * 4
                del arr
                best = max(best, N_FLOATS * 4 / dt / 1e9)
            return best

        def ping(self):
            return 0

    return Caller, Callee


def run_workloads(fw, quick: bool) -> dict:
    Caller, Callee = make_actors(fw)
    secs, reps = (1.0, 2) if quick else (3.0, 5)
    out = {}
    caller = Caller.options(resources={"n0": 1}).remote()
    for label, tag in (("within one node", "n0"), ("between two nodes", "n1")):
        callee = Callee.options(resources={tag: 1}).remote()
        fw.get(callee.ping.remote())
        out[f"1:1 sync actor calls, {label}"] = (fw.get(caller.sync_calls.remote(callee, secs)), "calls/s")
        out[f"100 MB get, {label}"] = (fw.get(caller.fetch.remote(callee, reps)), "GB/s")
        fw.kill(callee)
    fw.kill(caller)
    rounds = 2 if quick else 4
    best = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        hs = [Callee.options(resources={f"n{i % 2}": 1}).remote() for i in range(8)]
        fw.get([h.ping.remote() for h in hs])
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
        for h in hs:
            fw.kill(h)
        time.sleep(0.5)
    out["create 8 actors across 2 nodes"] = (8 / best, "actors/s")
    return out


def run_ddlf(quick: bool, netns: bool) -> dict:
    import ddlf_actors as ddlf

    if netns:
        return _run_ddlf_netns(quick)
    from cluster_utils import MultiNodeCluster

    mc = MultiNodeCluster(node_cpus=(1, 1), node_resources=[{"n0": 100}, {"n1": 100}])
    try:
        ddlf.init(address=mc.address, token=mc.token)
        try:
            return run_workloads(ddlf, quick)
        finally:
            ddlf.shutdown()
    finally:
        mc.stop()


def _run_ddlf_netns(quick: bool) -> dict:
    import json
    import subprocess

    from netns_cluster import NetnsHosts, netns_unavailable

    from ddlf_actors.runtime.process import start_child as _start
    from ddlf_actors.runtime.wire.auth import generate_token

    why = netns_unavailable()
    if why:
        raise SystemExit(f"--netns: {why}")
    token = generate_token()
    env = {"DDLF_AUTH_TOKEN": token}
    hosts = NetnsHosts(4).up()
    try:
        head, info = _start(["ddlf_actors.runtime.head", "--host", hosts.ips[0], "--port", "0",
                             "--stdin-lifeline"], "head", prefix=hosts.prefix(0), env=env,
                            new_session=False)
        hosts.procs.append(head)
        for i in (1, 2):
            node, _ = _start(["ddlf_actors.runtime.node", "--address", info["address"], "--host",
                              hosts.ips[i], "--num-cpus", "1", "--stdin-lifeline", "--resources",
                              json.dumps({f"n{i - 1}": 100})], "node", prefix=hosts.prefix(i),
                             env=env, new_session=False)
            hosts.procs.append(node)
        code = ("import json,sys; sys.path.insert(0, {!r}); import multinode_bench as m, ddlf_actors as d;"
                "d.init(address={!r}); r=m.run_workloads(d, {!r}); d.shutdown();"
                "print('RESULT '+json.dumps(r))").format(HERE, info["address"], quick)
        out = subprocess.run([*hosts.prefix(3), sys.executable, "-c", code], capture_output=True,
                             text=True, env={**os.environ, **env}, timeout=600)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"netns driver failed:\n{out.stderr[-3000:]}")
        return {k: tuple(v) for k, v in json.loads(line[7:]).items()}
    finally:
        hosts.down()


def run_ray(quick: bool) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    c.add_node(num_cpus=1, resources={"n0": 100})
    c.add_node(num_cpus=1, resources={"n1": 100})
    try:
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        try:
            return run_workloads(ray, quick)
        finally:
            ray.shutdown()
    finally:
        c.shutdown()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", choices=["ddlf"], help="skip Ray")
    p.add_argument("--netns", action="store_true", help="DDLF nodes in network namespaces (root)")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = {"DDLF": run_ddlf(a.quick, a.netns)}
    if a.only != "ddlf":
        try:
            import ray  # noqa: F401

            results["Ray"] = run_ray(a.quick)
        except ImportError:
            pass
        except Exception as e:  # Ray failing must not hide DDLF's figures
            print(f"Ray run failed: {e!r}", file=sys.stderr)
    print_table(results, "two nodes in network namespaces" if a.netns else "two nodes on loopback")
    return results


def print_table(results: dict, setting: str) -> None:
    ddlf_res = results["DDLF"]
    ray_res = results.get("Ray")
    print(f"\nMulti-node microbenchmark ({setting}; {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]})")
    head = f"{'workload':44} {'DDLF':>14} {'Ray':>14} {'DDLF/Ray':>9}"
    print(head)
    print("-" * len(head))
    for name, (value, unit) in ddlf_res.items():
        if ray_res and name in ray_res:
            rv = ray_res[name][0]
            print(f"{name:44} {value:>9.4g} {unit:<4} {rv:>9.4g} {unit:<4} {value / rv:>8.2f}x")
        else:
            print(f"{name:44} {value:>9.4g} {unit:<4} {'-':>14} {'-':>9}")


if __name__ == "__main__":
    main()
