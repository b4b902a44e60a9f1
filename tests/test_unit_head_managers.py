"""The head's managers, one by one, with no event loop, sockets or processes.

Each holds one concern's state (runtime/head/): nodes and their liveness, actors and
their names and restarts, task leases, placement groups, the scheduling policy, the
runtime_env packages and the log fan-out. The shell that wires them to the network is
tested in test_unit_head.py.
"""

from __future__ import annotations

import hashlib
import logging

import pytest

from ddlf_actors.runtime.errors import (
    ActorNameTakenError,
    ActorPlacementGroupRemovedError,
    DDLFError,
    TaskPlacementGroupRemovedError,
    UnschedulableError,
)
from ddlf_actors.runtime.head.actors import ActorDirectory
from ddlf_actors.runtime.head.leases import LeaseManager
from ddlf_actors.runtime.head.logs import LogFanout, WarnLimiter
from ddlf_actors.runtime.head.nodes import NodeTable
from ddlf_actors.runtime.head.packages import PackageStore
from ddlf_actors.runtime.head.placement_groups import PlacementGroupManager
from ddlf_actors.runtime.head.scheduler import Scheduler, WorkKind, actor_load
from ddlf_actors.runtime.placement import PlacementStrategy
from ddlf_actors.runtime.scheduling import Scheduling, Strategy
from ddlf_actors.runtime.states import ActorState, GroupState
from ddlf_actors.runtime.wire.messages import ActorCreation, ActorDeath, ActorStarted, LogBatch


def nodes_of(*cpus, dead_after=3) -> NodeTable:
    """A table of nodes n0, n1, ... with these CPU counts, joined in that order."""
    table = NodeTable(dead_after_missed=dead_after)
    for i, c in enumerate(cpus):
        table.register({"node_id": f"n{i}", "address": f"10.0.0.{i}:1",
                        "resources": {"CPU": float(c)}}, conn=None)
    return table


def creation(actor_id: str, name=None, max_restarts=0, group=None) -> ActorCreation:
    return ActorCreation(actor_id, "Counter", [b"class"], [b"args"], {"CPU": 1.0},
                         max_restarts=max_restarts, name=name,
                         scheduling=Scheduling(group_id=group) if group else None)


# -- NodeTable -----------------------------------------------------------------------------------
def test_a_node_is_dead_after_missing_more_than_its_limit_of_ticks_in_a_row():
    table = nodes_of(1, 1, dead_after=2)
    n0, n1 = table.get("n0"), table.get("n1")
    assert table.tick() == [] and table.tick() == []
    n1.heard()                              # anything from n1 resets its count
    assert table.tick() == [n0]             # n0: 3 misses > 2
    assert table.mark_dead(n0) and not table.mark_dead(n0)
    assert table.alive() == [n1] and table.dead_count() == 1
    assert table.tick() == [] and table.tick() == [n1]   # a dead node is not counted


def test_totals_and_sums_cover_live_nodes_only_and_skip_node_markers():
    table = NodeTable(dead_after_missed=3)
    for i, res in enumerate(({"CPU": 2.0, "node:10.0.0.1": 1.0}, {"CPU": 4.0, "GPU": 1.0})):
        table.register({"node_id": f"n{i}", "address": "a:1", "resources": res}, None)
    table.get("n1").available["CPU"] = 1.0
    assert table.cluster_resources() == {"CPU": 6.0, "GPU": 1.0}
    assert table.available_resources() == {"CPU": 3.0, "GPU": 1.0}
    table.mark_dead(table.get("n1"))
    assert table.totals() == [{"CPU": 2.0, "node:10.0.0.1": 1.0}]
    assert [n["alive"] for n in table.public()] == [True, False]   # ddlf.nodes() lists both


# -- ActorDirectory ----------------------------------------------------------------------------
def test_a_name_is_held_by_a_reservation_then_its_actor_until_it_dies():
    d = ActorDirectory(keep_dead=100)
    d.reserve("svc", "a1", "Counter", {"inc": False}, owner="o1")
    assert d.named("svc") == {"actor_id": "a1", "class_name": "Counter",
                              "methods": {"inc": False}}
    with pytest.raises(ActorNameTakenError):
        d.reserve("svc", "a2", "Counter", {}, owner="o2")
    assert not d.release("a1", owner="o2")     # only its owner gives it back
    a = d.add(creation("a1", name="svc"), owner="o1")
    assert d.reserved == {} and d.named("svc")["state"] == "PENDING"
    with pytest.raises(ActorNameTakenError):
        d.add(creation("a2", name="svc"), owner="o2")
    d.mark_dead(a, ActorDeath.of("killed"))
    assert d.named("svc") is None
    d.add(creation("a3", name="svc"), owner="o2")
    assert d.names == {"svc": "a3"}


