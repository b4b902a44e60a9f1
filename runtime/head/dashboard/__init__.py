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

__all__ = ["DEFAULT_PORT", "MISSING_MESSAGE", "available"]

DEFAULT_PORT = 8265   # Ray's, so muscle memory works
MISSING_MESSAGE = ("the dashboard needs aiohttp, which is not installed: "
                   "pip install 'ddlf-actors[dashboard]' (or pip install aiohttp), "
                   "or pass --dashboard-port 0 to start without a dashboard")


def available() -> bool:
    """Whether aiohttp can be imported (without importing it)."""
    return importlib.util.find_spec("aiohttp") is not None
