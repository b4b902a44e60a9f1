"""Three hosts with distinct IPs in Linux network namespaces (runs as root, as CI does)."""

from __future__ import annotations

import pytest
from netns_cluster import netns_unavailable, run_scenario, run_training_scenario

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


@pytest.mark.timeout(240)
@pytest.mark.skipif(_why is not None, reason=f"network namespaces unavailable: {_why}")
def test_training_survives_a_node_whose_link_is_cut(no_leaks):
    r = run_training_scenario(dead_after_s=3.0)
    lost = [e for e in r["events"] if e["kind"] == "trainer_lost"]
    assert len(lost) == 1 and lost[0]["node"] == r["victim"]
    # Silence, not a closed connection: noticed at the node-dead timeout, not before.
    detected = r["lost_at"] - r["cut_at"]
    assert 2.0 <= detected < 10, detected
    rounds = [h["round"] for h in r["history"]]
    assert rounds == list(range(1, 13))                      # every round completed
    assert [h["workers"] for h in r["history"]][-1] == 1     # h2 never came back
    assert r["history"][-1]["test_accuracy"] > 0.5
