"""runtime/wire/frames.py: frames reach their handler through a table (no processes, no sockets).

The caller's handlers (an actor's connection, a leased worker's, the control link) take the
kinds a worker or peer sends them and drop the connection on any other kind.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from ddlf_actors.runtime.client import oob
from ddlf_actors.runtime.client.actor_submitter import ActorClient
from ddlf_actors.runtime.client.object_store import OK, PENDING, ObjectStore
from ddlf_actors.runtime.client.task_submitter import Lease, LeaseHandler, Task, TaskPool
from ddlf_actors.runtime.errors import FrameError
from ddlf_actors.runtime.wire import protocol, rpc
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.frames import FrameHandler, TableFrameHandler
from ddlf_actors.runtime.wire.serialization import dumps, loads
from ddlf_actors.runtime.wire.taskgroup import TaskGroup


class FakeConn:
    def __init__(self):
        self.info = ConnInfo()
        self.peer = ("127.0.0.1", 9)
        self.closed = False
        self.aborted = None
        self.sent: list = []

    def send_msg(self, kind, msg_id, segs=()):
        self.sent.append((kind, msg_id, list(segs)))

    def abort(self, exc=None):
        self.closed = True
        self.aborted = exc


class _Core:
    def __init__(self, loop=None):
        self.loop = loop
        self.store = ObjectStore(self, lambda fn, *args: fn(*args), lambda: False, lambda: None)
        self.incref, self.decref = self.store.incref, self.store.decref
        self.background = TaskGroup(loop, "test") if loop is not None else None
        self.msg_ids = itertools.count(1)
        self.closed = False
        self.streams = None


def _frame(kind, msg_id, *body):
    return [protocol.header(kind, msg_id), *body]


class Recorder(TableFrameHandler):
    def __init__(self):
        self.seen = []

    def _on_call(self, conn, kind, msg_id, segs):
        self.seen.append(("call", kind, msg_id, segs[1:]))

    def _on_free(self, conn, kind, msg_id, segs):
        self.seen.append(("free", kind, msg_id, segs[1:]))

    FRAMES = {protocol.CALL: _on_call, protocol.FREE: _on_free}

    def connection_closed(self, conn, exc):
        pass


def test_a_table_handler_routes_each_kind_and_drops_a_peer_that_sends_another():
    h, conn = Recorder(), FakeConn()
    assert isinstance(h, FrameHandler)
    h.frame_received(conn, _frame(protocol.CALL, 7, b"body"))
    h.frame_received(conn, _frame(protocol.FREE, 0, b"ids"))
    assert h.seen == [("call", protocol.CALL, 7, [b"body"]), ("free", protocol.FREE, 0, [b"ids"])]
    assert not conn.closed
    h.frame_received(conn, _frame(protocol.FETCH, 1, b"x"))
    assert conn.closed and isinstance(conn.aborted, FrameError)
    assert "unexpected frame kind 24 for Recorder" in str(conn.aborted)
    assert len(h.seen) == 2


def test_an_actor_result_settles_the_call_it_answers():
    core = _Core()
    client = ActorClient(core, "a1", "Counter")
    ref = core.store.new_ref("a1")
    client.inflight[5] = ref.id
    conn = FakeConn()
    client.frame_received(conn, _frame(protocol.RESULT_OK, 5, *dumps(42)))
    e = core.store.objects[ref.id]
    assert e.state == OK and loads(e.segments) == 42
    assert client.inflight == {}
    # A reply for a call not in flight (answered, or never sent) changes nothing.
    client.frame_received(conn, _frame(protocol.RESULT_OK, 6, *dumps(1)))
    assert not conn.closed


@pytest.mark.parametrize("kind", [protocol.CALL, protocol.OBJ, protocol.FREE, protocol.FUNC,
                                  protocol.REQUEST, protocol.CANCEL, 99])
def test_an_actor_connection_that_sends_a_callers_frame_is_dropped(kind):
    core = _Core()
    client = ActorClient(core, "a1", "Counter")
    ref = core.store.new_ref("a1")
    client.inflight[5] = ref.id
    conn = FakeConn()
    client.frame_received(conn, _frame(kind, 5, *dumps(42)))
    assert conn.closed and isinstance(conn.aborted, FrameError)
    # Not mistaken for the call's reply: it fails when the connection's end is handled.
    assert core.store.objects[ref.id].state == PENDING


def test_the_workers_hello_on_an_actor_connection_says_whether_it_shares_memory():
    client, conn = ActorClient(_Core(), "a1", "Counter"), FakeConn()
    client.frame_received(conn, _frame(protocol.PUSH, 0, *dumps(("hello", {"shm": None}))))
    assert conn.info.hello_seen is True and conn.info.shm_peer is False
    assert not conn.closed


def test_a_leased_worker_result_settles_the_task_and_frees_the_lease():
    async def scenario():
        core = _Core(asyncio.get_running_loop())
        pool = TaskPool(core, {"CPU": 1.0})
        lease = Lease("l1", "w1", "n1", FakeConn())
        pool.leases.append(lease)
        ref = core.store.new_ref(("k",))
        lease.inflight[3] = Task(ref.id, b"f" * 16, [], "f", [], None, 0)
        LeaseHandler(pool, lease).frame_received(lease.conn,
                                                 _frame(protocol.RESULT_OK, 3, *dumps("done")))
        e = core.store.objects[ref.id]
        idle = lease.idle_timer is not None   # no work left: returned after a pause
        if lease.idle_timer is not None:
            lease.idle_timer.cancel()
        return e.state, loads(e.segments), lease.inflight, idle, lease.conn.closed

    state, value, inflight, idle, closed = asyncio.run(scenario())
    assert (state, value, inflight, idle, closed) == (OK, "done", {}, True, False)


def test_a_leased_worker_that_sends_a_fetch_is_dropped():
    core = _Core()
    pool = TaskPool(core, {"CPU": 1.0})
    lease = Lease("l1", "w1", "n1", FakeConn())
    LeaseHandler(pool, lease).frame_received(lease.conn, _frame(protocol.FETCH, 1, b"x" * 16))
    assert lease.conn.closed and isinstance(lease.conn.aborted, FrameError)


def test_the_fetch_servers_take_only_their_own_kind():
    conn = FakeConn()
    oob._DriverServer(None).frame_received(conn, _frame(protocol.CALL, 1, b"x"))
    assert conn.closed and isinstance(conn.aborted, FrameError)
    conn = FakeConn()
    req = oob._Requester(_Core(), b"i" * 16, "127.0.0.1:1")
    req.frame_received(conn, _frame(protocol.RESULT_OK, 1, b"x"))
    assert conn.closed and isinstance(conn.aborted, FrameError)


def test_every_handler_table_names_only_known_kinds():
    kinds = {getattr(protocol, n) for n in protocol.__all__
             if isinstance(getattr(protocol, n), int) and n.isupper()}
    for cls in (ActorClient, LeaseHandler, rpc.RpcHandler, oob._DriverServer, oob._Requester):
        assert cls.FRAMES and set(cls.FRAMES) <= kinds, cls
        assert all(callable(fn) for fn in cls.FRAMES.values()), cls
