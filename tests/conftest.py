"""Shared fixtures: one context manager starts a cluster; every test checks for leaks."""

from __future__ import annotations

import os

import pytest
from helpers_modules.clusters import no_leaked_processes, start_cluster

# Worker processes inherit this; keep BLAS from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def cluster(request):
    """An embedded cluster; size it with ``@pytest.mark.parametrize("cluster", [4], indirect=True)``."""
    num_cpus = getattr(request, "param", 2)
    with start_cluster(num_cpus=num_cpus) as info:
        yield info


@pytest.fixture
def no_leaks():
    with no_leaked_processes():
        yield


@pytest.fixture
def session_dir(tmp_path, monkeypatch):
    """A private session folder, so `stop` only sees processes this test started."""
    d = tmp_path / "session"
    monkeypatch.setenv("DDLF_TEMP_DIR", str(d))
    monkeypatch.delenv("DDLF_AUTH_TOKEN", raising=False)
    return d
