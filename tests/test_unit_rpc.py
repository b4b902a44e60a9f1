"""runtime/wire/rpc.py's handler, driven with a fake connection (no sockets, no processes)."""

from __future__ import annotations

import asyncio

import pytest

from ddlf_actors.runtime.errors import ConnectionLostError, FrameError
from ddlf_actors.runtime.wire import protocol, rpc
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.serialization import dumps, loads


class FakeConn:
    def __init__(self, loop=None):
        self.loop = loop
        self.info = ConnInfo()
        self.closed = False
        self.sent: list = []
        self.aborted = None
        self.peer = ("127.0.0.1", 1)

    def send_msg(self, kind, msg_id, segs):
        self.sent.append((kind, msg_id, loads(segs) if segs else None))

    def abort(self, exc=None):
        self.closed = True
        self.aborted = exc


class Target:
    def __init__(self):
        self.pushed = []
        self.closed = []

    def rpc_add(self, conn, a, b):
        return a + b

    def rpc_boom(self, conn):
        raise KeyError("nope")

    async def rpc_later(self, conn, x):
        await asyncio.sleep(0)
        return x * 2

    def handlers(self) -> dict:
        return {"add": self.rpc_add, "boom": self.rpc_boom, "later": self.rpc_later}

    def on_push(self, conn, event, data):
        self.pushed.append((event, data))

    def on_closed(self, conn, exc):
        self.closed.append(exc)


def _request(msg_id, method, *args):
    return [protocol.header(protocol.REQUEST, msg_id), *dumps((method, args))]


def test_request_reply_error_and_unknown_method():
    conn, target = FakeConn(), Target()
    h = rpc.RpcHandler(target, target.handlers())
    h.frame_received(conn, _request(1, "add", 2, 3))
    h.frame_received(conn, _request(2, "boom"))
    h.frame_received(conn, _request(3, "no_such"))
    (k1, i1, v1), (k2, i2, v2), (k3, i3, v3) = conn.sent
    assert (k1, i1, v1) == (protocol.REPLY_OK, 1, 5)
    assert (k2, i2) == (protocol.REPLY_ERR, 2) and isinstance(v2, rpc.RemoteRpcError)
    assert "KeyError" in str(v2)
    assert (k3, i3) == (protocol.REPLY_ERR, 3) and "unknown request 'no_such'" in str(v3)


def test_async_request_replies_when_done():
    async def scenario():
        conn = FakeConn(asyncio.get_running_loop())
        target = Target()
        rpc.RpcHandler(target, target.handlers()).frame_received(conn, _request(7, "later", 21))
        for _ in range(10):
            await asyncio.sleep(0)
        return conn.sent

    assert asyncio.run(scenario()) == [(protocol.REPLY_OK, 7, 42)]


def test_push_goes_to_on_push():
    conn, target = FakeConn(), Target()
    rpc.RpcHandler(target, target.handlers()).frame_received(
        conn, [protocol.header(protocol.PUSH), *dumps(("heartbeat", {"n": 1}))])
    assert target.pushed == [("heartbeat", {"n": 1})]


def test_a_failing_push_handler_or_unreadable_push_keeps_the_connection(caplog):
    class Buggy(Target):
        def on_push(self, conn, event, data):
            raise TypeError("a bug in the handler")

    conn, target = FakeConn(), Buggy()
    h = rpc.RpcHandler(target, target.handlers())
    h.frame_received(conn, [protocol.header(protocol.PUSH), *dumps(("logs", {"n": 1}))])
    h.frame_received(conn, [protocol.header(protocol.PUSH), *dumps("not a pair")])
    assert not conn.closed and conn.aborted is None
    assert "push handler failed" in caplog.text and "a bug in the handler" in caplog.text
    assert "unreadable push" in caplog.text
    # Requests still work on the same connection.
    h.frame_received(conn, _request(9, "add", 1, 1))
    assert conn.sent[-1] == (protocol.REPLY_OK, 9, 2)


@pytest.mark.parametrize("kind", [protocol.CALL, protocol.OBJ, protocol.RESULT_OK, 200])
def test_a_data_plane_frame_on_a_control_connection_aborts_it(kind):
    conn, target = FakeConn(), Target()
    rpc.RpcHandler(target, target.handlers()).frame_received(conn, [protocol.header(kind, 1), b"x"])
    assert conn.closed and isinstance(conn.aborted, FrameError)
    assert conn.sent == [] and target.pushed == []


def test_closing_fails_pending_calls_and_tells_the_target():
    async def scenario():
        conn, target = FakeConn(asyncio.get_running_loop()), Target()
        h = rpc.RpcHandler(target, target.handlers())
        call = asyncio.ensure_future(rpc.call(conn, "add", 1, 2))
        await asyncio.sleep(0)
        h.connection_closed(conn, None)
        with pytest.raises(ConnectionLostError):
            await call
        return target.closed

    assert asyncio.run(scenario()) == [None]
