"""The embedded cluster lives exactly as long as the driver process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from helpers_modules.util import kill_leftovers, wait_gone

DRIVER = textwrap.dedent("""
    import os, sys, time, psutil
    import ddlf_actors as ddlf

    ddlf.init(num_cpus=1)

    @ddlf.remote
    class A:
        def pid(self):
            return os.getpid()

    a = A.remote()
    ddlf.get(a.pid.remote(), timeout=30)
    kids = [p.pid for p in psutil.Process().children(recursive=True)]
    print(" ".join(map(str, kids)), flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
    # "exit": leave without ddlf.shutdown(); atexit must stop the cluster.
""")


def _run(mode):
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = proc.stdout.readline()
    kids = [int(x) for x in line.split()]
    return proc, kids


def _cleanup(proc, kids):
    kill_leftovers(proc, kids)  # only if the test failed: end what it started, by pid
    proc.stdout.close()


def test_interpreter_exit_without_shutdown_stops_the_cluster(no_leaks):
    proc, kids = _run("exit")
    try:
        assert len(kids) >= 3, kids  # head, node, the actor's worker (and forkserver)
        assert proc.wait(30) == 0
        assert not wait_gone(kids, timeout=20.0)
    finally:
        _cleanup(proc, kids)


def test_sigkilled_driver_takes_its_embedded_cluster_down(no_leaks):
    proc, kids = _run("hang")
    try:
        assert len(kids) >= 3, kids
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert not wait_gone(kids, timeout=20.0)
    finally:
        _cleanup(proc, kids)
