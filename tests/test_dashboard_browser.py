"""The dashboard in a real browser: headless Chromium (Debian's package) loads the page on
a live cluster with actors and a finished numpy training run, runs its script, and the
rendered DOM must show the node, the actors' classes and the run's curves.

Skips only when no Chromium is installed (CI installs Debian's ``chromium``). The
screenshot is kept in the test's folder and, if ``DDLF_ARTIFACTS`` is set, copied there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest
from helpers_modules.clusters import start_cluster
from helpers_modules.numpy_trainer import NumpyTrainer, hard_blobs_dataset, softmax_model_fn

import ddlf_actors as ddlf
from ddlf_actors.apps import train_sync

pytest.importorskip("aiohttp")


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _browse(browser: str, profile: str, *args: str) -> str:
    """Run headless Chromium with ``args``; its stdout. Virtual time lets the page's
    polls run (5 s of page time) before the DOM is dumped or the screenshot taken."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
           "--virtual-time-budget=5000", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return proc.stdout


@ddlf.remote(num_cpus=0)
class Watched:
    def ping(self):
        return "pong"


def _wait_finished(url: str) -> dict:
    """The newest run once the head has its end (the driver's publishes are pushes)."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url + "/api/runs", timeout=10) as r:
            runs = json.loads(r.read())
        if runs and runs[0]["status"] == "finished" or time.monotonic() > deadline:
            return runs[0] if runs else {}
        time.sleep(0.05)


def test_the_page_shows_nodes_actors_and_a_runs_curves(tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium found (chromium, chromium-browser, google-chrome): "
                    "apt-get install chromium")
    with start_cluster(num_cpus=2, dashboard=True) as info:
        watched = [Watched.options(name=f"watched-{i}").remote() for i in range(2)]
        assert ddlf.get([w.ping.remote() for w in watched]) == ["pong", "pong"]
        result = train_sync(softmax_model_fn(64, 4), hard_blobs_dataset, workers=2,
                            master_epochs=2, rounds_per_epoch=2, trainer_cls=NumpyTrainer,
                            progress=False)
        evaluated = [r for r in result.history if r.get("test_accuracy") is not None]
        assert len(evaluated) >= 2
        run = _wait_finished(info.dashboard_url)
        assert run["status"] == "finished", run

        profile = str(tmp_path / "chromium-profile")
        dom = _browse(browser, profile, "--dump-dom", info.dashboard_url + "/")
        shot = tmp_path / "dashboard.png"
        _browse(browser, profile, "--window-size=1280,1500", f"--screenshot={shot}",
                info.dashboard_url + "/")
        nodes = ddlf.nodes()
    (tmp_path / "dashboard.html").write_text(dom)
    artifacts = os.environ.get("DDLF_ARTIFACTS")
    if artifacts:
        os.makedirs(artifacts, exist_ok=True)
        shutil.copy(shot, os.path.join(artifacts, "dashboard.png"))
        shutil.copy(tmp_path / "dashboard.html", os.path.join(artifacts, "dashboard.html"))

    where = f"(the DOM is in {tmp_path / 'dashboard.html'})"
    count = re.search(r'id="node-count">([^<]*)<', dom)
    assert count and count.group(1) == str(len(nodes)), where
    assert len(re.findall(r'class="node-row"', dom)) == len(nodes), where
    classes = set(re.findall(r'<td class="actor-class">([^<]*)</td>', dom))
    assert {"Watched", "NumpyTrainer"} <= classes, (classes, where)
    accuracy = re.search(r'id="chart-accuracy"[^>]*>(.*?)</svg>', dom, re.S)
    assert accuracy, where
    points = re.search(r'class="curve" data-points="(\d+)" points="([^"]*)"', accuracy.group(1))
    assert points, where
    assert int(points.group(1)) == len(evaluated) >= 2
    assert len(points.group(2).split()) == len(evaluated)
    assert re.search(r'scheme <b[^>]*>sync</b>', dom), where
    assert shot.stat().st_size > 10_000   # a real picture, not an empty page
