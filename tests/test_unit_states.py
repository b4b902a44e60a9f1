"""runtime/states.py: actor and worker states are enums; the wire still carries strings."""

from __future__ import annotations

import asyncio

from ddlf_actors.runtime import config
from ddlf_actors.runtime.head import Head
from ddlf_actors.runtime.head.actors import ActorRecord
from ddlf_actors.runtime.states import ActorState, WorkerState
from ddlf_actors.runtime.wire.conninfo import ConnInfo


class FakeConn:
    def __init__(self, owner_id="owner-1"):
        self.info = ConnInfo()
        self.info.owner_id = owner_id
        self.closed = False


def test_states_equal_their_old_strings():
    assert ActorState.ALIVE == "ALIVE" and str(ActorState.DEAD) == "DEAD"
    assert f"{ActorState.RESTARTING}" == "RESTARTING"
    assert WorkerState.IDLE == "idle" and str(WorkerState.STARTING) == "starting"


def test_a_reserved_name_is_not_pending(monkeypatch):
    """PENDING meant two things: an actor being placed or started, and (in wait_actor) a
    name reserved at .remote() whose create_actor request has not arrived yet."""
    async def scenario():
        head = Head(asyncio.get_running_loop(), "token")
        head.rpc_reserve_name(FakeConn(), "counter", "a1", "Counter", {})
        view = await head.rpc_wait_actor(FakeConn(), "a1", 0)
        record = ActorRecord({"actor_id": "a2", "class_name": "Counter"}, "owner-1")
        return view, record.state, record.view()

    monkeypatch.setattr(config, "WAIT_ACTOR_MAX_S", 0.05)
    view, state, record_view = asyncio.run(scenario())
    assert view["state"] == "RESERVED" and type(view["state"]) is str
    assert state is ActorState.PENDING
    assert record_view["state"] == "PENDING" and type(record_view["state"]) is str


def test_calls_and_connections_have_named_states():
    from ddlf_actors.runtime.context import CallContext
    from ddlf_actors.runtime.states import CallState, ConnectionState
    from ddlf_actors.runtime.wire.connection import Connection

    assert CallContext(1, "f", None, None, False).state is CallState.QUEUED
    assert Connection("t", None, server=True).state is ConnectionState.AWAIT_RESPONSE
    assert Connection("t", None, server=False).state is ConnectionState.AWAIT_CHALLENGE
    assert str(ConnectionState.OPEN) == "open" and str(CallState.RUNNING) == "running"
