"""The head's web dashboard over HTTP: what the JSON API shows on a live cluster, and its
security rules (loopback only without a token, the token everywhere else, read-only)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from helpers_modules.clusters import start_cluster

import ddlf_actors as ddlf
from ddlf_actors.util import dashboard

pytest.importorskip("aiohttp")

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from ddlf_actors.runtime.head.dashboard.app import (  # noqa: E402
    COOKIE,
    is_loopback,
    make_app,
    session_value,
)
from ddlf_actors.runtime.head.server import Head  # noqa: E402

TOKEN = "t0ken-for-the-dashboard-tests"
ROUTES = ["/", "/app.js", "/style.css", "/login", "/api/nodes", "/api/actors", "/api/tasks",
          "/api/placement_groups", "/api/runs", "/api/runs/r1", "/api/snapshot"]


def _get(url: str, method: str = "GET", headers: dict | None = None):
    req = urllib.request.Request(url, method=method, headers=headers or {},
                                 data=b"x" if method in ("POST", "PUT", "PATCH") else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@ddlf.remote(num_cpus=0)
class Watched:
    def ping(self):
        return "pong"


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(num_cpus=2, dashboard=True) as info:
        yield info


def test_init_returns_the_url_and_util_finds_it(cluster):
    assert cluster.dashboard_url.startswith("http://127.0.0.1:")
    assert dashboard.url() == cluster.dashboard_url
    status, body = _get(cluster.dashboard_url + "/")
    assert status == 200 and b"DDLF" in body


def test_the_api_shows_nodes_actors_and_published_runs(cluster):
    actors = [Watched.options(name=f"w{i}").remote() for i in range(3)]
    assert ddlf.get([a.ping.remote() for a in actors]) == ["pong"] * 3
    dashboard.publish_run("r1", info={"scheme": "sync", "workers": 2})
    dashboard.publish_run("r1", rows=[{"round": 1, "epoch": 0.5, "time_s": 1.0,
                                       "test_accuracy": 0.5}],
                          events=[{"kind": "checkpoint", "detail": "/tmp/x"}])
    url = cluster.dashboard_url
    nodes = json.loads(_get(url + "/api/nodes")[1])
    assert [n["address"] for n in nodes] == [n["address"] for n in ddlf.nodes()]
    assert nodes[0]["alive"] and nodes[0]["total"]["CPU"] == 2
    got = json.loads(_get(url + "/api/actors")[1])
    mine = [a for a in got["actors"] if a["class_name"] == "Watched" and a["state"] == "ALIVE"]
    assert sorted(a["name"] for a in mine) == ["w0", "w1", "w2"]
    assert all(a["pid"] and a["node_id"] == nodes[0]["node_id"] for a in mine)
    for _ in range(100):   # the publishes are pushes: they arrive after a round trip
        d = json.loads(_get(url + "/api/runs/r1")[1]) if _get(url + "/api/runs/r1")[0] == 200 else None
        if d and d["rows"]:
            break
    assert d["info"] == {"scheme": "sync", "workers": 2}
    assert [r["test_accuracy"] for r in d["rows"]] == [0.5]
    assert [e["kind"] for e in d["events"]] == ["checkpoint"]
    assert "r1" in [r["run_id"] for r in json.loads(_get(url + "/api/runs")[1])]
    assert _get(url + "/api/runs/nope")[0] == 404
    tasks = json.loads(_get(url + "/api/tasks")[1])
    assert set(tasks) >= {"RUNNING", "WAITING_FOR_RESOURCES"}
    for a in actors:
        ddlf.kill(a)


def test_publish_run_checks_its_input_here_and_takes_numpy_numbers(cluster):
    import numpy as np

    with pytest.raises(ValueError, match="status must be one of"):
        dashboard.publish_run("r2", status="exploded")
    with pytest.raises(ValueError, match=r"a row\['x'\] must be a number"):
        dashboard.publish_run("r2", rows=[{"x": object()}])
    dashboard.publish_run("r2", rows=[{"acc": np.float32(0.5), "n": np.int64(3)}])
    for _ in range(100):
        status, body = _get(cluster.dashboard_url + "/api/runs/r2")
        if status == 200:
            break
    assert [{k: r[k] for k in ("acc", "n")} for r in json.loads(body)["rows"]] == [
        {"acc": 0.5, "n": 3}]


def _state(url: str) -> str:
    """What a request could change, as text: nodes (not their heartbeat age), actors,
    placement groups and runs."""
    from ddlf_actors.autoinit import core as _core

    core = _core()
    nodes = [{k: v for k, v in n.items() if k != "heartbeat_age_s"} for n in ddlf.nodes()]
    return json.dumps([nodes, core.head_call("list_actors"),
                       core.head_call("placement_group_table"),
                       json.loads(_get(url + "/api/runs")[1])], sort_keys=True, default=str)


def test_no_request_changes_anything_and_writes_are_refused(cluster):
    a = Watched.options(name="survivor").remote()
    assert ddlf.get(a.ping.remote()) == "pong"
    pg = ddlf.util.placement_group([{"CPU": 0.5}])
    pg.wait(10)
    url = cluster.dashboard_url
    before = _state(url)
    for path in ROUTES:
        for query in ("", "?limit=0", "?since=0&actors=5"):
            assert _get(url + path + query, "GET")[0] in (200, 404), path
            assert _get(url + path + query, "HEAD")[0] in (200, 404), path
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            if path == "/login" and method == "POST":
                continue
            status, body = _get(url + path, method)
            assert status == 405, (method, path, status)
            assert b"read-only" in body
    assert _state(url) == before
    assert ddlf.get(a.ping.remote()) == "pong"
    ddlf.util.remove_placement_group(pg)
    ddlf.kill(a)


def test_a_host_header_that_is_not_loopback_is_refused_on_loopback(cluster):
    # A web page on another site that rebinds its name to 127.0.0.1 sends its own Host.
    status, body = _get(cluster.dashboard_url + "/api/nodes", headers={"Host": "evil.example"})
    assert status == 403 and b"loopback" in body


def test_every_route_reads_except_the_login_post():
    app = make_app(object(), TOKEN, "127.0.0.1")
    methods = {(r.method, r.resource.canonical) for r in app.router.routes()}
    writes = {(m, p) for m, p in methods if m not in ("GET", "HEAD")}
    assert writes == {("POST", "/login")}


@pytest.mark.parametrize("host, loop", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                        ("127.0.0.2", True), ("0.0.0.0", False),
                                        ("10.1.2.3", False), ("example.org", False)])
def test_which_binds_count_as_loopback(host, loop):
    assert is_loopback(host) is loop


def _off_loopback(check):
    """Run ``check(client)`` against a dashboard whose bind address is not loopback (so
    every request needs the token), served on 127.0.0.1 by aiohttp's test server."""
    async def main():
        head = Head(asyncio.get_running_loop(), TOKEN)
        async with TestClient(TestServer(make_app(head, TOKEN, "0.0.0.0"),
                                         host="127.0.0.1")) as client:
            await check(client)
    asyncio.run(main())


