"""One authenticated, framed TCP connection (an ``asyncio.BufferedProtocol``).

With TLS configured (:mod:`tls`, the ``DDLF_TLS_*`` variables), the socket is wrapped in
mutual TLS first; the token handshake then runs inside it, unchanged.

The protocol first runs the handshake in :mod:`auth` with fixed-size reads, then
parses frames with :class:`FrameDecoder`. ``BufferedProtocol`` lets a large segment
be received straight into its final buffer, so a 100 MB array costs no extra copy on
the receiving side. Writes are queued and flushed once per loop iteration, which
coalesces the many small frames of a burst of calls into one ``writev``.

A framing error aborts the connection: after one, the stream has no trustworthy
frame boundary left, so the connection is never reused.
"""

from __future__ import annotations

import asyncio
import encodings.idna  # noqa: F401  (see below)
import logging
import socket
import ssl
import time
from typing import Any

from .. import config
from ..errors import AuthenticationError, ConnectionLostError, FrameError
from ..states import ConnectionState
from . import auth, protocol, tls
from .conninfo import ConnInfo
from .framing import FrameDecoder, encode_frame

__all__ = ["Connection", "connect", "serve", "RejectionLog"]

# uvloop encodes the host name of every serve() and connect() with the idna codec, which
# Python imports on first use (with stringprep, unicodedata and a regex: 5 ms of CPU, most
# of it searching sys.path). Imported here, it is in the node's forkserver, which preloads
# the worker module and so this one, instead of being imported by every new worker.

log = logging.getLogger("ddlf.connection")


class _Window:
    __slots__ = ("end", "count", "timer")

    def __init__(self, end: float):
        self.end = end
        self.count = 0
        self.timer: asyncio.TimerHandle | None = None


class RejectionLog:
    """Logs rejected connections without letting a flood of them flood the log.

    The first rejection from a source address is logged in full. Later ones within
    ``config.REJECT_LOG_INTERVAL_S`` are only counted, and one line per interval sums
    them up ("N more connections from X rejected in the last 10 s"), as sshd and nginx
    do. A source that goes quiet for an interval is forgotten, so its next rejection is
    logged in full again.
    """

    MAX_SOURCES = 1024   # beyond this many noisy sources, the rest share one entry
    OTHERS = "other addresses"

    def __init__(self, logger: logging.Logger):
        self._log = logger
        self._sources: dict[str, _Window] = {}

    def rejected(self, peer, msg: str, *args) -> None:
        host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
        now = time.monotonic()
        win = self._sources.get(host)
        if win is not None and now >= win.end:
            # Normally the window's timer has summed it up already; not if its event loop
            # stopped running (a driver that shut down and started again).
            self._close(host, win, now)
            win = self._sources.get(host)
        if win is None and len(self._sources) >= self.MAX_SOURCES:
            host = self.OTHERS
            win = self._sources.get(host)
        if win is None:
            self._log.warning(msg, *args)
            self._open(host, now)
        else:
            win.count += 1

    def _open(self, host: str, now: float) -> None:
        interval = config.REJECT_LOG_INTERVAL_S
        win = self._sources[host] = _Window(now + interval)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        win.timer = loop.call_later(interval, self._due, host, win)

    def _due(self, host: str, win: _Window) -> None:
        if self._sources.get(host) is win:
            self._close(host, win, time.monotonic())

    def _close(self, host: str, win: _Window, now: float) -> None:
        del self._sources[host]
        if win.timer is not None:
            win.timer.cancel()
        if win.count:
            self._log.warning("%d more connection(s) from %s rejected in the last %g s",
                              win.count, host, config.REJECT_LOG_INTERVAL_S)
            # A flood that goes on gets one summary line per interval, no more.
            self._open(host, now)


_rejections = RejectionLog(log)

# Module-level names for the hot path (get_buffer/buffer_updated run on every read).
_AUTH_CLIENT_CHALLENGE = ConnectionState.AWAIT_CHALLENGE
_AUTH_CLIENT_REPLY = ConnectionState.AWAIT_REPLY
_AUTH_SERVER_RESPONSE = ConnectionState.AWAIT_RESPONSE
_OPEN = ConnectionState.OPEN
_CLOSED = ConnectionState.CLOSED


