"""CI-sized run of benchmarks/chaos/fuzz_wire.py: 2,000 fuzzed connections against a live cluster.

The full run (10^5 cases, ~5 minutes) is the benchmark script; this one keeps the same
cases and checks in under 30 s: no server dies, every peer the protocol says must be
dropped is dropped, the well-formed controls get the right answer, the cluster still
answers an actor call, a task and a new actor, and no server keeps descriptors for the
connections once they are gone.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

import ddlf_actors as ddlf
from ddlf_actors.runtime import config
from ddlf_actors.runtime.client import current

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
from benchmarks.chaos import fuzz_cases  # noqa: E402
from benchmarks.chaos import fuzz_wire as fw  # noqa: E402

sys.path.remove(_ROOT)

CASES = 2000
SEED = 20240
# Descriptors a server may hold beyond its baseline once the fuzzing peers are gone
# (e.g. a connection still being torn down); a leak of one per case would be hundreds.
FD_SLACK = 8


def _targets(cluster) -> dict:
    Target, _square = fw.make_remotes()
    actor = Target.remote()
    worker_pid = ddlf.get(actor.pid.remote(), timeout=30)
    procs = current.get_core().cluster.procs
    (node,) = ddlf.nodes()
    whost, wport = fw.actor_address(actor._actor_id)
    hhost, hport = fw.split(cluster.address)
    nhost, nport = fw.split(node["address"])
    return actor, {
        "head": {"host": hhost, "port": hport, "pid": procs[0].pid},
        "node": {"host": nhost, "port": nport, "pid": procs[1].pid},
        "worker": {"host": whost, "port": wport, "pid": worker_pid},
    }


def _fds_settled(targets, before, deadline) -> dict:
    """Samples once every server is back within FD_SLACK of its baseline (or at deadline)."""
    while True:
        after = {k: fw.sample(t["pid"]) for k, t in targets.items()}
        settled = all(a["alive"] and a["fds"] <= before[k]["fds"] + FD_SLACK
                      for k, a in after.items())
        if settled or time.monotonic() > deadline:
            return after
        time.sleep(0.25)


@pytest.mark.timeout(90)
def test_fuzzed_connections_crash_nothing_and_leak_no_descriptors(cluster, tmp_path):
    fw._worker_logs_to(str(tmp_path / "worker.log"))  # the actor logs every aborted peer
    actor, targets = _targets(cluster)
    Target, square = fw.make_remotes()
    assert fw.cluster_still_works(actor, Target, square) == {
        "actor call": "ok", "task": "ok", "new actor": "ok"}
    time.sleep(0.5)
    before = {k: fw.sample(t["pid"]) for k, t in targets.items()}

    def check():
        return [f"{k} died" for k, t in targets.items() if not fw.alive(t["pid"])]

    start = time.monotonic()
    stats = asyncio.run(fw.fuzz(targets, cluster.token, n=CASES, seed=SEED, duration=25.0,
                                concurrency=32, check=check, check_every=2.0))
    elapsed = time.monotonic() - start

    assert not stats["problems"], stats["problems"]
    assert stats["cases"] == CASES, f"only {stats['cases']} cases in {elapsed:.0f} s"
    bad = [f"case {c.index} {c.kind} -> {c.target}: {c.outcome}: {c.detail}"
           for c in stats["failures"]]
    assert not bad, "\n".join(bad)
    # Every kind of case ran against every port (the generator did not starve one).
    assert {k for k, _t in stats["by_kind"]} == set(fuzz_cases.KINDS)
    assert {t for _k, t in stats["by_kind"]} == {"head", "node", "worker"}

    # Half-open handshakes are dropped by the server's handshake timeout at the latest.
    after = _fds_settled(targets, before,
                         time.monotonic() + config.HANDSHAKE_TIMEOUT_S + 3.0)
    for name, a in after.items():
        assert a["alive"], f"{name} died"
        assert a["fds"] <= before[name]["fds"] + FD_SLACK, (
            f"{name} holds {a['fds']} descriptors, {before[name]['fds']} before the run")
    assert fw.cluster_still_works(actor, Target, square) == {
        "actor call": "ok", "task": "ok", "new actor": "ok"}
