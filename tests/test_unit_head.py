"""The head's naming and restart logic, driven with fake connections (no sockets, no processes).

A fake node answers the head's requests (start_actor, kill_actor ...) from a table, the
way its RPC handler would; fake drivers record what the head pushes to them.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from ddlf_actors.runtime import config, process
from ddlf_actors.runtime.errors import ActorNameTakenError
from ddlf_actors.runtime.head import Head
from ddlf_actors.runtime.states import ActorState
from ddlf_actors.runtime.wire import protocol
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.serialization import loads

_pids = itertools.count(100)


class FakeConn:
    """A driver's (or worker's) connection: records pushes."""

    def __init__(self):
        self.info = ConnInfo()
        self.closed = False
        self.pushed: list = []
        self.peer = ("127.0.0.1", 1)

    def send_msg(self, kind, msg_id, segs):
        if kind == protocol.PUSH:
            self.pushed.append(loads(segs))

    def abort(self, exc=None):
        self.closed = True

    def events(self, name):
        return [data for event, data in self.pushed if event == name]


class FakeNode(FakeConn):
    """A node daemon's connection: answers requests like the node's RPC handler would."""

    def __init__(self, loop, head: Head, node_id: str, cpus: float = 2.0):
        super().__init__()
        self.loop = loop
        self.calls: list = []
        self.fail_init = False
        info = {"node_id": node_id, "address": f"10.0.0.{len(head.nodes.nodes) + 1}:7000",
                "resources": {"CPU": cpus}, "pid": 1, **process.versions()}
        head.rpc_register_node(self, info)
        self.record = head.nodes.get(node_id)

    def send_msg(self, kind, msg_id, segs):
        if kind != protocol.REQUEST:
            return super().send_msg(kind, msg_id, segs)
        method, args = loads(segs)
        self.calls.append((method, args))
        reply = getattr(self, "on_" + method)(*args)

        def answer():
            fut = self.info.rpc_pending.pop(msg_id, None)
            if fut is not None and not fut.done():
                fut.set_result(reply)

        self.loop.call_soon(answer)

    def on_start_actor(self, spec):
        if self.fail_init:
            return {"ok": False, "error": None, "pid": 0}
        pid = next(_pids)
        return {"ok": True, "address": f"10.0.0.9:{pid}", "pid": pid, "worker_id": f"w{pid}"}

    def on_kill_actor(self, actor_id):
        return None

    def on_release_worker(self, worker_id):
        return None


def driver(head: Head) -> FakeConn:
    conn = FakeConn()
    head.rpc_hello_driver(conn, {**process.versions(), "job_id": None})
    return conn


async def create(head: Head, conn: FakeConn, creation: dict) -> dict:
    """Create one actor as a driver does (``create_actors``), and return the view the head
    pushes once its first start ends; raise the head's refusal if it refused."""
    (answer,) = head.rpc_create_actors(conn, [creation])
    if answer is not None:
        raise answer
    while True:
        for view in conn.events("actor_started"):
            if view["actor_id"] == creation["actor_id"]:
                return view
        await asyncio.sleep(0)


def spec(actor_id, name=None, max_restarts=0, cpus=1.0, detached=False, node_id=None):
    return {"actor_id": actor_id, "class_name": "Counter", "name": name,
            "resources": {"CPU": cpus}, "max_restarts": max_restarts, "detached": detached,
            "node_id": node_id, "methods": {}, "class_segments": [b"class"],
            "args_segments": [b"args"]}


def run(scenario):
    """Run ``scenario(loop, head)`` with a fresh head, bounded in time."""
    async def main():
        loop = asyncio.get_running_loop()
        head = Head(loop, "token")
        try:
            return await asyncio.wait_for(scenario(loop, head), 10)
        finally:
            head.background.close()

    return asyncio.run(main())


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