class Connection(asyncio.BufferedProtocol):
    """A framed connection. ``handler`` gets ``frame_received(conn, segments)`` and
    ``connection_closed(conn, exc)``; ``on_open(conn)`` runs once authentication succeeds."""

    def __init__(self, token, handler, *, server: bool, max_frame_bytes: int | None = None,
                 on_open=None):
        self.token = token
        self.handler = handler
        self.server = server
        self.on_open = on_open
        self.decoder = FrameDecoder(max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        # Declared, not set: connection_made sets it, and asyncio calls connection_made
        # before anything else runs on a connection (no one has the object before that).
        self.loop: asyncio.AbstractEventLoop
        self.peer = None
        self.state = _AUTH_SERVER_RESPONSE if server else _AUTH_CLIENT_CHALLENGE
        self._auth_buf = bytearray()
        self._auth_mem = memoryview(bytearray(256))
        self._server_nonce = b""
        self._client_nonce = b""
        self.ready: asyncio.Future | None = None
        self._out: list = []
        self._flush_scheduled = False
        self.closed = False
        self.close_exc: BaseException | None = None
        self.info = ConnInfo()   # what the handlers keep about this connection
        self._auth_timer: asyncio.TimerHandle | None = None
        # A server's factory runs when the socket is accepted, before any TLS handshake:
        # the handshake deadline counts from here, so TLS and token together get one
        # HANDSHAKE_TIMEOUT_S, not one each.
        self._accepted = time.monotonic()

    def _cancel_auth_timer(self):
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None

    # -- asyncio protocol ----------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.ready = self.loop.create_future()
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        if self.server:
            msg, self._server_nonce = auth.make_challenge()
            transport.write(msg)
            # A peer that connects and then stays silent (or sends a few bytes) would
            # otherwise hold a socket and its file descriptor forever.
            left = config.HANDSHAKE_TIMEOUT_S - (time.monotonic() - self._accepted)
            self._auth_timer = self.loop.call_later(max(0.0, left), self._auth_timed_out)

    def _auth_timed_out(self):
        if self.state not in (_OPEN, _CLOSED):
            _rejections.rejected(self.peer, "dropping %s: no authentication within %.0f s",
                                 self.peer, config.HANDSHAKE_TIMEOUT_S)
            self.abort(AuthenticationError(
                f"handshake not completed within {config.HANDSHAKE_TIMEOUT_S:.0f} s"))

    def get_buffer(self, sizehint):
        if self.state is _OPEN:
            return self.decoder.get_buffer()
        return self._auth_mem

    def buffer_updated(self, nbytes):
        if self.state is _OPEN:
            try:
                frames = self.decoder.buffer_updated(nbytes)
            except FrameError as e:
                log.warning("aborting connection from %s: %s", self.peer, e)
                self.abort(e)
                return
            self._deliver(frames)
        elif self.state is not _CLOSED:
            self._auth_buf += self._auth_mem[:nbytes]
            self._advance_auth()

    def _deliver(self, frames):
        handler = self.handler
        for segs in frames:
            if self.closed:
                return
            try:
                handler.frame_received(self, segs)
            except Exception as e:  # a handler bug must not leave the peer waiting forever
                log.exception("error handling a frame from %s", self.peer)
                self.abort(e)
                return

    def _advance_auth(self):
        buf = self._auth_buf
        transport = self.transport
        assert transport is not None  # bytes arrive only after connection_made set it
        try:
            if self.state is _AUTH_CLIENT_CHALLENGE:
                if len(buf) < auth.CHALLENGE_SIZE:
                    return
                challenge = bytes(buf[: auth.CHALLENGE_SIZE])
                del buf[: auth.CHALLENGE_SIZE]
                response, self._client_nonce = auth.answer_challenge(self.token, challenge)
                self._server_nonce = challenge[-32:]
                transport.write(response)
                self.state = _AUTH_CLIENT_REPLY
            if self.state is _AUTH_CLIENT_REPLY:
                if len(buf) < auth.REPLY_SIZE:
                    return
                reply = bytes(buf[: auth.REPLY_SIZE])
                del buf[: auth.REPLY_SIZE]
                auth.check_reply(self.token, self._server_nonce, self._client_nonce, reply)
                self._open(bytes(buf))
            elif self.state is _AUTH_SERVER_RESPONSE:
                if len(buf) < auth.RESPONSE_SIZE:
                    return
                response = bytes(buf[: auth.RESPONSE_SIZE])
                del buf[: auth.RESPONSE_SIZE]
                ok, reply = auth.check_answer(self.token, self._server_nonce, response)
                transport.write(reply)
                if not ok:
                    if response.startswith(b"\x16\x03"):  # a TLS ClientHello, not a token
                        _rejections.rejected(self.peer, "rejected a TLS connection from %s: this "
                                             "process has no TLS configured (DDLF_TLS_* or "
                                             "--tls-cert/--tls-key/--tls-ca)", self.peer)
                    else:
                        _rejections.rejected(self.peer, "rejected a connection from %s: wrong "
                                             "or missing token", self.peer)
                    self.state = _CLOSED
                    transport.close()  # flushes the "refused" reply first
                    return
                self._open(bytes(buf))
        except AuthenticationError as e:
            self.abort(e)

    def _open(self, leftover: bytes):
        self.state = _OPEN
        self._cancel_auth_timer()
        self._auth_buf = bytearray()
        if self.ready is not None and not self.ready.done():
            # Not set_result(self): a future holding its connection is a reference cycle,
            # which keeps a closed connection's 256 KiB receive buffer until a full GC.
            self.ready.set_result(None)
        if self.on_open is not None:
            self.on_open(self)
        if leftover:
            try:
                frames = self.decoder.feed(leftover)
            except FrameError as e:
                self.abort(e)
                return
            self._deliver(frames)

    def connection_lost(self, exc):
        self._cancel_auth_timer()
        was_open = self.state is _OPEN
        nothing_yet = self.state is _AUTH_CLIENT_CHALLENGE and not self._auth_buf
        self.state = _CLOSED
        self.closed = True
        if exc is None and self.close_exc is not None:
            exc = self.close_exc
        if self.ready is not None and not self.ready.done():
            if self.server:
                self.ready.cancel()
            elif isinstance(exc, AuthenticationError):
                self.ready.set_exception(exc)
            elif isinstance(exc, ssl.SSLError):
                # With TLS 1.3 a client finishes its side of the handshake before the server
                # has checked the client's certificate: a refusal arrives here, as an alert.
                self.ready.set_exception(AuthenticationError(tls.describe_ssl_error(exc, self.peer)))
            elif (nothing_yet and self.transport is not None
                  and self.transport.get_extra_info("sslcontext") is not None):
                # A DDLF server sends its challenge as soon as TLS is up; closing before
                # that means it refused our certificate (its alert reaches us as a bare EOF).
                self.ready.set_exception(AuthenticationError(
                    f"the peer at {self.peer} closed the connection right after the TLS "
                    f"handshake: it refused our certificate ({tls.ENV_CERT} must be signed by the "
                    f"CA the cluster trusts; check {tls.ENV_CERT} and {tls.ENV_CA})"))
            elif nothing_yet:
                self.ready.set_exception(AuthenticationError(
                    f"the peer at {self.peer} closed the connection without starting the DDLF "
                    f"handshake: it probably requires TLS (set {tls.ENV_CERT}, {tls.ENV_KEY} and "
                    f"{tls.ENV_CA}), or is not a DDLF port"))
            else:
                self.ready.set_exception(AuthenticationError(
                    "the peer closed the connection during the handshake: most likely it "
                    "rejected our token (pass the head's token with ddlf.init(token=...) or "
                    "DDLF_AUTH_TOKEN)"))
        self._out.clear()
        if was_open or not self.server:
            try:
                self.handler.connection_closed(self, exc)
            except Exception:
                log.exception("error in connection_closed handler")

    def eof_received(self):
        return False

    # -- sending ---------------------------------------------------------------------------
    def send(self, segments) -> None:
        """Queue one frame; it is written at the end of this loop iteration."""
        if self.closed:
            raise ConnectionLostError(f"connection to {self.peer} is closed")
        self._out.extend(encode_frame(segments))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def send_msg(self, kind: int, msg_id: int, segments=()) -> None:
        self.send([protocol.header(kind, msg_id), *segments])

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self.closed:
            out, self._out = self._out, []
            assert self.transport is not None  # send() scheduled this after connection_made
            self.transport.writelines(out)

    def abort(self, exc: BaseException | None = None) -> None:
        if self.closed:
            return
        self.close_exc = exc
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()


_FROM_ENV = object()


async def connect(host: str, port: int, token, handler, *, timeout: float = 10.0,
                  max_frame_bytes: int | None = None, tls_context=_FROM_ENV) -> Connection:
    """Open an authenticated connection; raise ``AuthenticationError`` or ``OSError``.

    ``tls_context`` defaults to the one ``DDLF_TLS_*`` describes (none: plain TCP); pass an
    ``ssl.SSLContext`` or ``None`` to choose explicitly.
    """
    loop = asyncio.get_running_loop()
    ctx = tls.client_context() if tls_context is _FROM_ENV else tls_context
    extra: dict[str, Any] = {} if ctx is None else {"ssl": ctx, "ssl_handshake_timeout": timeout}
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: Connection(token, handler, server=False, max_frame_bytes=max_frame_bytes),
                host, port, **extra),
            timeout,
        )
    except ssl.SSLError as e:
        raise AuthenticationError(tls.describe_ssl_error(e, (host, port))) from e
    # create_connection returns once connection_made has run, which made the future.
    assert conn.ready is not None
    await asyncio.wait_for(conn.ready, timeout)
    return conn


async def serve(host: str, port: int, token, handler, *, on_open=None,
                max_frame_bytes: int | None = None, tls_context=_FROM_ENV) -> asyncio.Server:
    """Listen on ``host:port`` (port 0 picks a free one); each peer must authenticate.

    With TLS (``tls_context``, by default from ``DDLF_TLS_*``) a peer must first complete a
    mutual TLS handshake, within the same ``HANDSHAKE_TIMEOUT_S`` as the token handshake.
    """
    loop = asyncio.get_running_loop()
    ctx = tls.server_context() if tls_context is _FROM_ENV else tls_context
    extra: dict[str, Any] = {} if ctx is None else {
        "ssl": ctx, "ssl_handshake_timeout": config.HANDSHAKE_TIMEOUT_S}
    return await loop.create_server(
        lambda: Connection(token, handler, server=True, max_frame_bytes=max_frame_bytes,
                           on_open=on_open),
        host, port, reuse_address=True, backlog=1024, **extra,
    )