def test_off_loopback_every_request_needs_the_token():
    async def check(client):
        for path in ROUTES:
            r = await client.get(path)
            if path == "/login":
                assert r.status == 200   # the form itself
                continue
            assert r.status == 401, path
            assert "nodes" not in (await r.text()) or path == "/"
        for bad in ("Bearer wrong", "Bearer ", f"Basic {TOKEN}", f"Bearer {TOKEN}x"):
            r = await client.get("/api/nodes", headers={"Authorization": bad})
            assert r.status == 401, bad
        r = await client.get("/api/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status == 200 and await r.json() == []
        # even with the token, nothing but reading
        r = await client.delete("/api/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status == 405
    _off_loopback(check)


def test_off_loopback_the_login_form_sets_an_httponly_strict_cookie():
    async def check(client):
        r = await client.post("/login", data={"token": "wrong"}, allow_redirects=False)
        assert r.status == 401 and COOKIE not in r.cookies
        r = await client.post("/login", data={"token": TOKEN}, allow_redirects=False)
        assert r.status == 303
        cookie = r.cookies[COOKIE]
        assert cookie.value == session_value(TOKEN) and TOKEN not in cookie.value
        assert cookie["httponly"] and cookie["samesite"] == "Strict"
        r = await client.get("/api/runs")   # the client sends the cookie back
        assert r.status == 200 and await r.json() == []
        client.session.cookie_jar.clear()
        r = await client.get("/api/runs", cookies={COOKIE: "0" * 64})
        assert r.status == 401
    _off_loopback(check)


def test_the_head_refuses_a_dashboard_port_without_aiohttp():
    code = ("import sys; sys.modules['aiohttp'] = None\n"
            "from ddlf_actors.runtime.head.server import main\n"
            "main(['--port', '0', '--dashboard-port', '8265'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "pip install 'ddlf-actors[dashboard]'" in proc.stderr


def test_off_loopback_wrong_tokens_are_throttled_per_address():
    from ddlf_actors.runtime.head.dashboard.app import FAILURES_ALLOWED

    async def check(client):
        ok = {"Authorization": f"Bearer {TOKEN}"}
        for i in range(FAILURES_ALLOWED):
            r = await client.get("/api/nodes", headers={"Authorization": f"Bearer guess{i}"})
            assert r.status == 401
        r = await client.post("/login", data={"token": "one more"}, allow_redirects=False)
        assert r.status == 429
        r = await client.get("/api/nodes", headers=ok)   # the address waits out its minute
        assert r.status == 429
    _off_loopback(check)


def test_off_loopback_the_login_page_is_styled_without_the_token_and_runs_no_script():
    async def check(client):
        r = await client.get("/login")
        assert r.status == 200
        csp = r.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp
        assert "<script" not in await r.text()
    _off_loopback(check)