# -- names ---------------------------------------------------------------------------------------
def test_a_name_is_taken_until_its_actor_dies():
    async def scenario(loop, head):
        FakeNode(loop, head, "n1")
        d = driver(head)
        view = await create(head, d, spec("a1", name="counter"))
        assert view["state"] == "ALIVE" and head.rpc_get_actor(d, "counter")["actor_id"] == "a1"
        with pytest.raises(ActorNameTakenError, match="'counter' already exists"):
            await create(head, d, spec("a2", name="counter"))
        with pytest.raises(ActorNameTakenError):
            head.rpc_reserve_name(d, "counter", "a3", "Counter", {})
        assert head.rpc_kill_actor(d, "a1") is True
        assert head.rpc_get_actor(d, "counter") is None
        view = await create(head, d, spec("a4", name="counter"))
        return view, head.actors.names

    view, names = run(scenario)
    assert view["state"] == "ALIVE" and names == {"counter": "a4"}


def test_a_reserved_name_belongs_to_its_actor_until_released_by_its_owner():
    async def scenario(loop, head):
        FakeNode(loop, head, "n1")
        owner, other = driver(head), driver(head)
        head.rpc_reserve_name(owner, "q", "a1", "Queue", {"put": {}})
        # Reachable at once (Ray's semantics), before create_actor arrives.
        early = head.rpc_get_actor(other, "q")
        with pytest.raises(ActorNameTakenError):
            head.rpc_reserve_name(other, "q", "a2", "Queue", {})
        head.on_push(other, "release_name", {"actor_id": "a1"})   # not its reservation
        still = "a1" in head.actors.reserved
        head.on_push(owner, "release_name", {"actor_id": "a1"})
        return early, still, head.actors.reserved, head.actors.names

    early, still, reserved, names = run(scenario)
    assert early == {"actor_id": "a1", "class_name": "Queue", "methods": {"put": {}}}
    assert still and reserved == {} and names == {}


def test_create_actor_fills_its_reservation_and_wakes_waiters():
    async def scenario(loop, head):
        FakeNode(loop, head, "n1")
        d = driver(head)
        head.rpc_reserve_name(d, "svc", "a1", "Counter", {})
        waiter = loop.create_task(head.rpc_wait_actor(driver(head), "a1", 0))
        await settle()
        assert not waiter.done()
        await create(head, d, spec("a1", name="svc"))
        return await waiter, head.actors.reserved

    view, reserved = run(scenario)
    assert view["state"] == "ALIVE" and view["epoch"] == 1 and reserved == {}


def test_an_owner_that_disconnects_takes_its_names_and_non_detached_actors():
    async def scenario(loop, head):
        node = FakeNode(loop, head, "n1")
        d = driver(head)
        await create(head, d, spec("a1", name="mine"))
        await create(head, d, spec("a2", name="kept", detached=True))
        head.rpc_reserve_name(d, "later", "a3", "Counter", {})
        head.on_closed(d, None)
        await settle()
        return head, node

    head, node = run(scenario)
    assert head.actors.get("a1").state is ActorState.DEAD
    assert head.actors.get("a2").state is ActorState.ALIVE
    assert head.actors.names == {"kept": "a2"} and head.actors.reserved == {}
    assert ("kill_actor", ("a1",)) in node.calls
    assert node.record.available["CPU"] == 1.0   # a1's CPU is free again


# -- restarts ------------------------------------------------------------------------------------
def _died(head, node, actor_id, exitcode=-9, on_purpose=False):
    a = head.actors.get(actor_id)
    head.on_push(node, "worker_died", {"worker_id": a.worker_id, "actor_id": actor_id,
                                       "exitcode": exitcode, "pid": a.pid,
                                       "on_purpose": on_purpose})


def test_a_crashed_actor_restarts_while_max_restarts_allows():
    async def scenario(loop, head):
        node = FakeNode(loop, head, "n1")
        d = driver(head)
        await create(head, d, spec("a1", max_restarts=1))
        first = head.actors.get("a1").view()
        _died(head, node, "a1")
        restarting = head.actors.get("a1").state
        await settle()
        second = head.actors.get("a1").view()
        _died(head, node, "a1")
        await settle()
        return first, restarting, second, head.actors.get("a1"), d, node

    first, restarting, second, a, d, node = run(scenario)
    assert first["state"] == "ALIVE" and first["epoch"] == 1
    assert restarting is ActorState.RESTARTING
    assert second["state"] == "ALIVE" and second["epoch"] == 2 and second["pid"] != first["pid"]
    assert a.state is ActorState.DEAD and "died with exit code -9" in a.error["reason"]
    # Every core hears of each loss, so calls in flight fail instead of hanging.
    assert [e["epoch"] for e in d.events("actor_lost")] == [1, 2]
    assert node.record.available["CPU"] == 2.0