def test_a_released_reservation_frees_its_name_and_wakes_its_waiters():
    d = ActorDirectory(keep_dead=100)
    d.reserve("q", "a1", "Queue", {}, owner="o1")
    created = d.reserved["a1"].created
    assert d.release("a1", owner="o1")
    assert created.is_set() and d.names == {} and d.reserved_by("o1") == []


@pytest.mark.parametrize("max_restarts,losses,expected", [
    (0, 1, [False]),
    (2, 3, [True, True, False]),
    (-1, 4, [True, True, True, True]),   # -1: unlimited, as in Ray
])
def test_a_lost_actor_restarts_while_max_restarts_allows(max_restarts, losses, expected):
    d = ActorDirectory(keep_dead=100)
    a = d.add(creation("a1", max_restarts=max_restarts), owner=None)
    got = []
    for _ in range(losses):
        d.started(a, ActorStarted(True, address="h:1", pid=1, worker_id="w"))
        restarts = d.lost(a)
        got.append(restarts)
        assert a.state is (ActorState.RESTARTING if restarts else ActorState.ALIVE)
    assert got == expected and a.epoch == losses


def test_a_killed_actor_does_not_restart():
    d = ActorDirectory(keep_dead=100)
    a = d.add(creation("a1", max_restarts=5), owner=None)
    a.killed = True
    assert d.lost(a) is False and a.restarts_left == 5


def test_dead_records_are_bounded_and_keep_no_pickled_class_or_arguments():
    d = ActorDirectory(keep_dead=2)
    records = [d.add(creation(f"a{i}", name=f"n{i}"), owner=None) for i in range(4)]
    forgotten = []
    for a in records:
        forgotten += d.mark_dead(a, ActorDeath.of("gone"))
    assert forgotten == ["a0", "a1"] and sorted(d.actors) == ["a2", "a3"]
    assert d.mark_dead(records[3], ActorDeath.of("again")) == []   # counted once
    kept = d.get("a3").creation
    assert kept.class_segments == [] and kept.args_segments == [] and kept.objects is None
    view = d.get("a2").view()   # still says what it was and why it died
    assert view["state"] == "DEAD" and view["error"]["reason"] == "gone"
    assert view["class_name"] == "Counter" and d.names == {}


def test_a_started_actor_keeps_its_arguments_only_while_it_may_restart():
    d = ActorDirectory(keep_dead=10)
    once = d.add(creation("a1", max_restarts=0), owner=None)
    twice = d.add(creation("a2", max_restarts=1), owner=None)
    up = ActorStarted(True, address="h:1", pid=1, worker_id="w")
    d.started(once, up)
    d.started(twice, up)
    assert once.creation.args_segments == [] and twice.creation.args_segments == [b"args"]
    assert d.lost(twice) and twice.creation.class_segments == [b"class"]   # restarts with them
    d.started(twice, up)   # its last start: never needed again
    assert twice.creation.args_segments == [] and twice.restarts_left == 0


def test_queries_by_owner_group_and_node():
    d = ActorDirectory(keep_dead=100)
    table = nodes_of(4)
    node = table.get("n0")
    a1 = d.add(creation("a1", group="g1"), owner="o1")
    a2 = d.add(creation("a2"), owner="o1")
    a2.detached = True
    a3 = d.add(creation("a3", group="g1"), owner="o2")
    for a in (a1, a3):
        a.node = node
        node.actors.add(a.actor_id)
    d.mark_dead(a3, ActorDeath.of("gone"))
    assert d.owned_by("o1") == [a1]           # detached ones outlive their owner
    assert d.in_group("g1") == [a1]           # dead ones are done with
    assert d.on_node(node) == [a1]
    assert d.detach(a1) is None and a1.node is None and node.actors == {"a3"}


