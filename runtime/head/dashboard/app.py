"""The dashboard's HTTP side: aiohttp on the head's own event loop, read-only, token-gated
off loopback.

Ray's dashboard let anyone who reached it submit jobs, that is run code
(CVE-2023-48022). This one cannot change anything:

* **Read-only.** Every route is GET (and HEAD), except ``POST /login``, which only checks
  a token and sets a cookie. Any other method is refused with 405 before anything else
  runs. The handlers only call :mod:`.views`, which only read the head's managers.
* **Loopback by default.** Bound to a loopback address, it answers without a token, but
  only to requests whose ``Host`` is a loopback name (so a web page on another site
  cannot read it through DNS rebinding).
* **Token elsewhere.** Bound to any other address, every request needs the cluster token:
  ``Authorization: Bearer <token>``, or the cookie ``POST /login`` sets (HttpOnly,
  SameSite=Strict). The cookie holds an HMAC of the token, not the token, and every
  comparison is constant-time.
* Failed tokens are throttled per client address (``FAILURES_ALLOWED`` a minute, then
  429), so a weak ``DDLF_AUTH_TOKEN`` cannot be guessed through the dashboard quickly.
* The page sets a Content-Security-Policy that allows only its own scripts, and renders
  every string from the cluster as text (class names and event details are the user's).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import time

from aiohttp import web

from . import views

__all__ = ["Dashboard", "is_loopback", "make_app", "COOKIE"]

log = logging.getLogger("ddlf.head")

COOKIE = "ddlf_dashboard"
_STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_READ_METHODS = ("GET", "HEAD")
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
_HEADERS = {
    # Only our own files; no framing (clickjacking); no guessing of content types.
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# The login page carries its few styles inline: /style.css is behind the token too.
_LOGIN_HEADERS = {**_HEADERS, "Content-Security-Policy":
                  "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                  "frame-ancestors 'none'"}
FAILURES_ALLOWED = 10   # failed tokens per client address per minute
_FILES = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"),
          "/style.css": ("style.css", "text/css")}


def is_loopback(host: str) -> bool:
    """True if ``host`` (an address or ``localhost``) is a loopback address."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def session_value(token: str) -> str:
    """What the login cookie holds: an HMAC of the token (the token never sits in it)."""
    return hmac.new(token.encode(), b"ddlf-dashboard-session-v1", hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8", "replace"), b.encode("utf-8", "replace"))


def _json(data, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, separators=(",", ":")), status=status,
                        content_type="application/json")


def make_app(head, token: str, bind_host: str) -> web.Application:
    """The dashboard's aiohttp application over ``head`` (anything with the head's managers).

    ``bind_host`` decides the rule: a loopback address serves loopback ``Host`` names
    without a token; any other address needs ``token`` on every request.
    """
    need_token = not is_loopback(bind_host)
    cookie_value = session_value(token)
    login_page = _read("login.html")
    throttle = _Throttle(FAILURES_ALLOWED, 60.0)

    def login_form_response(message: str = "", status: int = 200) -> web.Response:
        return web.Response(text=login_page.replace("{message}", message), status=status,
                            content_type="text/html", headers=_LOGIN_HEADERS)

    def authorized(request) -> bool:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return _same(auth[len("Bearer "):].strip(), token)
        got = request.cookies.get(COOKIE)
        return got is not None and _same(got, cookie_value)

    @web.middleware
    async def guard(request, handler):
        login = request.path == "/login"
        if request.method not in _READ_METHODS and not (login and request.method == "POST"):
            return _refuse(405, f"the dashboard is read-only: {request.method} is not allowed",
                           {"Allow": "GET, HEAD" + (", POST" if login else "")})
        if not need_token:
            host = (request.url.host or "").strip("[]")   # the Host header's name
            if not is_loopback(host):
                return _refuse(403, f"Host {host!r} is not a loopback name; this dashboard "
                                    "only answers http://127.0.0.1 or http://localhost")
        elif throttle.blocked(request.remote):
            return _refuse(429, "too many wrong tokens from this address: wait a minute")
        elif not login and not authorized(request):
            if "Authorization" in request.headers or COOKIE in request.cookies:
                throttle.failed(request.remote)   # a wrong token, not just none
            if request.path.startswith("/api/"):
                return _refuse(401, "this dashboard needs the cluster token: send "
                                    "'Authorization: Bearer <token>' or log in at /login",
                               {"WWW-Authenticate": 'Bearer realm="ddlf"'})
            return login_form_response(status=401)
        resp = await handler(request)
        for k, v in _HEADERS.items():
            resp.headers.setdefault(k, v)
        return resp

    async def static(request):
        name, ctype = _FILES[request.path]
        return web.Response(text=_read(name), content_type=ctype)

    async def login_form(request):
        if not need_token or authorized(request):
            raise web.HTTPSeeOther("/")
        return login_form_response()

    async def login(request):
        form = await request.post()
        given = form.get("token")
        if not need_token:
            raise web.HTTPSeeOther("/")
        if not isinstance(given, str) or not _same(given.strip(), token):
            throttle.failed(request.remote)
            return login_form_response("<p class=bad>That is not this cluster's token.</p>", 401)
        resp = web.Response(status=303, headers={"Location": "/"})
        resp.set_cookie(COOKIE, cookie_value, httponly=True, samesite="Strict", path="/")
        return resp

    def limit(request, name: str, default: int) -> int:
        try:
            return max(0, int(request.query.get(name, default)))
        except ValueError:
            raise web.HTTPBadRequest(text=f"?{name}= takes a whole number")

    async def api_nodes(request):
        return _json(views.nodes(head))

    async def api_actors(request):
        return _json(views.actors(head, limit(request, "limit", views.ACTORS_SHOWN)))

    async def api_tasks(request):
        return _json(views.tasks(head))

    async def api_groups(request):
        return _json(views.placement_groups(head))

    async def api_runs(request):
        return _json(views.runs(head))

    async def api_run(request):
        got = views.run(head, request.match_info["run_id"], limit(request, "since", 0))
        if got is None:
            return _refuse(404, f"no run {request.match_info['run_id']!r} on this head "
                                "(only the newest runs are kept)")
        return _json(got)

    async def api_snapshot(request):
        return _json(views.snapshot(head, limit(request, "actors", 200)))

    app = web.Application(middlewares=[guard], client_max_size=4096)
    for path in _FILES:
        app.router.add_get(path, static)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_get("/api/nodes", api_nodes)
    app.router.add_get("/api/actors", api_actors)
    app.router.add_get("/api/tasks", api_tasks)
    app.router.add_get("/api/placement_groups", api_groups)
    app.router.add_get("/api/runs", api_runs)
    app.router.add_get("/api/runs/{run_id}", api_run)
    app.router.add_get("/api/snapshot", api_snapshot)
    return app