def test_unlimited_restarts():
    async def scenario(loop, head):
        node = FakeNode(loop, head, "n1")
        await create(head, driver(head), spec("a1", max_restarts=-1))
        for _ in range(5):
            _died(head, node, "a1")
            await settle()
        return head.actors.get("a1")

    a = run(scenario)
    assert a.state is ActorState.ALIVE and a.epoch == 6 and a.restarts_left == -1


def test_an_exit_on_purpose_or_a_kill_is_not_restarted():
    async def scenario(loop, head):
        node = FakeNode(loop, head, "n1")
        d = driver(head)
        await create(head, d, spec("a1", max_restarts=3))
        await create(head, d, spec("a2", max_restarts=3))
        _died(head, node, "a1", exitcode=0, on_purpose=True)
        head.rpc_kill_actor(d, "a2")
        _died(head, node, "a2")
        await settle()
        return head.actors.get("a1"), head.actors.get("a2")

    a1, a2 = run(scenario)
    assert a1.state is ActorState.DEAD and "exited on purpose" in a1.error["reason"]
    assert a2.state is ActorState.DEAD and "killed with ddlf.kill()" in a2.error["reason"]


def test_kill_with_restart_allowed_restarts():
    async def scenario(loop, head):
        node = FakeNode(loop, head, "n1")
        d = driver(head)
        await create(head, d, spec("a1", max_restarts=1))
        head.rpc_kill_actor(d, "a1", False)
        await settle()
        _died(head, node, "a1")
        await settle()
        return head.actors.get("a1"), node

    a, node = run(scenario)
    assert ("kill_actor", ("a1",)) in node.calls
    assert a.state is ActorState.ALIVE and a.epoch == 2


def test_an_actor_restarts_on_another_node_when_its_node_dies():
    async def scenario(loop, head):
        n1 = FakeNode(loop, head, "n1")
        d = driver(head)
        await create(head, d, spec("a1", max_restarts=1, cpus=2))
        on_first = head.actors.get("a1").node.node_id
        n2 = FakeNode(loop, head, "n2")
        head.on_closed(n1, None)     # the node daemon's connection closed
        await settle()
        return on_first, head.actors.get("a1"), n2, d

    on_first, a, n2, d = run(scenario)
    assert on_first == "n1" and a.node.node_id == "n2" and a.state is ActorState.ALIVE
    assert n2.record.available["CPU"] == 0.0
    assert [e["node_id"] for e in d.events("node_dead")] == ["n1"]


def test_a_failed_init_is_dead_at_once_and_frees_its_resources():
    async def scenario(loop, head):
        node = FakeNode(loop, head, "n1")
        node.fail_init = True
        view = await create(head, driver(head), spec("a1", name="x", max_restarts=5))
        return view, node.record.available, head.actors.names

    view, available, names = run(scenario)
    assert view["state"] == "DEAD" and view["error"]["reason"] == "its __init__ raised"
    assert available == {"CPU": 2.0}
    assert names == {}


def test_an_actor_no_node_can_hold_is_unschedulable_not_waiting():
    async def scenario(loop, head):
        FakeNode(loop, head, "n1", cpus=2)
        return await create(head, driver(head), spec("a1", cpus=3))

    view = run(scenario)
    assert view["state"] == "DEAD" and view["error"]["unschedulable"]
    assert "asks for {'CPU': 3}" in view["error"]["reason"]


def test_an_actor_waits_for_resources_then_starts():
    async def scenario(loop, head):
        FakeNode(loop, head, "n1", cpus=1)
        d = driver(head)
        await create(head, d, spec("a1"))
        second = loop.create_task(create(head, d, spec("a2")))
        await settle()
        waiting = (second.done(), head.actors.get("a2").state)
        head.rpc_kill_actor(d, "a1")
        return waiting, await second

    (done, state), view = run(scenario)
    assert not done and state is ActorState.PENDING
    assert view["state"] == "ALIVE"