# -- LeaseManager ------------------------------------------------------------------------------
def test_a_lease_is_found_by_its_worker_and_lent_within_the_per_node_bound():
    table = nodes_of(4, 4)
    n0, n1 = table.get("n0"), table.get("n1")
    leases = LeaseManager(max_lent_per_node=1)
    l1 = leases.grant(n0, n0, {"CPU": 1.0}, "w1", owner="o1")
    l2 = leases.grant(n0, n0, {"CPU": 1.0}, "w2", owner="o1")
    l3 = leases.grant(n1, n1, {"CPU": 1.0}, "w3", owner="o2")
    assert leases.of_worker("w2") is l2
    assert leases.lend("w1") is l1 and leases.lend("w1") is None   # once
    assert leases.lend("w2") is None       # n0 lends one at most: w2 keeps its CPU
    assert leases.lend("w3") is l3         # another node
    assert leases.unlend("w1") is l1 and leases.lend("w2") is l2
    assert leases.pop(l2.lease_id) is l2 and l2.lent   # the caller gives nothing back twice
    assert leases.lend("w1") is l1         # w2's lend was counted back
    assert leases.owned_by("o1") == [l1] and leases.on_node(n1) == [l3]
    assert leases.of_worker("w2") is None and leases.pop(l2.lease_id) is None


# -- PlacementGroupManager -----------------------------------------------------------------------
def test_groups_wait_until_they_fit_and_are_placed_oldest_first():
    table = nodes_of(2)
    groups = PlacementGroupManager(keep_removed=10)
    big = groups.create([{"CPU": 2.0}, {"CPU": 1.0}], PlacementStrategy.PACK, "", "o1", False)
    small = groups.create([{"CPU": 2.0}], PlacementStrategy.PACK, "svc", "o1", False)
    assert groups.place_waiting(table.alive()) == [small]   # the big one does not hold it up
    assert groups.view(big, table.alive())["stats"] == {"scheduling_state": "INFEASIBLE"}
    assert groups.view(small, table.alive())["stats"] == {"scheduling_state": "FINISHED"}
    with pytest.raises(DDLFError, match="named 'svc' already exists"):
        groups.create([{"CPU": 1.0}], PlacementStrategy.PACK, "svc", None, False)
    assert groups.named("svc") is small and table.get("n0").available == {"CPU": 0.0}


def test_a_node_death_reschedules_its_bundles_and_removal_gives_them_back():
    table = nodes_of(2, 2)
    groups = PlacementGroupManager(keep_removed=1)
    g = groups.create([{"CPU": 1.0}, {"CPU": 1.0}], PlacementStrategy.STRICT_SPREAD, "x",
                      None, False)
    groups.place_waiting(table.alive())
    n0, n1 = table.get("n0"), table.get("n1")
    table.mark_dead(n0)
    assert groups.node_died(n0) == [g] and g.state is GroupState.RESCHEDULING
    assert groups.waiting == {g.group_id: g}
    groups.mark_removed(g)
    assert groups.waiting == {} and groups.named("x") is None
    groups.release(g)
    assert n1.available == {"CPU": 2.0}
    old = g
    g2 = groups.create([{"CPU": 1.0}], PlacementStrategy.PACK, "", None, False)
    groups.mark_removed(g2)
    groups.release(g2)
    assert groups.get(old.group_id) is None and groups.get(g2.group_id) is g2   # keep 1


# -- Scheduler -------------------------------------------------------------------------------------
def test_default_takes_the_least_loaded_node_and_spread_goes_round_robin():
    table = nodes_of(4, 4, 4)
    s = Scheduler(table, PlacementGroupManager(keep_removed=10))
    zero = {"CPU": 0.0}
    got = []
    for _ in range(4):   # no CPU asked: the node with the fewest actors wins, oldest first
        node, _ = s.try_place(zero, None, WorkKind.ACTOR, load_key=actor_load)
        node.actors.add(str(len(got)))
        got.append(node.node_id)
    assert got == ["n0", "n1", "n2", "n0"]
    spread = Scheduling(strategy=Strategy.SPREAD)
    assert [s.try_place({"CPU": 1.0}, spread, WorkKind.TASK)[0].node_id
            for _ in range(4)] == ["n0", "n1", "n2", "n0"]


