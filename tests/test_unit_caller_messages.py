"""The caller side reads the head's messages through runtime/wire/messages.py (no processes).

An actor view, a lease grant or a push the head sends malformed must fail the caller's
calls with a DDLFError saying so, never leave a ``get`` waiting or raise a KeyError in
the I/O thread. The head's replies are stood in for by replacing ``rpc.call``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re

import pytest

from ddlf_actors.runtime.client.actor_submitter import ActorCall, ActorClient, ActorCreations
from ddlf_actors.runtime.client.core import Core
from ddlf_actors.runtime.client.object_store import ObjectStore
from ddlf_actors.runtime.client.task_submitter import Task, TaskPool
from ddlf_actors.runtime.errors import (
    ActorDiedError,
    ActorPlacementGroupRemovedError,
    DDLFError,
)
from ddlf_actors.runtime.wire import protocol, rpc
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.messages import ActorCreation, ActorDeath, MessageError
from ddlf_actors.runtime.wire.serialization import dumps
from ddlf_actors.runtime.wire.taskgroup import TaskGroup


class _HeadConn:
    closed = False

    def __init__(self):
        self.info = ConnInfo()
        self.peer = ("127.0.0.1", 1)
        self.pushed: list = []
        self.aborted = None

    def send_msg(self, kind, msg_id, segs):
        self.pushed.append(kind)

    def abort(self, exc=None):
        self.aborted = exc


class _Core:
    """What a submitter uses of the core (its public attributes), with no I/O thread."""

    def __init__(self, loop):
        self.loop = loop
        self.store = ObjectStore(self, lambda fn, *args: fn(*args), lambda: False, lambda: None)
        self.incref, self.decref = self.store.incref, self.store.decref
        self.background = TaskGroup(loop, "test")
        self.head = _HeadConn()
        self.head_address = "127.0.0.1:1"
        self.creations = ActorCreations(self)
        self.token = "token"
        self.hello: dict = {}
        self.msg_ids = itertools.count(1)
        self.closed = False


def _with_head(monkeypatch, answers: dict):
    """Replace rpc.call: ``answers[method]`` is the head's reply; records every call."""
    calls = []

    async def call(conn, method, *args, timeout=None):
        calls.append((method, args))
        return answers.get(method)

    monkeypatch.setattr(rpc, "call", call)
    return calls


def _run(scenario):
    """Run ``scenario(core)`` on a fresh loop, bounded; the core's store outlives it."""
    async def main():
        core = _Core(asyncio.get_running_loop())
        try:
            await asyncio.wait_for(scenario(core), 10)
        finally:
            for _ in range(20):   # let spawned tasks finish
                await asyncio.sleep(0)
            core.background.close()
        return core

    return asyncio.run(main())


def _creation() -> ActorCreation:
    return ActorCreation("a1", "Counter", [b"cls"], [b"args"], {"CPU": 1.0})


async def _settle():
    for _ in range(10):
        await asyncio.sleep(0)


def _call_then(how: str, view):
    """A scenario: one call queued on actor a1, then its creation (the head accepts it and
    pushes ``view`` as the actor's first view) or its resolution (``wait_actor`` answers
    ``view``; see ``_with_head``)."""
    refs = []

    async def scenario(core):
        client = ActorClient(core, "a1", "Counter")
        ref = core.store.new_ref("a1")
        refs.append(ref)
        client.enqueue(ActorCall(ref.id, [b"call"], None))
        if how == "create":
            client.create(_creation(), None)
            await _settle()   # the batch goes out and is accepted
            core.creations.started(view)   # the head's actor_started push
        else:
            client.resolve(0)

    return scenario, refs


