"""The head's dashboard side, as one part the head's shell holds: the runs drivers publish,
the requests and pushes about them, and the web server when one is asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import MessageError
from ..runs import RunStore

if TYPE_CHECKING:
    from ...wire.connection import Connection
    from .app import Dashboard

__all__ = ["DashboardService"]


class DashboardService:
    """``runs`` (a :class:`RunStore`) and, with ``spec`` (``{"host", "port", "fallback"}``),
    the web dashboard serving ``head`` (started by :meth:`start`)."""

    def __init__(self, head, spec: dict | None, warn):
        self.head = head
        self.spec = spec
        self.warn = warn          # the head's rate-limited warning
        self.runs = RunStore()
        self.server: Dashboard | None = None   # once started

    def rpc_handlers(self) -> dict:
        return {"publish_run": self.rpc_publish_run, "dashboard_url": self.rpc_dashboard_url}

    def push_handlers(self) -> dict:
        return {"publish_run": self.on_publish_run}   # a training run's rows and events

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    async def start(self) -> None:
        if self.spec:
            from .app import Dashboard  # imports aiohttp: only when a dashboard is asked for

            self.server = Dashboard(self.head, self.head.token, **self.spec)
            await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()

    def owner_gone(self, owner_id: str) -> None:
        self.runs.owner_gone(owner_id)

    def rpc_publish_run(self, conn: Connection, data: dict) -> None:
        """Record a run's description, rows, events or end (``RunStore.publish``:
        ``MessageError`` for a malformed one)."""
        self.runs.publish(data, conn.info.owner_id)

    def on_publish_run(self, conn: Connection, data) -> None:
        # A push has no reply to carry an error: the driver checked it before sending.
        try:
            self.runs.publish(data, conn.info.owner_id)
        except MessageError as e:
            self.warn("publish_run", "ignored a publish_run push from %s: %s", conn.peer, e)

    def rpc_dashboard_url(self, conn: Connection) -> str | None:
        return self.url
