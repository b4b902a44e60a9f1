"""Named actors with get_if_exists=True, and the ddlf.method decorator."""

from __future__ import annotations

import threading
import time

import pytest
from helpers_modules.remote_defs import Counter

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorNameTakenError


def test_get_if_exists_returns_the_live_actor(cluster):
    a = Counter.options(name="shared", get_if_exists=True).remote(1)
    b = Counter.options(name="shared", get_if_exists=True).remote(100)
    assert a == b
    ddlf.get(a.incr.remote(), timeout=30)
    assert ddlf.get(b.read.remote(), timeout=30) == 2   # one actor, started with 1


def test_racing_creators_end_with_one_actor(cluster):
    handles, errors = [], []

    def create(i):
        try:
            handles.append(Counter.options(name="race", get_if_exists=True).remote(i))
        except Exception as e:  # noqa: BLE001 - the test reports any failure below
            errors.append(e)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(set(handles)) == 1
    starts = ddlf.get([h.read.remote() for h in handles], timeout=30)
    assert len(set(starts)) == 1


def test_a_dead_actors_name_is_taken_over(cluster):
    old = Counter.options(name="phoenix", get_if_exists=True).remote(1)
    assert ddlf.get(old.read.remote(), timeout=30) == 1
    ddlf.kill(old)
    deadline = time.monotonic() + 20
    while True:   # the head marks the actor dead shortly after the kill
        new = Counter.options(name="phoenix", get_if_exists=True).remote(5)
        if new != old or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert new != old
    assert ddlf.get(new.read.remote(), timeout=30) == 5


def test_duplicate_name_without_get_if_exists_raises_a_catchable_class(cluster):
    Counter.options(name="once").remote()
    with pytest.raises(ActorNameTakenError, match="already exists"):
        Counter.options(name="once").remote()


def test_get_if_exists_needs_a_name():
    with pytest.raises(ValueError, match="needs name"):
        Counter.options(get_if_exists=True).remote()
    with pytest.raises(ValueError, match="get_if_exists must be True or False"):
        Counter.options(get_if_exists="yes")


def test_method_validates_its_options():
    def f(self):
        return 1

    assert ddlf.method(f) is f
    assert ddlf.method(num_returns=1)(f) is f
    assert ddlf.method(num_returns="dynamic")(f) is f
    with pytest.raises(ValueError, match="num_returns"):
        ddlf.method(num_returns="sometimes")
    with pytest.raises(NotImplementedError, match="concurrency groups"):
        ddlf.method(concurrency_group="io")


def test_a_method_marked_with_num_returns_1_runs(cluster):
    @ddlf.remote
    class Pair:
        @ddlf.method(num_returns=1)
        def both(self, x):
            return x, x + 1

    assert ddlf.get(Pair.remote().both.remote(1), timeout=30) == (1, 2)
