"""runtime/client/object_store.py and runtime/client/dependencies.py with no processes and no sockets.

The store only needs an owner for its refs (whose incref/decref it answers), a way to
run things on the I/O thread (here: at once) and the CPU-lending hooks (here: none).
"""

from __future__ import annotations

import pickle
import threading

import pytest

from ddlf_actors.runtime.client.dependencies import deps_state, resolve_args, ship_deps, split_refs
from ddlf_actors.runtime.client.object_store import OK, PENDING, ObjectStore
from ddlf_actors.runtime.client.refs import ArgRef
from ddlf_actors.runtime.errors import DDLFError, GetTimeoutError
from ddlf_actors.runtime.wire import protocol
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.serialization import dumps


class _Owner:
    """Stands in for the core: refs call its incref/decref."""


class _Conn:
    closed = False

    def __init__(self):
        self.sent = []
        self.info = ConnInfo()

    def send_msg(self, kind, msg_id, segs):
        self.sent.append((kind, [bytes(s) for s in segs]))


@pytest.fixture
def store():
    owner = _Owner()
    s = ObjectStore(owner, lambda fn, *args: fn(*args), lambda: False, lambda: None)
    owner.incref, owner.decref = s.incref, s.decref
    yield s
    s.close()


def test_complete_runs_callbacks_once_and_later_ones_are_refused(store):
    ref = store.new_ref()
    seen = []
    assert store.on_done(store.entry(ref), lambda: seen.append("a"))
    store.complete(ref.id, OK, dumps(41))
    assert seen == ["a"]
    assert not store.on_done(store.entry(ref), lambda: seen.append("late"))
    assert seen == ["a"] and store.get([ref]) == [41]


def test_fail_raises_the_exception_at_get_and_error_of_returns_it(store):
    ref = store.new_ref()
    store.fail(ref.id, ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        store.get([ref])
    assert isinstance(store.error_of(store.entry(ref)), ValueError)
    assert store.failed(ref)


def test_get_waits_for_another_thread_and_times_out_naming_what_is_pending(store):
    ref, other = store.new_ref(), store.new_ref()
    threading.Timer(0.05, store.complete, (ref.id, OK, dumps("late"))).start()
    assert store.get([ref], timeout=5) == ["late"]
    with pytest.raises(GetTimeoutError, match="1 of 2 objects still pending"):
        store.get([ref, other], timeout=0.05)


def test_wait_splits_ready_from_pending_and_keeps_num_returns(store):
    a, b, c = store.new_ref(), store.new_ref(), store.new_ref()
    store.complete(b.id, OK, dumps(1))
    store.complete(c.id, OK, dumps(2))
    assert store.wait([a, b, c], 1, timeout=0) == ([b], [a, c])
    assert store.wait([a, b, c], 3, timeout=0.05) == ([b, c], [a])


def test_close_wakes_a_waiter_with_an_error(store):
    ref = store.new_ref()
    threading.Timer(0.05, store.close).start()
    with pytest.raises(DDLFError, match="shut down"):
        store.get([ref], timeout=5)


def test_split_returns_copies_a_failure_to_every_ref(store):
    parent = store.new_ref()
    children = store.split_returns(parent, 2)
    store.fail(parent.id, RuntimeError("actor died"))
    for child in children:
        with pytest.raises(RuntimeError, match="actor died"):
            store.get([child])


def test_split_returns_splits_a_result_multi(store):
    parent = store.new_ref()
    children = store.split_returns(parent, 2)
    one, two = dumps("one"), dumps("two")
    index = [(protocol.RESULT_OK, len(one)), (protocol.RESULT_OK, len(two))]
    store.complete_result(parent.id, protocol.RESULT_MULTI,
                          [None, pickle.dumps(index), *one, *two])
    assert store.get(children) == ["one", "two"]


def test_dropping_the_last_ref_frees_the_copies_shipped_to_callees(store):
    dep = store.put([1, 2, 3])
    conn = _Conn()
    ship_deps(store, conn, [dep])
    ship_deps(store, conn, [dep])   # once per connection
    assert [k for k, _ in conn.sent] == [protocol.OBJ]
    obj_id = dep.id
    del dep
    assert obj_id not in store.objects
    assert conn.sent[-1] == (protocol.FREE, [obj_id])


def test_deps_state_reports_the_first_pending_or_failed_dependency(store):
    ok, pending, failed = store.put(1), store.new_ref(), store.new_ref()
    store.fail(failed.id, KeyError("x"))
    assert deps_state(store, [ok]) == (None, None)
    p, f = deps_state(store, [ok, pending, failed])
    assert p is store.entry(pending) and f is None
    p, f = deps_state(store, [ok, failed])
    assert p is None and f is store.entry(failed)
    assert store.entry(pending).state == PENDING


def test_split_refs_and_resolve_args_are_inverse(store):
    a, b = store.put("A"), store.put("B")
    args, kwargs, refs = split_refs((a, 1), {"k": b})
    assert type(args[0]) is ArgRef and refs == [a, b]
    shipped = {a.id: "A", b.id: "B"}
    assert resolve_args(args, kwargs, shipped) == (("A", 1), {"k": "B"})
