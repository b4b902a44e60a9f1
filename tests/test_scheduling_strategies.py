"""Scheduling strategies: DEFAULT, SPREAD, node affinity (hard and soft), node:<ip>."""

from __future__ import annotations

import pytest
from cluster_utils import MultiNodeCluster, joined

import ddlf_actors as ddlf
from ddlf_actors.errors import UnschedulableError
from ddlf_actors.runtime.head.nodes import NodeTable
from ddlf_actors.runtime.head.placement_groups import PlacementGroupManager
from ddlf_actors.runtime.head.scheduler import Scheduler, WorkKind
from ddlf_actors.runtime.scheduling import Scheduling
from ddlf_actors.util import NodeAffinitySchedulingStrategy


@ddlf.remote(num_cpus=1)
def where():
    from ddlf_actors.runtime import context

    return context.current.node_id


@ddlf.remote(num_cpus=0)
class Where:
    def node(self):
        from ddlf_actors.runtime import context

        return context.current.node_id


def _hard(node_id):
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def _soft(node_id, spill=False):
    return NodeAffinitySchedulingStrategy(node_id, soft=True, _spill_on_unavailable=spill)


# -- the head's choice, in-process (no sockets) ---------------------------------------------

@pytest.fixture
def head():
    """The head's scheduler over two nodes, 'big' (8 CPUs) and 'small' (2), no processes."""
    nodes = NodeTable(dead_after_missed=10)
    for name, cpus in (("big", 8), ("small", 2)):
        nodes.register({"node_id": name, "address": f"{name}:1",
                        "resources": {"CPU": float(cpus)}}, None)
    return Scheduler(nodes, PlacementGroupManager(keep_removed=10))


def _take(scheduler, sched, n, demand=None):
    out = []
    for _ in range(n):
        got = scheduler.try_place(demand or {"CPU": 1.0}, Scheduling.from_wire(sched),
                                  WorkKind.TASK)
        out.append(got[0].node_id if got else None)
    return out


def _node(scheduler, name):
    return scheduler.nodes.get(name)


def test_spread_round_robins_where_default_fills_the_emptiest(head):
    assert _take(head, {"strategy": "SPREAD"}, 4) == ["big", "small", "big", "small"]
    for n in head.nodes.alive():
        n.available = dict(n.total)
    # DEFAULT picks the largest free fraction: the 8-CPU node takes most of the work.
    assert _take(head, None, 4) == ["big", "small", "big", "big"]


def test_spread_skips_nodes_without_room(head):
    _node(head, "small").available["CPU"] = 0.0
    assert _take(head, {"strategy": "SPREAD"}, 3) == ["big", "big", "big"]


def test_hard_affinity_fails_for_an_unknown_dead_or_too_small_node(head):
    with pytest.raises(UnschedulableError, match="not in this cluster"):
        _take(head, {"node_id": "nope"}, 1)
    head.nodes.mark_dead(_node(head, "small"))
    with pytest.raises(UnschedulableError, match="which is dead"):
        _take(head, {"node_id": "small"}, 1)
    with pytest.raises(UnschedulableError, match="more than any node has"):
        _take(head, {"node_id": "big"}, 1, {"CPU": 16.0})


def test_soft_affinity_falls_back_when_the_node_is_gone_or_too_small(head):
    assert _take(head, {"node_id": "nope", "soft": True}, 1) == ["big"]
    assert _take(head, {"node_id": "small", "soft": True}, 1, {"CPU": 4.0}) == ["big"]
    head.nodes.mark_dead(_node(head, "small"))
    assert _take(head, {"node_id": "small", "soft": True}, 1) == ["big"]


def test_affinity_to_a_busy_node_waits_unless_told_otherwise(head):
    _node(head, "small").available["CPU"] = 0.0
    # As in Ray: a live node that can hold the demand is waited for, soft or hard.
    assert _take(head, {"node_id": "small"}, 1) == [None]
    assert _take(head, {"node_id": "small", "soft": True}, 1) == [None]
    assert _take(head, {"node_id": "small", "soft": True, "spill": True}, 1) == ["big"]
    with pytest.raises(UnschedulableError, match="fail rather than wait"):
        _take(head, {"node_id": "small", "fail": True}, 1)


# -- options ---------------------------------------------------------------------------------

def test_bad_strategies_are_value_errors():
    with pytest.raises(ValueError, match="scheduling_strategy must be"):
        where.options(scheduling_strategy="FAST")
    with pytest.raises(ValueError, match="either node_id=... or scheduling_strategy"):
        Where.options(node_id="x", scheduling_strategy="SPREAD")
    with pytest.raises(ValueError, match="node_id must be a node id"):
        NodeAffinitySchedulingStrategy(None, soft=True)


# -- on real nodes ---------------------------------------------------------------------------

@pytest.fixture
def two_nodes(no_leaks):
    with joined(MultiNodeCluster(node_cpus=(2, 2))) as c:
        yield c


def test_tasks_and_actors_follow_node_affinity_and_spread(two_nodes):
    ids = [n["node_id"] for n in two_nodes.nodes]
    for node_id in ids:
        assert ddlf.get(where.options(scheduling_strategy=_hard(node_id)).remote(),
                        timeout=30) == node_id
        a = Where.options(scheduling_strategy=_soft(node_id)).remote()
        assert ddlf.get(a.node.remote(), timeout=30) == node_id
    # Soft affinity to a node that is not there runs elsewhere; hard affinity fails.
    assert ddlf.get(where.options(scheduling_strategy=_soft("gone")).remote(),
                    timeout=30) in ids
    a = Where.options(scheduling_strategy=_soft("gone")).remote()
    assert ddlf.get(a.node.remote(), timeout=30) in ids
    with pytest.raises(UnschedulableError, match="pinned to node gone"):
        ddlf.get(where.options(scheduling_strategy=_hard("gone")).remote(), timeout=30)
    spread = [Where.options(scheduling_strategy="SPREAD").remote() for _ in range(4)]
    placed = ddlf.get([s.node.remote() for s in spread], timeout=30)
    assert sorted(placed) == sorted(ids * 2)


def test_node_ip_resource_is_offered_and_an_absent_one_fails_at_get(cluster):
    assert ddlf.get(where.options(resources={"node:127.0.0.1": 0.01}).remote(), timeout=30)
    # As in Ray, .remote() returns a ref (Ray then waits forever; DDLF fails it at get).
    ref = where.options(resources={"node:127.0.0.3": 1}).remote()
    with pytest.raises(UnschedulableError, match="node:127.0.0.3"):
        ddlf.get(ref, timeout=20)


def test_compat_driver_node_id_names_the_local_node(cluster):
    from ddlf_actors.compat import ray

    node_id = ray.get_runtime_context().get_node_id()
    assert node_id == ddlf.nodes()[0]["node_id"]
    f = ray.remote(where._fn).options(
        scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            node_id=node_id, soft=False))
    assert ddlf.get(f.remote(), timeout=30) == node_id