def _refuse(status: int, message: str, headers: dict | None = None) -> web.Response:
    resp = _json({"error": message}, status)
    resp.headers.update({**_HEADERS, **(headers or {})})
    return resp


class _Throttle:
    """Counts failed tokens per client address in a sliding window (bounded: addresses
    whose failures have all expired are forgotten)."""

    def __init__(self, allowed: int, window_s: float):
        self.allowed = allowed
        self.window_s = window_s
        self.failures: dict[str, list[float]] = {}

    def _recent(self, who: str | None) -> list[float]:
        now = time.monotonic()
        got = [t for t in self.failures.get(who or "?", ()) if now - t < self.window_s]
        if got:
            self.failures[who or "?"] = got
        else:
            self.failures.pop(who or "?", None)
        return got

    def blocked(self, who: str | None) -> bool:
        return len(self._recent(who)) >= self.allowed

    def failed(self, who: str | None) -> None:
        if len(self.failures) > 10_000:   # a flood from many addresses: start over
            self.failures.clear()
        self._recent(who)
        self.failures.setdefault(who or "?", []).append(time.monotonic())


_cache: dict = {}


def _read(name: str) -> str:
    if name not in _cache:
        with open(os.path.join(_STATIC, name), encoding="utf-8") as f:
            _cache[name] = f.read()
    return _cache[name]


class Dashboard:
    """The dashboard served by a head: start it on the head's loop, stop it with the head."""

    def __init__(self, head, token: str, host: str, port: int, fallback: bool = False):
        self.head = head
        self.token = token
        self.host = host
        self.port = port
        self.fallback = fallback   # take any free port if ``port`` is taken
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        """Serve; return the URL. ``OSError`` naming the port when it is taken (unless
        ``fallback``: then any free port)."""
        # Answers take milliseconds: a head that stops waits at most 2 s for open ones.
        self.runner = web.AppRunner(make_app(self.head, self.token, self.host),
                                    access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await self.runner.setup()
        try:
            site = web.TCPSite(self.runner, self.host, self.port)
            try:
                await site.start()
            except OSError as e:
                if not (self.fallback and e.errno == errno.EADDRINUSE):
                    raise OSError(e.errno, f"the dashboard cannot listen on {self.host}:"
                                           f"{self.port} ({e.strerror}); pick another "
                                           "--dashboard-port, or 0 to turn it off") from e
                log.info("dashboard port %d is taken; using a free one", self.port)
                site = web.TCPSite(self.runner, self.host, 0)
                await site.start()
        except BaseException:
            await self.runner.cleanup()
            self.runner = None
            raise
        self.port = self.runner.addresses[0][1]
        if not is_loopback(self.host):
            log.warning("the dashboard at %s is reachable off this host: every request "
                        "needs the cluster token, sent in clear over HTTP", self.url)
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()