MALFORMED_VIEWS = [
    ("ALIVE", "must be a dict"),
    ({"state": "ALIVE", "epoch": 1, "address": "h:1"}, "lacks 'actor_id'"),
    ({"actor_id": "a1", "state": "ALIVE", "epoch": "1", "address": "h:1"}, "epoch must be an int"),
    ({"actor_id": "a1", "state": "ALIVE", "epoch": 1, "address": None}, "is not 'host:port'"),
    ({"actor_id": "a1", "state": "ALIVE", "epoch": 1, "address": "nowhere"}, "is not 'host:port'"),
    ({"actor_id": "a1", "state": "ZOMBIE", "epoch": 1}, "state must be one of"),
    ({"actor_id": "a1", "state": "DEAD", "error": {"creation_error": None}}, "lacks 'reason'"),
]


@pytest.mark.parametrize("request_", ["create", "resolve"])
@pytest.mark.parametrize("view,match", MALFORMED_VIEWS)
def test_a_malformed_actor_view_fails_the_calls_with_what_is_wrong(monkeypatch, request_,
                                                                   view, match):
    method = "create_actors" if request_ == "create" else "wait_actor"
    _with_head(monkeypatch, {"create_actors": [None], "wait_actor": view})
    scenario, refs = _call_then(request_, view)
    core = _run(scenario)
    with pytest.raises(MessageError, match=match) as info:
        core.store.get(refs, timeout=2)   # before: a GetTimeoutError, the call never failed
    assert isinstance(info.value, DDLFError)
    assert f"the head's answer to {method} is malformed" in str(info.value)
    assert "same DDLF release" in str(info.value)


@pytest.mark.parametrize("error,cls,text", [
    (None, ActorDiedError, "actor Counter (a1) is dead: it died"),
    (ActorDeath.of("its group went", pg_removed=True).to_wire(),
     ActorPlacementGroupRemovedError, "is dead: its group went"),
])
def test_a_dead_view_fails_the_calls_with_the_error_its_death_describes(monkeypatch, error,
                                                                       cls, text):
    _with_head(monkeypatch, {"create_actors": [None]})
    scenario, refs = _call_then("create", {"actor_id": "a1", "state": "DEAD", "epoch": 0,
                                           "address": None, "error": error})
    core = _run(scenario)
    with pytest.raises(cls, match=re.escape(text)):
        core.store.get(refs, timeout=2)


def test_the_creation_sent_is_the_message_with_the_shipped_objects(monkeypatch):
    calls = _with_head(monkeypatch, {"create_actors": [None]})
    _run(lambda core: _create(core))
    ((method, (sent,)),) = calls
    assert method == "create_actors" and sent == [_creation().to_wire()]
    assert "objects" not in sent[0]   # sent only when its arguments hold refs


async def _create(core):
    ActorClient(core, "a1", "Counter").create(_creation(), None)


def test_creations_in_one_loop_pass_leave_in_one_request_and_refusals_fail_their_calls(
        monkeypatch):
    from ddlf_actors.runtime.errors import ActorNameTakenError

    taken = ActorNameTakenError("an actor named 'x' already exists")
    calls = _with_head(monkeypatch, {"create_actors": [None, taken, None]})
    refs = {}

    async def scenario(core):
        for actor_id in ("a1", "a2", "a3"):
            client = ActorClient(core, actor_id, "Counter")
            refs[actor_id] = core.store.new_ref(actor_id)
            client.enqueue(ActorCall(refs[actor_id].id, [b"call"], None))
            client.create(ActorCreation(actor_id, "Counter"), None)
        await _settle()
        core.creations.started({"actor_id": "a3", "state": "DEAD", "error": None})
        return core

    core = _run(scenario)
    ((method, (sent,)),) = calls   # one request for the three actors
    assert method == "create_actors" and [c["actor_id"] for c in sent] == ["a1", "a2", "a3"]
    with pytest.raises(ActorNameTakenError):
        core.store.get([refs["a2"]], timeout=2)
    with pytest.raises(ActorDiedError, match=re.escape("actor Counter (a3) is dead")):
        core.store.get([refs["a3"]], timeout=2)
    assert list(core.creations.waiting) == ["a1"]   # accepted; its view is still to come
    core.creations.head_lost()
    with pytest.raises(DDLFError, match="lost the connection to the DDLF head"):
        core.store.get([refs["a1"]], timeout=2)


