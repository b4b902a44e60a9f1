"""Placement groups: atomic reservation at the head, work drawing on bundles, removal."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from cluster_utils import MultiNodeCluster, joined
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors.errors import (
    ActorDiedError,
    ActorPlacementGroupRemovedError,
    TaskPlacementGroupRemovedError,
)
from ddlf_actors.runtime import placement
from ddlf_actors.runtime.head.placement_groups import Group, plan
from ddlf_actors.runtime.placement import PlacementStrategy
from ddlf_actors.runtime.states import GroupState
from ddlf_actors.util import (
    PlacementGroupSchedulingStrategy,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)


@ddlf.remote(num_cpus=1)
class Holder:
    def pid(self):
        return os.getpid()

    def group(self):
        g = get_current_placement_group()
        return g.id if g is not None else None

    def node(self):
        from ddlf_actors.runtime import context

        return context.current.node_id


@ddlf.remote(num_cpus=1)
def current_group():
    g = get_current_placement_group()
    return g.id if g is not None else None


@ddlf.remote(num_cpus=1)
def parent_spawning_child():
    """Runs in a group; its child (no strategy given) reports the group it landed in."""
    return ddlf.get(current_group.remote(), timeout=20)


@ddlf.remote(num_cpus=2)
def two_cpus():
    return True


def _in(pg, index=-1, capture=None):
    return PlacementGroupSchedulingStrategy(pg, index, capture)


def _state(pg):
    return placement_group_table(pg)["state"]


# -- planning: pure, no processes --------------------------------------------------------------

class FakeNode:
    def __init__(self, name, cpus):
        self.node_id = name
        self.total = {"CPU": float(cpus)}
        self.available = dict(self.total)
        self.alive = True


def _names(nodes):
    return [n.node_id for n in nodes] if nodes is not None else None


@pytest.mark.parametrize("strategy,cpus,bundles,expected", [
    ("STRICT_PACK", (4, 4), [1, 1, 1], ["a", "a", "a"]),
    ("STRICT_PACK", (2, 2), [1, 1, 1], None),                 # no single node holds 3
    ("PACK", (2, 2), [1, 1, 1], ["a", "a", "b"]),             # falls back to two nodes
    ("STRICT_SPREAD", (1, 1), [1, 1], ["a", "b"]),
    ("STRICT_SPREAD", (4, 4), [1, 1, 1], None),               # 3 bundles, 2 nodes
    ("SPREAD", (4, 4), [1, 1, 1], ["a", "b", "a"]),           # shares once every node is used
])
def test_plan_meets_each_strategy(strategy, cpus, bundles, expected):
    nodes = [FakeNode(n, c) for n, c in zip("ab", cpus)]
    got = plan([{"CPU": float(b)} for b in bundles], PlacementStrategy(strategy), nodes)
    assert _names(got) == expected
    assert [n.available for n in nodes] == [n.total for n in nodes]   # planning reserves nothing


def test_plan_keeps_placed_bundles_and_spreads_away_from_them():
    a, b, c = FakeNode("a", 2), FakeNode("b", 2), FakeNode("c", 2)
    got = plan([{"CPU": 1.0}] * 3, PlacementStrategy.STRICT_SPREAD, [a, b, c],
               fixed=[a, None, c])
    assert _names(got) == ["a", "b", "c"]


def test_commit_is_all_or_nothing_and_release_gives_everything_back():
    a = FakeNode("a", 2)
    g = Group("g", [{"CPU": 1.0}, {"CPU": 1.0}], PlacementStrategy.PACK)
    assert plan(g.bundles, g.strategy, [a]) is not None
    a.available["CPU"] = 1.0   # someone took one CPU: the group must not half-reserve
    assert plan(g.bundles, g.strategy, [a]) is None
    a.available["CPU"] = 2.0
    g.commit(plan(g.bundles, g.strategy, [a]))
    assert g.state is GroupState.CREATED and a.available == {"CPU": 0.0}
    g.release()
    assert a.available == {"CPU": 2.0}


@pytest.mark.parametrize("bundles,strategy,match", [
    ([], "PACK", "non-empty list"),
    ([{}], "PACK", "bundle 0 is empty"),
    ([{"CPU": 0}], "PACK", "bundle 0 is empty"),
    ([{"CPU": -1}], "PACK", "amounts must be >= 0"),
    ([{"CPU": "one"}], "PACK", "amounts are numbers"),
    ("CPU", "PACK", "must be a list"),
    ([{"CPU": 1}], "PACKED", "unknown placement strategy 'PACKED'"),
])
def test_bad_input_is_a_value_error_before_any_cluster(bundles, strategy, match):
    with pytest.raises(ValueError, match=match):
        placement_group(bundles, strategy=strategy)
    assert not ddlf.is_initialized()


def test_strategy_validates_its_arguments():
    with pytest.raises(ValueError, match="must be a PlacementGroup"):
        PlacementGroupSchedulingStrategy("pg")
    with pytest.raises(ValueError, match="bundle_index"):
        PlacementGroupSchedulingStrategy(None, -2)


# -- on a cluster ----------------------------------------------------------------------------

def test_group_reserves_its_bundles_and_ready_resolves(cluster):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], name="both")
    assert ddlf.get(pg.ready(), timeout=20) == pg
    assert pg.wait(5)
    view = placement_group_table(pg)
    assert view["state"] == "CREATED" and view["bundles"] == {0: {"CPU": 1.0}, 1: {"CPU": 1.0}}
    assert len(view["bundles_to_node_id"]) == 2
    assert ddlf.available_resources().get("CPU", 0.0) == 0.0
    assert get_placement_group("both") == pg
    with pytest.raises(Exception, match="named 'both' already exists"):
        placement_group([{"CPU": 1}], name="both")
    remove_placement_group(pg)
    assert _state(pg) == "REMOVED"
    assert wait_for(lambda: ddlf.available_resources().get("CPU") == 2.0, timeout=10)
    with pytest.raises(ValueError, match="no placement group named 'both'"):
        get_placement_group("both")


def test_group_that_does_not_fit_waits_whole_then_is_placed(cluster):
    holder = Holder.remote()
    ddlf.get(holder.pid.remote(), timeout=20)
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    assert not pg.wait(0.5)
    assert _state(pg) == "PENDING"
    assert placement_group_table(pg)["stats"]["scheduling_state"] == "NO_RESOURCES"
    # All or nothing: the free CPU was not taken by half of the group.
    assert ddlf.available_resources().get("CPU") == 1.0
    ddlf.kill(holder)
    assert pg.wait(20)


def test_group_that_can_never_fit_warns_and_stays_pending(cluster):
    with pytest.warns(UserWarning, match="cannot fit the nodes alive now"):
        pg = placement_group([{"CPU": 3}])
    assert placement_group_table(pg)["stats"]["scheduling_state"] == "INFEASIBLE"
    with pytest.raises(ddlf.errors.GetTimeoutError):
        ddlf.get(pg.ready(), timeout=0.5)
    remove_placement_group(pg)


def test_a_group_of_many_bundles_is_described_by_count(cluster):
    with pytest.warns(UserWarning, match="cannot fit") as caught:
        pg = placement_group([{"CPU": 1}] * 99, strategy="SPREAD")
    text = str(caught[0].message)
    assert "99 × {CPU: 1}" in text and len(text) < 400, text
    assert repr(pg) == f"PlacementGroup({pg.id}, 99 × {{CPU: 1}})"
    remove_placement_group(pg)


def test_describe_bundles_counts_runs_of_equal_bundles():
    describe = placement.describe_bundles
    assert describe([{"CPU": 1.0}] * 3) == "3 × {CPU: 1}"
    assert describe([{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0, "GPU": 0.5}, {"CPU": 1.0}]) == (
        "2 × {CPU: 1}, 1 × {CPU: 1, GPU: 0.5}, 1 × {CPU: 1}")   # in order: indexes matter
    assert describe([{"CPU": 2.0, "memory": 3 * 2.0 ** 30}]) == "1 × {CPU: 2, memory: 3 GiB}"
    assert describe([]) == ""


def test_work_draws_on_the_bundle_not_the_node(cluster):
    pg = placement_group([{"CPU": 2}])
    assert pg.wait(20)
    # The node has no CPU free, yet a 2-CPU task in the group runs (Ray's
    # original_resource_unavailable example) ...
    assert ddlf.get(two_cpus.options(scheduling_strategy=_in(pg)).remote(), timeout=20)
    a = Holder.options(scheduling_strategy=_in(pg, 0)).remote()
    assert ddlf.get(a.group.remote(), timeout=20) == pg.id
    # ... and one outside the group waits.
    outside = current_group.remote()
    ready, _ = ddlf.wait([outside], timeout=1.0)
    assert not ready
    remove_placement_group(pg)
    assert ddlf.get(outside, timeout=20) is None


def test_demand_bigger_than_the_bundle_is_a_clear_error(cluster):
    pg = placement_group([{"CPU": 1}])
    with pytest.raises(ValueError, match=r"asks for \{'CPU': 2.0\}.*does not fit in any bundle"):
        two_cpus.options(scheduling_strategy=_in(pg)).remote()
    with pytest.raises(ValueError, match="does not fit in bundle 0"):
        Holder.options(num_cpus=2, scheduling_strategy=_in(pg, 0)).remote()
    with pytest.raises(ValueError, match="out of range"):
        Holder.options(scheduling_strategy=_in(pg, 3)).remote()
    remove_placement_group(pg)


def test_removing_a_group_kills_its_actors_and_fails_its_waiting_tasks(cluster):
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(20)
    a = Holder.options(scheduling_strategy=_in(pg, 0)).remote()
    pid = ddlf.get(a.pid.remote(), timeout=20)
    # The bundle's CPU is the actor's: this task waits in the group.
    waiting = current_group.options(scheduling_strategy=_in(pg)).remote()
    assert not ddlf.wait([waiting], timeout=0.5)[0]
    remove_placement_group(pg)
    with pytest.raises(TaskPlacementGroupRemovedError, match="has been removed"):
        ddlf.get(waiting, timeout=20)
    with pytest.raises(ActorPlacementGroupRemovedError, match="placement group .* was removed"):
        ddlf.get(a.pid.remote(), timeout=20)
    assert issubclass(ActorPlacementGroupRemovedError, ActorDiedError)
    assert wait_for(lambda: not _alive(pid), timeout=10)
    # Work scheduled in a removed group fails the same way.
    with pytest.raises(TaskPlacementGroupRemovedError):
        ddlf.get(current_group.options(scheduling_strategy=_in(pg)).remote(), timeout=20)


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_child_tasks_join_the_group_only_when_captured(cluster):
    pg = placement_group([{"CPU": 2}])
    assert pg.wait(20)
    # Parent and child take one CPU each out of the 2-CPU bundle (the whole node).
    captured = parent_spawning_child.options(scheduling_strategy=_in(pg, capture=True)).remote()
    assert ddlf.get(captured, timeout=30) == pg.id
    remove_placement_group(pg)
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(20)
    # Without capture the child runs outside the group, on the node's other CPU.
    free = parent_spawning_child.options(scheduling_strategy=_in(pg)).remote()
    assert ddlf.get(free, timeout=30) is None
    assert get_current_placement_group() is None   # a driver is in no group
    remove_placement_group(pg)


def test_a_driver_that_exits_frees_its_groups_unless_detached(cluster):
    script = textwrap.dedent(f"""
        import ddlf_actors as ddlf
        from ddlf_actors.util import placement_group
        ddlf.init(address={cluster.address!r}, token={cluster.token!r})
        assert placement_group([{{"CPU": 1}}], name="mine").wait(20)
        assert placement_group([{{"CPU": 1}}], name="kept", lifetime="detached").wait(20)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    kept = get_placement_group("kept")
    assert wait_for(lambda: not _named("mine"), timeout=10), "the driver's group outlived it"
    assert _state(kept) == "CREATED"
    assert ddlf.available_resources().get("CPU") == 1.0
    remove_placement_group(kept)


