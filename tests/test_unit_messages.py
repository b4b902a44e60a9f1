"""runtime/wire/messages.py and the RPC handler tables, with no sockets and no processes.

Messages: every one survives to_wire -> from_wire, the dicts peers send today are read
back unchanged, malformed ones are refused with MessageError, and a malformed message
reaching a server is a bad request, not a crash. Tables: every request some process
sends is in the table of the role that receives it (found by reading the source), and
every ``rpc_`` method of a role is in its table.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import pathlib
import re

import pytest

from ddlf_actors.runtime import process
from ddlf_actors.runtime.errors import (
    ActorDiedError,
    ActorPlacementGroupRemovedError,
    PlacementGroupRemovedError,
    UnschedulableError,
)
from ddlf_actors.runtime.head import Head
from ddlf_actors.runtime.head.dashboard.service import DashboardService
from ddlf_actors.runtime.node import NodeDaemon, WorkerPool
from ddlf_actors.runtime.states import ActorState
from ddlf_actors.runtime.wire import protocol, rpc
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.messages import (
    ActorCreation,
    ActorDeath,
    ActorLost,
    ActorStarted,
    ActorView,
    Heartbeat,
    LeaseGrant,
    LogBatch,
    MessageError,
    WorkerDied,
)
from ddlf_actors.runtime.wire.remote_error import encode_error
from ddlf_actors.runtime.wire.serialization import dumps, loads
from ddlf_actors.runtime.worker import Worker

ROOT = pathlib.Path(__file__).resolve().parent.parent


def creation_dict(**over) -> dict:
    """What a driver sends in create_actor today (core.create_actor's ActorCreation)."""
    d = {
        "actor_id": "a1", "class_name": "Counter", "class_segments": [b"cls"],
        "args_segments": [b"args"], "resources": {"CPU": 1.0}, "max_restarts": 0,
        "max_concurrency": 1, "name": None, "max_task_retries": 0, "detached": False,
        "node_id": None, "scheduling": None, "methods": {"inc": False}, "sys_path": ["/x"],
        "cwd": "/x", "job_id": "j1", "runtime_env": None,
    }
    d.update(over)
    return d


# Each: (message class, a dict as a peer sends it today).
WIRE = [
    (ActorCreation, creation_dict()),
    (ActorCreation, creation_dict(objects={b"\x01" * 16: [b"v"]}, env_setup={"env_vars": {}},
                                  scheduling={"group_id": "g", "bundle_index": 0},
                                  max_restarts=-1, name="svc", detached=True)),
    (ActorStarted, {"ok": True}),                                       # worker -> node
    (ActorStarted, {"ok": True, "address": "h:1", "pid": 7, "worker_id": "w"}),
    (ActorStarted, {"ok": False, "error": [b"e"]}),
    (ActorStarted, {"ok": False, "error": [b"e"], "pid": 7}),
    (LeaseGrant, {"address": "h:1", "worker_id": "w", "pid": 7, "node_id": "n"}),
    (LeaseGrant, {"lease_id": "L", "address": "h:1", "worker_id": "w", "pid": 7,
                  "node_id": "n"}),
    (ActorDeath, {"reason": "r", "creation_error": None, "unschedulable": False,
                  "pg_removed": True}),
    (ActorView, {"actor_id": "a1", "state": "ALIVE", "epoch": 2, "address": "h:1", "pid": 7,
                 "name": None, "class_name": "C", "error": None, "node_id": "n",
                 "methods": {}, "max_task_retries": 0}),
    (ActorView, {"actor_id": "a1", "state": "RESERVED", "epoch": 0, "address": None}),
    (ActorView, {"actor_id": "a1", "class_name": "C", "methods": {}}),
    (WorkerDied, {"worker_id": "w", "actor_id": None, "exitcode": -9, "state": "task",
                  "pid": 7, "on_purpose": False}),
    (ActorLost, {"actor_id": "a1", "epoch": 1, "why": "gone"}),
    (LogBatch, {"node_id": "n", "host": "h", "records": [("j", "C", 7, "out", "hi")]}),
    (Heartbeat, {"node_id": "n", "cpu_percent": 3.5, "mem_available": 10, "rss": 5}),
    (Heartbeat, {"node_id": "n"}),
]


@pytest.mark.parametrize("cls,data", WIRE)
def test_a_wire_dict_reads_back_and_is_sent_as_it_was(cls, data):
    msg = cls.from_wire(data)
    assert cls.from_wire(msg.to_wire()) == msg
    if cls is ActorView and "state" not in data:
        assert msg.state == "RESERVED"
        assert msg.to_wire(ActorView.STUB_KEYS) == data
    elif cls is ActorView and len(data) == 4:
        assert msg.to_wire(ActorView.RESERVED_KEYS) == data
    else:
        assert msg.to_wire() == data


def test_an_unknown_key_is_a_malformed_message():
    # Every peer runs the same release (versions are checked at hello): a key this one
    # does not know is a bad request, named, not a field to carry along.
    with pytest.raises(MessageError, match="unknown key 'new_option'"):
        ActorCreation.from_wire(creation_dict(new_option=[1, 2]))
    assert not hasattr(ActorCreation.from_wire(creation_dict()), "extra")


def test_the_driver_builds_the_creation_as_a_message_not_a_dict():
    # Found in the source: ActorCreation(...) calls, and any dict literal with
    # "class_segments" and "actor_id" keys (a creation built by hand again).
    built, by_hand = [], []
    for path in (ROOT / "runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and path.name != "messages.py":   # (its CHECKS)
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if {"class_segments", "actor_id"} <= keys:
                    by_hand.append(path.name)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "ActorCreation"):
                built.append((path.name, {k.arg for k in node.keywords}))
    assert by_hand == [], f"build the actor creation with ActorCreation(...), not a dict: {by_hand}"
    assert ("core.py", set(ActorCreation.CHECKS) - {"objects", "env_setup"}) in built, \
        "core.create_actor no longer builds an ActorCreation with every field: update this test"


MALFORMED = [
    (ActorCreation, None, "must be a dict"),
    (ActorCreation, [1, 2], "must be a dict"),
    (ActorCreation, {"class_name": "C"}, "lacks 'actor_id'"),
    (ActorCreation, creation_dict(actor_id=""), "actor_id must be a non-empty str"),
    (ActorCreation, creation_dict(class_name=3), "class_name must be a str"),
    (ActorCreation, creation_dict(class_segments=b"raw"), "class_segments must be a list"),
    (ActorCreation, creation_dict(args_segments=["not bytes"]), r"args_segments\[0\]"),
    (ActorCreation, creation_dict(resources={"CPU": "one"}), "resources must map"),
    (ActorCreation, creation_dict(resources={"CPU": True}), "resources must map"),
    (ActorCreation, creation_dict(max_restarts=True), "max_restarts must be an int, got a bool"),
    (ActorCreation, creation_dict(max_concurrency=2.5), "max_concurrency must be an int"),
    (ActorCreation, creation_dict(detached="yes"), "detached must be True or False"),
    (ActorCreation, creation_dict(sys_path="/x"), "sys_path must be a list"),
    (ActorCreation, creation_dict(scheduling=[]), "scheduling must be a dict"),
    (ActorCreation, creation_dict(scheduling={"strategy": "FAST"}), "strategy must be one of"),
    (ActorCreation, creation_dict(scheduling={"node_id": "n", "soft": 1}),
     "soft must be True or False"),
    (ActorCreation, creation_dict(scheduling={"group_id": "g", "bundle_index": "0"}),
     "bundle_index must be an int"),
    (ActorCreation, creation_dict(scheduling={"nodeid": "n"}), r"unknown key\(s\) \['nodeid'\]"),
    (ActorStarted, {"error": None}, "lacks 'ok'"),
    (ActorStarted, {"ok": 1}, "ok must be True or False"),
    (LeaseGrant, {"address": "h:1"}, "lacks 'worker_id'"),
    (LeaseGrant, {"address": "h:1", "worker_id": "w", "pid": "7"}, "pid must be an int"),
    (ActorView, {"actor_id": "a", "state": "DEAD", "error": {"creation_error": None}},
     "ActorDeath message lacks 'reason'"),
    (ActorView, {"actor_id": "a", "epoch": "1"}, "epoch must be an int"),
    (WorkerDied, {"actor_id": "a"}, "lacks 'worker_id'"),
    (WorkerDied, {"worker_id": "w", "on_purpose": None}, "on_purpose must be True or False"),
    (ActorLost, {"actor_id": "a", "epoch": 1}, "lacks 'why'"),
    (LogBatch, {"records": [("too", "short")]}, "must be a .job_id"),
    (LogBatch, {"records": "line"}, "records must be a list"),
    (Heartbeat, {"node_id": 5}, "node_id must be a str"),
    (Heartbeat, "beat", "must be a dict"),
]


@pytest.mark.parametrize("cls,data,match", MALFORMED)
def test_a_malformed_message_is_refused_with_what_is_wrong(cls, data, match):
    with pytest.raises(MessageError, match=match):
        cls.from_wire(data)


def test_started_reply_must_say_where_the_actor_is():
    with pytest.raises(MessageError, match="address and worker_id"):
        ActorStarted.from_wire({"ok": True}).check_placed()
    assert ActorStarted.from_wire({"ok": False, "error": None}).check_placed().ok is False


# -- the death of an actor: built in one place, read in one place -------------------------------
def test_a_death_is_classified_from_the_error_that_caused_it():
    assert ActorDeath.of("r").to_wire() == {"reason": "r", "creation_error": None,
                                            "unschedulable": False, "pg_removed": False}
    assert ActorDeath.of("r", error=UnschedulableError("x")).unschedulable
    assert ActorDeath.of("r", error=PlacementGroupRemovedError("x")).pg_removed
    assert ActorDeath.of("r", pg_removed=True).pg_removed


def test_a_death_becomes_the_error_a_caller_gets():
    err = ActorDeath.of("it was killed").to_error("Counter", "a1")
    assert type(err) is ActorDiedError and str(err).startswith("actor Counter (a1) is dead: it was")
    assert type(ActorDeath.of("no room", error=UnschedulableError()).to_error("C", "a")) \
        is UnschedulableError
    assert isinstance(ActorDeath.of("gone", pg_removed=True).to_error("C", "a"),
                      ActorPlacementGroupRemovedError)
    try:
        raise ValueError("bad arg")
    except ValueError as e:
        segs = [bytes(s) for s in encode_error(e, "Counter.__init__")]
    err = ActorDeath.from_wire(ActorDeath.of("its __init__ raised", creation_error=segs)
                               .to_wire()).to_error("Counter", "a1")
    assert isinstance(err, ActorDiedError) and "bad arg" in str(err)
    assert isinstance(err.cause, ValueError)


# -- handler tables --------------------------------------------------------------------------
def _unstarted_head() -> Head:
    """A Head never started, with the parts its tables take handlers from."""
    head = object.__new__(Head)
    head.dashboard = object.__new__(DashboardService)
    return head


def _tables() -> dict:
    """Each role's table, from objects that were never started (tables are only read)."""
    head, node, worker = _unstarted_head(), object.__new__(NodeDaemon), object.__new__(Worker)
    return {"head": Head.rpc_handlers(head), "node": NodeDaemon.rpc_handlers(node),
            "head->node": NodeDaemon.head_requests(node), "worker": Worker.rpc_handlers(worker)}


@pytest.mark.parametrize("classes,roles", [((Head, DashboardService), ("head",)),
                                           ((NodeDaemon,), ("node", "head->node")),
                                           ((Worker,), ("worker",))])
def test_every_rpc_method_of_a_role_is_in_its_table(classes, roles):
    """The head's table also routes to its dashboard service's rpc_ methods."""
    table = {name: fn for role in roles for name, fn in _tables()[role].items()}
    owner = {n: cls for cls in classes for n in dir(cls)
             if n.startswith("rpc_") and n != "rpc_handlers"}
    assert owner, f"{classes[0].__name__} has no rpc_ methods: update this test"
    assert {f"rpc_{name}" for name in table} == set(owner)
    for name, fn in table.items():
        assert fn.__func__ is getattr(owner[f"rpc_{name}"], f"rpc_{name}")


# Which role answers a request, by the connection it is sent on.
_RECEIVER = {
    "core.head": "head", "self.core.head": "head", "self.head": "head",
    "self.head_conn": "head", "conn": "head",   # conn: register_node's new connection
    "node.conn": "head->node", "n.conn": "head->node", "lease.node.conn": "head->node",
    "w.conn": "worker", "worker.node_conn": "node",
}
_CALL = re.compile(r'(?:rpc\.call|call_quietly)\(\s*([\w.]+),\s*"(\w+)"')
_HEAD_CALL = re.compile(r'head_call\(\s*"(\w+)"')


def test_every_request_sent_somewhere_is_in_the_receivers_table():
    tables = _tables()
    sent = []
    for folder in ("runtime", "ddlf_actors"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            sent += [(path.name, conn, name) for conn, name in _CALL.findall(text)]
            sent += [(path.name, "core.head", name) for name in _HEAD_CALL.findall(text)]
    assert len(sent) > 20, "found too few requests in the source: update this test"
    for where, conn, name in sent:
        assert conn in _RECEIVER, f"{where}: a request on {conn!r}: add it to _RECEIVER"
        assert name in tables[_RECEIVER[conn]], f"{where}: {name!r} is not answered by " \
                                                f"the {_RECEIVER[conn]} table"


_PUSH = re.compile(r'(?:rpc\.push\(\s*([\w.]+),|(_push_head),|(?<=\.)(push_head)\()\s*"(\w+)"')
_TO_HEAD = {"self.head", "self.core.head", "self.head_conn", "_push_head", "push_head"}


def test_every_event_pushed_to_the_head_is_in_its_push_table():
    table = Head.push_handlers(_unstarted_head())
    pushed = []
    for folder in ("runtime", "ddlf_actors"):
        for path in (ROOT / folder).rglob("*.py"):
            for conn, via, public, event in _PUSH.findall(path.read_text()):
                if (conn or via or public) in _TO_HEAD:
                    pushed.append((path.name, event))
    assert len(pushed) >= 6, f"found too few pushes to the head ({pushed}): update this test"
    for where, event in pushed:
        assert event in table, f"{where} pushes {event!r}, which the head ignores"


def test_a_node_answers_the_head_on_its_link_and_its_workers_on_its_port():
    tables = _tables()
    assert "worker_ready" not in tables["head->node"]   # only the node's own workers send it
    # The head's requests (start_actor, kill_worker, shutdown ...) never reach the port a
    # node listens on for its workers.
    assert set(tables["node"]) == {"worker_ready"}


# -- a malformed message reaching a server -----------------------------------------------------
class FakeConn:
    def __init__(self, loop):
        self.loop = loop
        self.info = ConnInfo()
        self.closed = False
        self.sent: list = []
        self.peer = ("127.0.0.1", 1)

    def send_msg(self, kind, msg_id, segs):
        self.sent.append((kind, msg_id, loads(segs)))

    def abort(self, exc=None):
        self.closed = True


def _run_head(scenario):
    async def main():
        head = Head(asyncio.get_running_loop(), "token")
        try:
            return await asyncio.wait_for(scenario(head), 10)
        finally:
            head.background.close()

    return asyncio.run(main())


def test_a_malformed_request_is_answered_as_a_bad_request():
    async def scenario(head):
        conn = FakeConn(asyncio.get_running_loop())
        head.rpc_hello_driver(conn, process.versions())
        bad = creation_dict(class_name=["not", "a", "name"])
        for msg_id, request in ((5, ("create_actors", ([bad],))),
                                (6, (("a", "tuple"), ())),
                                (7, ("create_actors", (bad,)))):   # not a list
            head.handler.frame_received(conn, [protocol.header(protocol.REQUEST, msg_id),
                                               *dumps(request)])
        for _ in range(20):
            await asyncio.sleep(0)
        return conn, head

    conn, head = _run_head(scenario)
    (k1, i1, r1), (k2, i2, e2), (k3, i3, e3) = sorted(conn.sent, key=lambda m: m[1])
    # A batch answers each creation: this one is refused, with what is wrong with it.
    assert (k1, i1) == (protocol.REPLY_OK, 5) and len(r1) == 1
    assert isinstance(r1[0], MessageError) and "class_name must be a str" in str(r1[0])
    assert (k2, i2) == (protocol.REPLY_ERR, 6) and "unknown request" in str(e2)
    assert (k3, i3) == (protocol.REPLY_ERR, 7) and isinstance(e3, MessageError)
    assert "takes a list of ActorCreation dicts" in str(e3)
    assert not conn.closed and head.actors.actors == {}


@pytest.mark.parametrize("event,data", [("heartbeat", 3), ("heartbeat", {}),
                                        ("worker_died", {"actor_id": "a"}),
                                        ("logs", {"records": None}), ("task_blocked", 5),
                                        ("task_unblocked", {}),
                                        ("release_name", {"actor_id": 7})])
def test_a_malformed_push_is_dropped_and_the_connection_kept(event, data, caplog):
    async def scenario(head):
        conn = FakeConn(asyncio.get_running_loop())
        with caplog.at_level(logging.WARNING, logger="ddlf.rpc"):
            head.handler.frame_received(conn, [protocol.header(protocol.PUSH),
                                               *dumps((event, data))])
        return conn

    conn = _run_head(scenario)
    assert not conn.closed
    assert f"dropped a malformed {event!r} push" in caplog.text


def test_a_handler_without_a_table_answers_no_request():
    # A driver's link to the head serves pushes only.
    class Target:
        def rpc_anything(self, conn):
            return 1

        def on_push(self, conn, event, data):
            pass

    conn = FakeConn(None)
    rpc.RpcHandler(Target()).frame_received(
        conn, [protocol.header(protocol.REQUEST, 1), *dumps(("anything", ()))])
    ((kind, _, err),) = conn.sent
    assert kind == protocol.REPLY_ERR and "unknown request 'anything'" in str(err)


# -- who may send what -----------------------------------------------------------------------
def test_worker_died_is_taken_only_from_the_node_that_runs_the_worker(caplog):
    from test_unit_head import FakeNode, create, driver, run, settle, spec

    async def scenario(loop, head):
        n1, n2 = FakeNode(loop, head, "n1"), FakeNode(loop, head, "n2")
        d = driver(head)
        d.peer = ("10.0.0.7", 5555)
        await create(head, d, spec("a1", max_restarts=1, node_id="n1"))
        a = head.actors.get("a1")
        died = {"worker_id": a.worker_id, "actor_id": "a1", "exitcode": -9, "pid": a.pid}
        with caplog.at_level(logging.WARNING, logger="ddlf.head"):
            for _ in range(3):   # a driver (any peer with the token) is not a node
                head.on_push(d, "worker_died", died)
        head.on_push(n2, "worker_died", died)   # another node: not its worker
        await settle()
        untouched = (a.state, a.epoch, a.restarts_left)
        head.on_push(n1, "worker_died", died)   # its own node: it restarts
        await settle()
        return untouched, (a.state, a.epoch, a.restarts_left)

    untouched, after = run(scenario)
    assert untouched == (ActorState.ALIVE, 1, 1)
    assert after == (ActorState.ALIVE, 2, 0)
    # Once per minute, naming the peer, however often it repeats.
    assert caplog.text.count("ignored a worker_died push from ('10.0.0.7', 5555)") == 1
    assert "only a registered node may send it" in caplog.text


@pytest.mark.parametrize("method,args", [("start_actor", (creation_dict(),)),
                                         ("lease_worker", ({"CPU": 1.0}, None)),
                                         ("release_worker", ("w1",)), ("kill_worker", ("w1",)),
                                         ("kill_actor", ("a1",)), ("shutdown", ())])
def test_a_nodes_own_port_does_not_answer_the_heads_requests(method, args):
    node = object.__new__(NodeDaemon)
    node.pool = WorkerPool(None, None, None, "", idle_task_cap=4)   # no workers
    conn = FakeConn(None)
    rpc.RpcHandler(node, node.rpc_handlers()).frame_received(
        conn, [protocol.header(protocol.REQUEST, 3), *dumps((method, args))])
    ((kind, msg_id, err),) = conn.sent
    assert (kind, msg_id) == (protocol.REPLY_ERR, 3)
    assert f"unknown request {method!r}" in str(err)
    assert method in node.head_requests()   # still answered on its link to the head


def test_a_nodes_own_port_still_answers_its_workers():
    node = object.__new__(NodeDaemon)
    node.pool = WorkerPool(None, None, None, "", idle_task_cap=4)   # no workers

    class Conn(FakeConn):
        def close(self):
            self.closed = True

    conn = Conn(None)
    rpc.RpcHandler(node, node.rpc_handlers()).frame_received(
        conn, [protocol.header(protocol.REQUEST, 4), *dumps(("worker_ready", ("w?", 7, 1)))])
    assert conn.closed   # a worker it did not start is turned away, not told "unknown"


def test_heartbeats_and_logs_are_taken_only_from_nodes(caplog):
    from test_unit_head import FakeNode, driver, run

    async def scenario(loop, head):
        n1, n2 = FakeNode(loop, head, "n1"), FakeNode(loop, head, "n2")
        d = driver(head)
        rec = head.nodes.get("n1")
        rec.missed = 3
        with caplog.at_level(logging.WARNING, logger="ddlf.head"):
            head.on_push(d, "heartbeat", {"node_id": "n1"})    # a driver
            head.on_push(n2, "heartbeat", {"node_id": "n1"})   # another node
            forged = rec.missed
            head.on_push(d, "logs", {"records": [(None, "W", 1, "out", "forged")]})
            head.on_push(n1, "heartbeat", {"node_id": "n1"})   # its own connection
            head.on_push(n1, "logs", {"records": [(None, "W", 1, "out", "real")]})
        return forged, rec.missed, [b["records"] for b in d.events("logs")]

    forged, after, routed = run(scenario)
    assert forged == 3 and after == 0
    assert routed == [[(None, "W", 1, "out", "real")]]
    assert "ignored a heartbeat for node n1" in caplog.text
    assert "ignored a logs push" in caplog.text
