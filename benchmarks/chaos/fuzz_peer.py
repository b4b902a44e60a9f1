"""``fuzz_wire.py``'s client side: one fuzzing connection (:class:`Peer`) with the moves the
cases need, and what a case observed (:class:`Case`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time

from ddlf_actors.runtime.errors import AuthenticationError, FrameError
from ddlf_actors.runtime.wire import auth
from ddlf_actors.runtime.wire.framing import FrameDecoder

# How long a server may take to drop a peer it must drop (framing error, wrong token).
DROP_DEADLINE_S = 3.0


# -- the client side ----------------------------------------------------------------------------
class Peer:
    """One fuzzing connection (asyncio streams) with the handful of moves the cases need."""

    def __init__(self, reader, writer):
        self.r = reader
        self.w = writer

    @classmethod
    async def open(cls, host, port):
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, data: bytes) -> bool:
        """Write and drain; False once the server has reset the connection."""
        try:
            self.w.write(data)
            await self.w.drain()
            return True
        except (ConnectionError, OSError):
            return False

    async def recv_exact(self, n: int, timeout: float = 5.0) -> bytes | None:
        try:
            return await asyncio.wait_for(self.r.readexactly(n), timeout)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.TimeoutError):
            return None

    async def challenge(self) -> bytes | None:
        return await self.recv_exact(auth.CHALLENGE_SIZE)

    async def handshake(self, token) -> bool:
        """The client side of the handshake with ``token``; True if the server accepted."""
        ch = await self.challenge()
        if ch is None:
            return False
        response, cn = auth.answer_challenge(token, ch)
        if not await self.send(response):
            return False
        reply = await self.recv_exact(auth.REPLY_SIZE)
        if reply is None:
            return False
        try:
            auth.check_reply(token, ch[-32:], cn, reply)
        except AuthenticationError:
            return False
        return True

    async def closed_by_peer(self, timeout: float = DROP_DEADLINE_S) -> bool:
        """True once the server closes (EOF or reset) within ``timeout``; reads and drops
        whatever it sends meanwhile (error replies)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if not await asyncio.wait_for(self.r.read(65536), left):
                    return True
        except (ConnectionError, OSError):
            return True
        except asyncio.TimeoutError:
            return False

    async def read_frames(self, timeout: float) -> list:
        """Frames the server sends within ``timeout`` (or until it closes)."""
        dec = FrameDecoder()
        frames: list = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return frames
                chunk = await asyncio.wait_for(self.r.read(65536), left)
                if not chunk:
                    return frames
                frames += dec.feed(chunk)
                if frames:
                    return frames
        except (ConnectionError, OSError, asyncio.TimeoutError, FrameError):
            return frames

    def reset(self) -> None:
        """Abort with an RST (SO_LINGER 0) instead of a FIN."""
        sock = self.w.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.w.transport.abort()

    def close(self) -> None:
        self.w.close()


class Case:
    """What one case observed: its kind, target and outcome."""

    __slots__ = ("index", "kind", "target", "outcome", "detail")

    def __init__(self, index, kind, target):
        self.index = index
        self.kind = kind
        self.target = target
        # ok | oracle_failure | control_failure | client_timeout | refused | client_error
        self.outcome = "ok"
        self.detail = ""

    def fail(self, outcome: str, detail: str) -> None:
        self.outcome = outcome
        self.detail = detail


async def end_connection(peer: Peer, rng: random.Random) -> None:
    """Leave the connection the way hostile peers do: FIN, RST, or a short stall first."""
    r = rng.random()
    if r < 0.15:
        await asyncio.sleep(rng.uniform(0, 0.3))
    if r < 0.5:
        peer.reset()
    else:
        peer.close()