# -- dead actors ---------------------------------------------------------------------------------
def test_the_head_keeps_a_bounded_number_of_dead_actors_without_their_arguments(monkeypatch):
    monkeypatch.setattr(config, "DEAD_ACTORS_KEPT", 2)

    async def scenario(loop, head):
        node = FakeNode(loop, head, "n1", cpus=4)
        d = driver(head)
        for i in range(4):
            await create(head, d, spec(f"a{i}"))
        sent = [args[0]["args_segments"] for method, args in node.calls
                if method == "start_actor"]
        for i in range(4):
            head.rpc_kill_actor(d, f"a{i}")
        forgotten = await head.rpc_wait_actor(d, "a0", 0)
        kept = await head.rpc_wait_actor(d, "a3", 0)
        return sent, head.rpc_list_actors(d), forgotten, kept, head.actors.get("a3"), node

    sent, listed, forgotten, kept, record, node = run(scenario)
    assert sent == [[b"args"]] * 4   # the node got them; the head did not need to keep them
    assert [v["actor_id"] for v in listed] == ["a2", "a3"]
    assert forgotten["state"] == "DEAD" and "no such actor" in forgotten["error"]["reason"]
    assert kept["state"] == "DEAD" and "killed with ddlf.kill()" in kept["error"]["reason"]
    assert record.creation.args_segments == [] and record.creation.class_segments == []
    assert node.record.available == {"CPU": 4.0}


# -- creation in batches ------------------------------------------------------------------------
def test_a_batch_of_creations_is_answered_at_once_and_each_view_follows_as_a_push():
    async def scenario(loop, head):
        n1, n2 = FakeNode(loop, head, "n1", cpus=2), FakeNode(loop, head, "n2", cpus=2)
        d = driver(head)
        head.rpc_reserve_name(driver(head), "svc", "other", "Counter", {})
        batch = [spec("a1"), spec("a2", name="svc"), spec("a3", cpus=64), spec("a4"),
                 {"actor_id": "a5", "class_name": 5}]
        answers = head.rpc_create_actors(d, batch)
        at_once = [v["actor_id"] for v in d.events("actor_started")]
        await settle()
        return answers, at_once, d, head, n1, n2

    answers, at_once, d, head, n1, n2 = run(scenario)
    assert answers[0] is None and answers[2] is None and answers[3] is None
    assert isinstance(answers[1], ActorNameTakenError)
    assert "class_name must be a str" in str(answers[4])
    assert at_once == ["a3"]   # unschedulable: dead before the reply, nothing to wait for
    views = {v["actor_id"]: v for v in d.events("actor_started")}
    assert sorted(views) == ["a1", "a3", "a4"]
    assert views["a3"]["state"] == "DEAD" and views["a3"]["error"]["unschedulable"]
    assert views["a1"]["state"] == views["a4"]["state"] == "ALIVE"
    # One placement pass spread them: one CPU taken on each node.
    assert n1.record.available == n2.record.available == {"CPU": 1.0}
    assert head.actors.get("a2") is None and head.actors.get("a5") is None


# -- a new head's first node -------------------------------------------------------------------
def test_a_hello_to_a_head_with_no_node_yet_waits_for_the_first_one():
    """``ddlf-node start --head`` starts the head's own node once the head serves: a client
    in between is answered once that node registers (within the wait it asked for), so
    its first creation finds it. A head that had nodes answers at once, even with none
    alive; so does one whose first node never comes, after the wait."""
    async def scenario(loop, head):
        conn = FakeConn()
        hello = head.rpc_hello_driver(conn, {**process.versions(), "await_node_s": 5})
        task = asyncio.ensure_future(hello)
        await asyncio.sleep(0.1)
        assert not task.done(), "answered with no node in the cluster"
        node = FakeNode(loop, head, "n1")
        reply = await asyncio.wait_for(task, 1)
        assert reply["node_totals"] == [{"CPU": 2.0}] and conn in head.cores
        head._node_dead(node.record, "test")
        again = head.rpc_hello_driver(FakeConn(), {**process.versions(), "await_node_s": 5})
        assert again["node_totals"] == []            # had a node: no wait

    run(scenario)

    async def never(loop, head):
        hello = head.rpc_hello_driver(FakeConn(), {**process.versions(), "await_node_s": 0.2})
        return await asyncio.wait_for(hello, 2)

    assert run(never)["node_totals"] == []
