"""The head's web dashboard: nodes, actors, tasks, placement groups and training runs, live.

``ddlf-node start --head --dashboard-port 8265`` (0: off) or ``ddlf.init(dashboard=True)``
serves it from the head's own event loop with aiohttp (the ``dashboard`` extra). It is
read-only and binds loopback by default; see ``app.py`` for its rules.

===========  =====================================================================
module       holds
===========  =====================================================================
service.py   ``DashboardService``: the head's part: published runs, the server's life
views.py     what each page part and JSON endpoint shows, read from the managers
app.py       the aiohttp application: routes, the token rule, ``Dashboard``
static/      the page: ``index.html``, ``app.js`` (polls ``/api/snapshot``), CSS
===========  =====================================================================

aiohttp is imported only when a dashboard starts, never at head import.
"""

from __future__ import annotations

import importlib.util

__all__ = ["DEFAULT_PORT", "MISSING_MESSAGE", "available", "head_args"]

DEFAULT_PORT = 8265   # Ray's, so muscle memory works
MISSING_MESSAGE = ("the dashboard needs aiohttp, which is not installed: "
                   "pip install 'ddlf-actors[dashboard]' (or pip install aiohttp), "
                   "or pass --dashboard-port 0 to start without a dashboard")


def available() -> bool:
    """Whether aiohttp can be imported (without importing it)."""
    return importlib.util.find_spec("aiohttp") is not None


def head_args(port: int | None, host: str = "127.0.0.1") -> tuple[list, str | None]:
    """The head's dashboard flags for ``port`` on ``host``, and a note to print when the
    default dashboard is off for want of aiohttp. ``ValueError`` when a port was asked for
    and cannot be had.

    ``port=None`` (the default of ``ddlf-node start --head`` and ``ddlf up``) serves the
    dashboard on 8265 (any free port if that is taken) when aiohttp is installed, as Ray's
    does; without aiohttp the head starts without one, and the note says how to get it.
    ``port=0`` means no dashboard. An explicit port must be free, and needs aiohttp.
    """
    if port is not None and not 0 <= port < 65536:
        raise ValueError(f"--dashboard-port must be a port number, or 0 for none; got {port}")
    if port == 0:
        return [], None
    if not available():
        if port is None:
            return [], ("no dashboard: it needs aiohttp (pip install 'ddlf-actors[dashboard]'); "
                        "--dashboard-port 0 starts without one and without this note")
        raise ValueError(MISSING_MESSAGE)
    args = ["--dashboard-host", host, "--dashboard-port", str(port or DEFAULT_PORT)]
    return (args + ["--dashboard-port-fallback"] if port is None else args), None
