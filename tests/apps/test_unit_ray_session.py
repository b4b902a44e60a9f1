"""``ray_session.start``: a ``ray.init`` that fails part-way leaves nothing running.

On a loaded machine Ray's local start can time out after its GCS and raylet are up ("The
current node timed out during startup"); they kept listening beyond loopback and a later
test saw them (issue 31). The fake ``ray.init`` here starts a process named like Ray's and
one that is not Ray's, then fails as Ray does.
"""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from ddlf_actors import ray_session

ray = pytest.importorskip("ray")


def _spawn(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])


def test_a_failed_local_start_ends_the_ray_processes_it_started(monkeypatch):
    started: list[subprocess.Popen] = []

    def failing_init(**kwargs):
        started.append(_spawn("fake-ray-raylet"))
        started.append(_spawn("not-that-runtime"))   # another thread's child, say
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", failing_init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    try:
        with pytest.raises(Exception, match="timed out during startup"):
            ray_session.start(num_cpus=1, owner="test")
        raylet, other = started
        assert raylet.poll() is not None, "the Ray process outlived the failed start"
        assert other.poll() is None and psutil.pid_exists(other.pid)   # not Ray's: kept
        assert not ray_session.chosen()
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