def _named(name):
    try:
        return get_placement_group(name)
    except ValueError:
        return None


# -- several nodes ---------------------------------------------------------------------------

@pytest.fixture
def two_nodes(no_leaks):
    with joined(MultiNodeCluster(node_cpus=(1, 1))) as c:
        yield c


def test_strategies_on_two_nodes_and_rescheduling_after_a_node_dies(two_nodes):
    with pytest.warns(UserWarning, match="cannot fit"):
        pack = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_PACK")
    assert placement_group_table(pack)["stats"]["scheduling_state"] == "INFEASIBLE"
    remove_placement_group(pack)
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(20)
    actors = [Holder.options(scheduling_strategy=_in(pg, i)).remote() for i in range(2)]
    nodes = ddlf.get([a.node.remote() for a in actors], timeout=30)
    assert len(set(nodes)) == 2
    assert set(placement_group_table(pg)["bundles_to_node_id"].values()) == set(nodes)
    # The node of bundle 1 dies: the group goes back to waiting, then a new node holds it.
    victim = next(i for i, n in enumerate(two_nodes.nodes) if n["node_id"] == nodes[1])
    two_nodes.kill_node(victim)
    assert wait_for(lambda: _state(pg) == "RESCHEDULING", timeout=15)
    two_nodes.add_node(1)
    assert pg.wait(30)
    where = placement_group_table(pg)["bundles_to_node_id"]
    assert where[0] == nodes[0] and where[1] not in nodes
    remove_placement_group(pg)


def test_actor_waiting_for_its_group_fails_when_the_group_is_removed(cluster):
    # A bundle asking for a resource no node has never fits; an actor in it waits with it.
    with pytest.warns(UserWarning, match="cannot fit"):
        pg = placement_group([{"CPU": 1, "GPU": 1}])
    a = Holder.options(num_cpus=0, scheduling_strategy=_in(pg)).remote()
    call = a.pid.remote()
    assert not ddlf.wait([call], timeout=0.5)[0]
    remove_placement_group(pg)
    with pytest.raises(ActorPlacementGroupRemovedError):
        ddlf.get(call, timeout=20)
