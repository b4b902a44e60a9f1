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
