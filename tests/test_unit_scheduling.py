"""runtime/scheduling.py: resource arithmetic and node choice, with no cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ddlf_actors.runtime import scheduling


@dataclass
class Node:
    name: str
    total: dict
    available: dict = None
    actors: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.available is None:
            self.available = dict(self.total)


@pytest.mark.parametrize("demand, available, ok", [
    ({"CPU": 1}, {"CPU": 1.0}, True),
    ({"CPU": 1.5}, {"CPU": 1.0}, False),
    ({"CPU": 0.1 + 0.2}, {"CPU": 0.3}, True),          # float noise does not refuse a fit
    ({"GPU": 1}, {"CPU": 8.0}, False),                  # a resource the node lacks
    ({"GPU": 0, "CPU": 1}, {"CPU": 1.0}, True),         # zero demands are no demands
    ({}, {}, True),
])
def test_fits(demand, available, ok):
    assert scheduling.fits(demand, available) is ok


def test_subtract_then_add_is_capped_at_the_total():
    total = {"CPU": 2.0, "GPU": 1.0}
    avail = dict(total)
    scheduling.subtract(avail, {"CPU": 1.5, "GPU": 1, "mem": 0})
    assert avail == {"CPU": 0.5, "GPU": 0.0}
    scheduling.subtract(avail, {"CPU": 1.0})   # lent resources may go below zero for a while
    assert avail["CPU"] == pytest.approx(-0.5)
    scheduling.add(avail, {"CPU": 1.0}, total)
    scheduling.add(avail, {"CPU": 5.0, "GPU": 3.0}, total)
    assert avail == {"CPU": 2.0, "GPU": 1.0}


def test_feasible_anywhere_looks_at_totals():
    totals = [{"CPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}]
    assert scheduling.feasible_anywhere({"GPU": 1}, totals)
    assert not scheduling.feasible_anywhere({"CPU": 2, "GPU": 1}, totals)
    assert not scheduling.feasible_anywhere({"CPU": 1}, [])


def test_choose_node_prefers_the_largest_free_cpu_fraction():
    a = Node("a", {"CPU": 4.0}, {"CPU": 1.0})      # 25 % free
    b = Node("b", {"CPU": 2.0}, {"CPU": 1.0})      # 50 % free
    c = Node("c", {"CPU": 8.0}, {"CPU": 0.5})      # does not fit one CPU
    assert scheduling.choose_node({"CPU": 1}, [a, b, c]).name == "b"


def test_choose_node_breaks_ties_by_fewest_actors():
    a = Node("a", {"CPU": 2.0}, actors=3)
    b = Node("b", {"CPU": 2.0}, actors=1)
    assert scheduling.choose_node({"CPU": 0}, [a, b], load_key=lambda n: n.actors).name == "b"
    # Without a load key the first of equals wins.
    assert scheduling.choose_node({"CPU": 0}, [a, b]).name == "a"


def test_choose_node_none_when_nothing_fits_now():
    a = Node("a", {"CPU": 2.0}, {"CPU": 0.0})
    assert scheduling.choose_node({"CPU": 1}, [a]) is None
    assert scheduling.choose_node({"CPU": 1}, []) is None


def test_a_node_without_cpus_can_take_zero_cpu_actors():
    a = Node("a", {"CPU": 0.0, "GPU": 1.0})
    assert scheduling.choose_node({"GPU": 1}, [a]).name == "a"


# -- Scheduling: where work may run, typed -------------------------------------------------------
@pytest.mark.parametrize("sched", [
    scheduling.Scheduling(strategy=scheduling.Strategy.SPREAD),
    scheduling.Scheduling(node_id="n1", soft=True, spill=True),
    scheduling.Scheduling(node_id="n1", fail=True),
    scheduling.Scheduling(group_id="g", bundle_index=1, capture=True,
                          bundles=({"CPU": 1.0}, {"CPU": 2.0})),
])
def test_a_scheduling_goes_on_the_wire_as_a_plain_dict_and_reads_back(sched):
    wire = sched.to_wire()
    assert type(wire) is dict and all(type(v) in (str, bool, int, list) for v in wire.values())
    assert scheduling.Scheduling.from_wire(wire) == sched


def test_default_is_no_scheduling_at_all():
    assert scheduling.Scheduling().to_wire() == {}
    assert scheduling.Scheduling.from_wire({}) is None
    assert scheduling.Scheduling.from_wire(None) is None


def test_task_pools_are_told_apart_by_where_they_lease_not_by_bundles_or_capture():
    a = scheduling.Scheduling(group_id="g", capture=True, bundles=({"CPU": 1.0},))
    b = scheduling.Scheduling(group_id="g", capture=False)
    assert a.pool_key() == b.pool_key()
    assert a.pool_key() != scheduling.Scheduling(group_id="g", bundle_index=0).pool_key()
    assert a.group_context() == {"group_id": "g", "bundles": [{"CPU": 1.0}], "capture": True}
