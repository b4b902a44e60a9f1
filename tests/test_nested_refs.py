"""ObjectRefs inside containers and ObjectRefs returned by remote code.

As in Ray: a ref nested in a list, tuple or dict argument reaches the callee as a ref
(only top-level refs are replaced by their values), and the callee may ``ddlf.get``
it. A ref that a task or method returns stays a ref at the caller, and its object
outlives the worker that made it.
"""

from __future__ import annotations

import numpy as np
import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import TaskError


@ddlf.remote
class Holder:
    def __init__(self, refs=None):
        self.refs = refs

    def kinds(self, box):
        return {k: type(v).__name__ for k, v in box.items()}

    def get_nested(self, box):
        return {k: ddlf.get(v) for k, v in box.items()}

    def get_list(self, refs):
        return ddlf.get(list(refs))

    def keep(self, refs):
        self.refs = refs
        return len(refs)

    def get_kept(self):
        return ddlf.get(self.refs)

    def make_ref(self, value):
        return ddlf.put(value)

    def make_refs(self, n):
        return [ddlf.put(np.full(1000, i)) for i in range(n)]

    def forward(self, other, box):
        # A ref received nested is passed on, top-level, to another actor.
        return ddlf.get(other.echo.remote(box["w"]))

    def echo(self, x):
        return x


@ddlf.remote
def sum_nested(pair):
    a, b = pair
    return ddlf.get(a) + ddlf.get(b)


@ddlf.remote
def put_task(value):
    return ddlf.put(value)


@ddlf.remote
def call_again(n):
    return n + 1


@ddlf.remote
def pending_ref():
    # A ref to a task still running when this task returns: the caller still gets a ref.
    return call_again.remote(41)


def test_nested_refs_reach_an_actor_as_refs(cluster):
    h = Holder.remote()
    w = ddlf.put(np.arange(10.0))
    box = {"w": w, "s": ddlf.put("text")}
    assert ddlf.get(h.kinds.remote(box)) == {"w": "ObjectRef", "s": "ObjectRef"}
    got = ddlf.get(h.get_nested.remote(box))
    np.testing.assert_array_equal(got["w"], np.arange(10.0))
    assert got["s"] == "text"


def test_nested_refs_in_lists_and_tuples_reach_a_task(cluster):
    refs = [ddlf.put(1), ddlf.put(2)]
    assert ddlf.get(sum_nested.remote(tuple(refs))) == 3
    assert ddlf.get(sum_nested.remote([refs[0], refs[1]])) == 3


def test_nested_ref_to_a_task_result_waits_for_it(cluster):
    r = call_again.remote(1)
    assert ddlf.get(sum_nested.remote([r, call_again.remote(10)])) == 13


def test_actor_keeps_nested_refs_after_the_driver_drops_them(cluster):
    h = Holder.remote()
    refs = [ddlf.put(np.full(100_000, i, dtype=np.float32)) for i in range(3)]
    assert ddlf.get(h.keep.remote(refs)) == 3
    del refs
    import gc

    gc.collect()
    got = ddlf.get(h.get_kept.remote())
    assert [float(a[0]) for a in got] == [0.0, 1.0, 2.0]


def test_nested_refs_in_constructor_arguments(cluster):
    h = Holder.remote([ddlf.put(5), ddlf.put(6)])
    assert ddlf.get(h.get_kept.remote()) == [5, 6]


def test_a_ref_received_nested_can_be_passed_on(cluster):
    a, b = Holder.remote(), Holder.remote()
    arr = np.arange(5)
    np.testing.assert_array_equal(ddlf.get(a.forward.remote(b, {"w": ddlf.put(arr)})), arr)


def test_a_task_returning_a_ref_gives_a_ref(cluster):
    ref = ddlf.get(put_task.remote(1))
    assert isinstance(ref, ddlf.ObjectRef)
    assert ddlf.get(ref) == 1


def test_an_actor_returning_refs_gives_refs_that_outlive_it(cluster):
    h = Holder.remote()
    refs = ddlf.get(h.make_refs.remote(3))
    assert all(isinstance(r, ddlf.ObjectRef) for r in refs)
    ddlf.kill(h)
    assert [int(a[0]) for a in ddlf.get(refs)] == [0, 1, 2]
    # ... and they can be passed to other workers, top-level and nested.
    h2 = Holder.remote()
    assert int(ddlf.get(h2.echo.remote(refs[2]))[0]) == 2
    assert [int(a[0]) for a in ddlf.get(h2.get_list.remote(refs))] == [0, 1, 2]


def test_a_returned_pending_ref_is_still_a_ref(cluster):
    ref = ddlf.get(pending_ref.remote())
    assert isinstance(ref, ddlf.ObjectRef)
    assert ddlf.get(ref) == 42


def test_put_of_a_container_of_refs(cluster):
    inner = ddlf.put(np.arange(3))
    outer = ddlf.put({"inner": inner})
    got = ddlf.get(outer)
    assert isinstance(got["inner"], ddlf.ObjectRef)
    h = Holder.remote()
    np.testing.assert_array_equal(ddlf.get(h.get_nested.remote(ddlf.get(outer)))["inner"],
                                  np.arange(3))
    # The outer object, shipped top-level, carries the inner one with it.
    del inner, got
    np.testing.assert_array_equal(ddlf.get(h.get_nested.remote(outer))["inner"], np.arange(3))


def test_failed_nested_dependency_fails_the_call(cluster):
    @ddlf.remote
    def boom():
        raise ValueError("nested boom")

    with pytest.raises(TaskError, match="nested boom"):
        ddlf.get(sum_nested.remote([boom.remote(), ddlf.put(1)]))