def _place_one_by_one(scheduler, requests):
    out = []
    for i, (demand, sched, what) in enumerate(requests):
        try:
            got = scheduler.try_place(demand, sched, WorkKind.ACTOR, what, actor_load)
        except UnschedulableError as e:
            got = e
        if isinstance(got, tuple):
            got[0].actors.add(f"x{i}")
        out.append(got)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_a_batch_places_as_one_request_after_another_would(seed):
    import random

    rng = random.Random(seed)
    cpus = [rng.choice([0, 1, 2, 4]) for _ in range(rng.randint(1, 12))]
    preload = [rng.randint(0, 3) for _ in cpus]
    kinds = [None, None, None, Scheduling(strategy=Strategy.SPREAD),
             Scheduling(node_id="n0", soft=True, spill=True), Scheduling(node_id="n1")]
    requests = [({"CPU": float(rng.choice([0, 0, 1, 2, 8]))}, rng.choice(kinds), None)
                for _ in range(rng.randint(1, 40))]

    def fresh():
        table = nodes_of(*cpus)
        for n, k in zip(table.alive(), preload):
            n.actors.update(f"old{i}" for i in range(k))
        return Scheduler(table, PlacementGroupManager(keep_removed=10))

    one_by_one, batch = fresh(), fresh()
    expected = _place_one_by_one(one_by_one, requests)
    got = batch.place_batch(requests, WorkKind.ACTOR, actor_load)

    def summary(results):
        return [r[0].node_id if isinstance(r, tuple) else type(r).__name__ for r in results]

    assert summary(got) == summary(expected)
    assert [n.available for n in batch.nodes.alive()] == \
        [n.available for n in one_by_one.nodes.alive()]


def test_a_removed_group_fails_actors_and_tasks_with_their_own_error_type():
    table = nodes_of(2)
    groups = PlacementGroupManager(keep_removed=10)
    g = groups.create([{"CPU": 1.0}], PlacementStrategy.PACK, "", None, False)
    groups.place_waiting(table.alive())
    s = Scheduler(table, groups)
    in_g = Scheduling(group_id=g.group_id, bundle_index=0)
    node, charge = s.try_place({"CPU": 1.0}, in_g, WorkKind.TASK)
    assert charge.group is g and s.try_place({"CPU": 1.0}, in_g, WorkKind.TASK) is None
    s.free(charge, {"CPU": 1.0})
    groups.mark_removed(g)
    with pytest.raises(ActorPlacementGroupRemovedError, match="actor Counter was scheduled"):
        s.try_place({"CPU": 1.0}, in_g, WorkKind.ACTOR, "actor Counter")
    with pytest.raises(TaskPlacementGroupRemovedError, match="task was scheduled"):
        s.try_place({"CPU": 1.0}, in_g, WorkKind.TASK)


def test_unschedulable_names_the_reason():
    table = nodes_of(2)
    s = Scheduler(table, PlacementGroupManager(keep_removed=10))
    with pytest.raises(UnschedulableError, match="more than any node has"):
        s.try_place({"CPU": 3.0}, None, WorkKind.TASK)
    table.mark_dead(table.get("n0"))
    with pytest.raises(UnschedulableError, match=r"no live nodes \(1 dead\)"):
        s.try_place({"CPU": 1.0}, None, WorkKind.TASK)


# -- PackageStore, LogFanout, WarnLimiter ----------------------------------------------------------
def test_a_package_is_kept_only_under_its_own_hash():
    store = PackageStore()
    data = b"zip bytes"
    pkg_id = "pkg-" + hashlib.sha256(data).hexdigest()[:40]
    with pytest.raises(ValueError, match="do not match its hash"):
        store.put(pkg_id, b"other bytes")
    store.put(pkg_id, bytearray(data))
    assert pkg_id in store and store.get(pkg_id) == data and store.get("pkg-x") is None


def test_log_lines_go_to_their_jobs_driver_and_jobless_ones_to_every_driver():
    fan = LogFanout()
    a, b, stale = object(), object(), object()
    fan.add_driver("ja", a)
    fan.add_driver("jb", b)
    fan.remove_driver("jb", stale)   # not the registered connection: kept
    batch = LogBatch([("ja", "W", 1, "out", "for a"), (None, "W", 2, "err", "for all"),
                      ("gone", "W", 3, "out", "for nobody")], host="h", node_id="n")
    routed = [(conn, [r[4] for r in part.records]) for conn, part in fan.route(batch)]
    assert routed == [(a, ["for a"]), (a, ["for all"]), (b, ["for all"])]


def test_a_repeated_warning_is_logged_once_per_interval_with_a_count(caplog):
    warn = WarnLimiter(logging.getLogger("test.warn"), every_s=3600)
    with caplog.at_level(logging.WARNING, logger="test.warn"):
        for i in range(3):
            warn("k", "refused %d", i)
        warn.every_s = 0
        warn("k", "refused %d", 9)
    assert [r.getMessage() for r in caplog.records] == [
        "refused 0", "refused 9 (2 more like it not logged)"]
