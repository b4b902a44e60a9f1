"""A worker keeps no descriptor it inherited from its node's forkserver and never uses.

Before: the node's stdin (the driver's lifeline pipe) on fd 0, the forkserver's "alive"
pipe, the resource tracker's pipe, multiprocessing's parent sentinel and two /dev/null
descriptors. The "alive" pipe mattered most: the forkserver exits only once every holder
has closed it, so each worker kept it running after its node was gone.
"""

from __future__ import annotations

import os
import sys

import psutil
import pytest

import ddlf_actors as ddlf

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def _fds(pid: int | str = "self") -> dict:
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass   # closed meanwhile (e.g. the listing's own descriptor)
    return out


@ddlf.remote
class FdProbe:
    def fds(self):
        import multiprocessing

        return os.getpid(), os.getppid(), _fds(), multiprocessing.parent_process()


@ddlf.remote
def task_fds():
    return os.getpid(), os.getppid(), _fds(), None


def _pipes(fds: dict) -> list:
    return [target for target in fds.values() if target.startswith("pipe:")]


@pytest.mark.parametrize("probe", ["actor", "task"])
def test_a_worker_holds_no_pipe_of_its_node_or_forkserver(cluster, probe):
    ref = FdProbe.remote().fds.remote() if probe == "actor" else task_fds.remote()
    pid, ppid, fds, parent = ddlf.get(ref, timeout=30)
    node = ddlf.nodes()[0]["pid"]
    assert psutil.Process(ppid).ppid() == node   # its parent is the node's forkserver
    assert fds[0] == "/dev/null"   # not the node's stdin (the driver's lifeline)
    assert list(fds.values()).count("/dev/null") <= 2, fds
    theirs = set(_pipes(_fds(node))) | set(_pipes(_fds(ppid)))
    mine = _pipes(fds)
    assert not theirs & set(mine), f"pipes shared with the node or forkserver: {fds}"
    # The only pipes left are the worker's own (its event loop's wake-up pipes), whose
    # both ends it holds; a lone end was inherited (the parent sentinel was one).
    assert all(mine.count(p) == 2 for p in mine), fds
    assert parent is None
