"""How a connection's frames reach the code that handles them.

A :class:`~connection.Connection` hands every frame it parses, and its end, to one
handler: a :class:`FrameHandler`. Each role's handler lists the frame kinds it accepts in
one table, ``FRAMES = {kind: function}``, as Dask lists a role's endpoints in one handler
dict; :class:`TableFrameHandler` looks the kind up there, so a frame reaches only a
function named in the table, and a kind the role does not expect ends the connection
(a peer that sends one is broken or hostile, and the stream cannot be trusted further).

The functions take ``(handler, conn, kind, msg_id, segs)``: ``segs[0]`` is the header
(runtime/wire/protocol.py), ``segs[1:]`` the frame's body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Protocol, runtime_checkable

from ..errors import FrameError
from . import protocol

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["FrameHandler", "FrameFn", "TableFrameHandler"]

_parse = protocol.HEADER.unpack

# (handler, conn, kind, msg_id, segments) -> None
FrameFn = Callable[[Any, Any, int, int, list], None]


@runtime_checkable
class FrameHandler(Protocol):
    """What a connection calls (on its event loop) with each frame and at its end."""

    def frame_received(self, conn: Any, segs: list) -> None:
        """One frame: ``segs[0]`` is its header. Raising aborts the connection."""

    def connection_closed(self, conn: Any, exc: BaseException | None) -> None:
        """The connection is closed (``exc`` is why, or None for an orderly close)."""


class TableFrameHandler:
    """A :class:`FrameHandler` that dispatches frames through its class's ``FRAMES``.

    Subclasses set ``FRAMES`` in their class body, from the functions defined above it,
    and define ``connection_closed``.
    """

    __slots__ = ()
    FRAMES: ClassVar[Mapping[int, FrameFn]] = {}

    def frame_received(self, conn: Connection, segs) -> None:
        kind, msg_id = _parse(segs[0])
        fn = self.FRAMES.get(kind)
        if fn is None:
            self.unexpected_frame(conn, kind)
            return
        fn(self, conn, kind, msg_id, segs)

    def unexpected_frame(self, conn: Connection, kind: int) -> None:
        """A kind this role never receives: drop the peer quietly (no traceback per frame)."""
        conn.abort(FrameError(f"unexpected frame kind {kind} for {type(self).__name__}"))
