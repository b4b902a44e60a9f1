"""Initialise on first use (as Ray does), init(ignore_reinit_error=True), a clean exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers_modules.util import kill_leftovers, wait_gone

import ddlf_actors as ddlf
from ddlf_actors.errors import AlreadyInitializedError, DDLFError

# A driver that never calls init: its first .remote() must start a cluster, and the
# interpreter's exit must stop it (no shutdown() either).
DRIVER = textwrap.dedent("""
    import os, sys, psutil
    import ddlf_actors as ddlf

    @ddlf.remote
    def pid():
        return os.getpid()

    @ddlf.remote
    class A:
        def pid(self):
            return os.getpid()

    first = {"task": lambda: ddlf.get(pid.remote(), timeout=60),
             "actor": lambda: ddlf.get(A.remote().pid.remote(), timeout=60),
             "put": lambda: ddlf.get(ddlf.put(7), timeout=60)}[sys.argv[1]]
    first()
    assert ddlf.is_initialized()
    kids = [p.pid for p in psutil.Process().children(recursive=True)]
    print(" ".join(map(str, kids)), flush=True)
""")


@pytest.mark.parametrize("first_call", ["task", "actor", "put"])
def test_first_use_starts_a_cluster_and_exit_stops_it(first_call, no_leaks):
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, first_call], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    kids: list = []
    try:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        kids = [int(x) for x in out.split()]
        assert len(kids) >= 2, (out, err)   # at least the head and the node
        assert not wait_gone(kids, timeout=20.0), "the auto-started cluster outlived its driver"
    finally:
        kill_leftovers(proc, kids)  # only if the test failed: end what it started, by pid
        proc.communicate()          # closes the pipes


def test_get_without_init_starts_a_cluster_in_process(no_leaks):
    assert not ddlf.is_initialized()
    try:
        ref = ddlf.put([1, 2])
        assert ddlf.is_initialized()
        assert ddlf.get(ref, timeout=30) == [1, 2]
        ready, _ = ddlf.wait([ref], timeout=10)
        assert ready == [ref]
    finally:
        ddlf.shutdown()
    assert not ddlf.is_initialized()


def test_second_init_raises_unless_ignored(no_leaks):
    info = ddlf.init(num_cpus=1)
    try:
        with pytest.raises(AlreadyInitializedError, match="ignore_reinit_error=True"):
            ddlf.init(num_cpus=1)
        # Also a RuntimeError, as Ray's is, so Ray-style handlers catch it.
        with pytest.raises(RuntimeError):
            ddlf.init()
        assert ddlf.init(ignore_reinit_error=True) is info
    finally:
        ddlf.shutdown()


def test_auto_init_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("DDLF_AUTO_INIT", "0")
    with pytest.raises(DDLFError, match="DDLF_AUTO_INIT=0"):
        ddlf.put(1)
    assert not ddlf.is_initialized()


def test_questions_about_the_cluster_do_not_start_one():
    """As in Ray: nodes() and cluster_resources() need an init, they do not make one."""
    with pytest.raises(DDLFError, match="not initialized"):
        ddlf.nodes()
    with pytest.raises(DDLFError, match="not initialized"):
        ddlf.cluster_resources()
    assert not ddlf.is_initialized()
