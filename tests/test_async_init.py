"""``async def __init__`` on an actor: awaited on the actor's event loop, as in Ray."""

from __future__ import annotations

import asyncio
import socket

import pytest
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError


@ddlf.remote
class Server:
    """Starts a TCP server from __init__ (Ray's actor-http-server example, without aiohttp)."""

    async def __init__(self, greeting, *, delay=0.0):
        await asyncio.sleep(delay)
        self.greeting = greeting
        self.loop = asyncio.get_running_loop()
        self.ticks = 0
        self.loop.create_task(self._tick())
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _tick(self):
        while True:
            self.ticks += 1
            await asyncio.sleep(0.01)

    async def _serve(self, reader, writer):
        writer.write(self.greeting.encode())
        await writer.drain()
        writer.close()

    async def port(self):
        # Methods run on the loop __init__ ran on.
        assert asyncio.get_running_loop() is self.loop
        return self.server.sockets[0].getsockname()[1]

    async def ticks_now(self):
        return self.ticks

    def sync_greeting(self):
        return self.greeting


@ddlf.remote
class BrokenAsyncInit:
    async def __init__(self, tag):
        await asyncio.sleep(0)
        raise KeyError(f"async init failed: {tag}")

    async def ping(self):
        return "pong"


def test_async_init_runs_on_the_actor_loop(cluster):
    ref = ddlf.put("hello over tcp")
    s = Server.remote(ref, delay=0.05)
    port = ddlf.get(s.port.remote(), timeout=30)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.settimeout(10)
        assert conn.recv(100) == b"hello over tcp"
    # A task __init__ started keeps running between calls.
    assert wait_for(lambda: ddlf.get(s.ticks_now.remote(), timeout=10) > 5, timeout=10)
    assert ddlf.get(s.sync_greeting.remote(), timeout=10) == "hello over tcp"


def test_async_init_error_is_a_creation_error(cluster):
    b = BrokenAsyncInit.remote("tag-271")
    with pytest.raises(ActorDiedError, match="tag-271") as info:
        ddlf.get(b.ping.remote(), timeout=30)
    assert isinstance(info.value.cause, KeyError)
    assert "__init__" in str(info.value)


def test_async_init_through_the_ray_layer(cluster):
    import ddlf_actors.compat.ray as ray

    @ray.remote
    class Counter:
        async def __init__(self):
            self.n = await asyncio.sleep(0, result=10)

        async def incr(self):
            self.n += 1
            return self.n

    c = Counter.remote()
    assert ray.get([c.incr.remote() for _ in range(3)], timeout=30) == [11, 12, 13]
