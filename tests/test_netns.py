"""Three hosts with distinct IPs in Linux network namespaces (runs as root, as CI does)."""

from __future__ import annotations

import pytest
from netns_cluster import netns_unavailable, run_scenario

_why = netns_unavailable()


@pytest.mark.skipif(_why is not None, reason=f"network namespaces unavailable: {_why}")
def test_cluster_across_namespaces_notices_a_cut_link(no_leaks):
    r = run_scenario(dead_after_s=3.0)
    placed = {p["node_id"] for p in r["ready"]["placed"]}
    assert placed == {n["node_id"] for n in r["nodes"]}, "one actor per node on distinct hosts"
    assert {a.split(":")[0] for a in r["ready"]["nodes"]} == {"10.213.0.2", "10.213.0.3"}
    assert r["head"].startswith("10.213.0.1:")
    # The cut node is declared dead by heartbeat timeout, well within the bound.
    assert r["node_dead_after_s"] is not None and r["node_dead_after_s"] < 10
    assert r["pending_call"] == "ActorDiedError"
    assert r["healthy_still_answers"] is True
    assert r["cluster_cpus_after"] == 1.0
