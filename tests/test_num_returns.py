"""``num_returns=k``: one call, k refs, each with its own value (or the call's error)."""

from __future__ import annotations

import numpy as np
import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError, TaskError


@ddlf.remote(num_returns=2)
def split(xs):
    return xs[: len(xs) // 2], xs[len(xs) // 2:]


@ddlf.remote
def three():
    return 1, "two", np.arange(3)


@ddlf.remote(num_returns=3)
def wrong_count():
    return 1, 2


@ddlf.remote(num_returns=2)
def fails():
    raise KeyError("nope")


@ddlf.remote(num_returns=2)
def returns_refs():
    return ddlf.put("a"), "b"


@ddlf.remote
class Stats:
    @ddlf.method(num_returns=2)
    def min_max(self, xs):
        return min(xs), max(xs)

    def pair(self):
        return "x", "y"

    @ddlf.method(num_returns=2)
    async def async_pair(self):
        return 3, 4


def test_task_num_returns(cluster):
    a, b = split.remote([1, 2, 3, 4])
    assert ddlf.get(a) == [1, 2] and ddlf.get(b) == [3, 4]


def test_options_num_returns(cluster):
    refs = three.options(num_returns=3).remote()
    assert len(refs) == 3
    one, two, arr = ddlf.get(refs)
    assert one == 1 and two == "two"
    np.testing.assert_array_equal(arr, np.arange(3))


def test_each_ref_can_be_passed_on(cluster):
    a, b = split.remote(list(range(10)))
    assert ddlf.get(split.options(num_returns=1).remote(ddlf.get(b))) == ([5, 6], [7, 8, 9])
    s = Stats.remote()
    lo, hi = s.min_max.remote(b)
    assert ddlf.get([lo, hi]) == [5, 9]


def test_wrong_count_fails_every_ref(cluster):
    refs = wrong_count.remote()
    for r in refs:
        with pytest.raises(TaskError, match="num_returns=3 but returned 2 values"):
            ddlf.get(r, timeout=30)


def test_an_error_reaches_every_ref(cluster):
    a, b = fails.remote()
    for r in (a, b):
        with pytest.raises(KeyError):
            ddlf.get(r, timeout=30)


def test_refs_inside_multiple_returns(cluster):
    a, b = returns_refs.remote()
    inner = ddlf.get(a)
    assert isinstance(inner, ddlf.ObjectRef) and ddlf.get(inner) == "a"
    assert ddlf.get(b) == "b"


def test_actor_method_num_returns(cluster):
    s = Stats.remote()
    lo, hi = s.min_max.remote([3, 1, 2])
    assert ddlf.get(lo) == 1 and ddlf.get(hi) == 3
    x, y = s.pair.options(num_returns=2).remote()
    assert ddlf.get([x, y]) == ["x", "y"]
    assert ddlf.get(list(s.async_pair.remote())) == [3, 4]


def test_a_dead_actor_fails_every_ref(cluster):
    s = Stats.remote()
    ddlf.get(s.pair.remote())
    ddlf.kill(s)
    refs = s.min_max.remote([1])
    for r in refs:
        with pytest.raises(ActorDiedError):
            ddlf.get(r, timeout=30)


def test_bad_num_returns_are_refused_at_once(cluster):
    with pytest.raises(ValueError, match="num_returns"):
        three.options(num_returns=0).remote()
    with pytest.raises(ValueError, match="num_returns"):
        three.options(num_returns="sometimes").remote()