# -- leases ------------------------------------------------------------------------------------
def _task_scenario(refs):
    async def scenario(core):
        pool = TaskPool(core, {"CPU": 1.0})
        ref = core.store.new_ref(("k",))
        refs.append(ref)
        pool.add(Task(ref.id, b"f" * 16, [b"fn"], "f", [b"payload"], None, 0))
    return scenario


@pytest.mark.parametrize("grant,match,returned", [
    ({"lease_id": "L1", "address": "h:1"}, "lacks 'worker_id'", "L1"),
    ({"lease_id": "L2", "address": "h:1", "worker_id": "w", "pid": "7"}, "pid must be an int",
     "L2"),
    ({"address": "h:1", "worker_id": "w"}, "no lease_id", None),
    ({"lease_id": "L3", "address": "h", "worker_id": "w"}, "is not 'host:port'", "L3"),
    (["h:1"], "must be a dict", None),
])
def test_a_malformed_lease_grant_fails_the_tasks_and_gives_the_lease_back(monkeypatch, grant,
                                                                          match, returned):
    calls = _with_head(monkeypatch, {"lease_worker": grant})
    refs = []
    core = _run(_task_scenario(refs))
    with pytest.raises(MessageError, match=match) as info:
        core.store.get(refs, timeout=2)   # before: "could not lease a worker: 'lease_id'"
    assert "the head's answer to lease_worker is malformed" in str(info.value)
    assert [a for m, a in calls if m == "return_lease"] == ([(returned,)] if returned else [])


# -- pushes from the head ------------------------------------------------------------------------
def _core_for_pushes() -> Core:
    core = object.__new__(Core)   # on_push reads only these
    core.actors, core.pools, core.node_totals, core.is_driver = {}, {}, [], True
    return core


def _push(core, event, data):
    conn = _HeadConn()
    rpc.RpcHandler(core).frame_received(conn, [protocol.header(protocol.PUSH),
                                               *dumps((event, data))])
    return conn


@pytest.mark.parametrize("event,data", [
    ("actor_lost", {"actor_id": "a1", "epoch": 1}),
    ("actor_lost", {"actor_id": "a1", "epoch": "1", "why": "x"}),
    ("actor_lost", None),
    ("logs", {"records": None}),
    ("logs", {"records": [("j", "C", 7, "out")]}),
    ("logs", "a line"),
])
def test_a_malformed_push_from_the_head_is_dropped_with_a_warning(event, data, caplog):
    with caplog.at_level(logging.WARNING, logger="ddlf.rpc"):
        _push(_core_for_pushes(), event, data)   # before: a KeyError/TypeError out of here
    assert f"dropped a malformed {event!r} push" in caplog.text


def test_actor_lost_aborts_the_connection_to_that_actor_up_to_its_epoch():
    core = _core_for_pushes()

    class Client:
        conn = _HeadConn()
        epoch = 2

    core.actors["a1"] = Client
    _push(core, "actor_lost", {"actor_id": "a1", "epoch": 1, "why": "old"})
    assert Client.conn.aborted is None   # an older epoch's loss: not this process
    _push(core, "actor_lost", {"actor_id": "a1", "epoch": 2, "why": "its node died"})
    assert isinstance(Client.conn.aborted, ActorDiedError)
    assert str(Client.conn.aborted) == "its node died"


def test_log_lines_print_with_their_worker(capsys):
    core = _core_for_pushes()
    _push(core, "logs", {"node_id": "n", "host": "h", "records": [("j", "C", 7, "out", "hi"),
                                                                  ("j", "C", 7, "err", "oops")]})
    out, err = capsys.readouterr()
    assert out == "(C pid=7) hi\n" and err == "(C pid=7) oops\n"
