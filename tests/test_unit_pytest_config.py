"""The suite's pytest configuration ends a run whose xdist worker crashes, never hangs.

Issue 31: with the registry's CUDA torch, xdist workers died of segfaults in the README's
test command (``pytest -q -n 2 --dist loadfile tests``), and after the fourth crash the
controller waited forever on idle workers. This runs that command's options with this
project's own pytest configuration (pyproject.toml) on a few files, one of whose tests
kills its worker (with SIGSEGV in one run, ``os.abort()`` in another), and checks that the
run ends with a failure that names the crashed test. One crash a run: two workers crashing
at the same moment can break xdist's own scheduler ("cannot send (already closed?)", an
INTERNALERROR this configuration cannot prevent), which is not what is tested here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

CRASHES = {
    "test_a_segfault.py": (
        "import os, signal\n"
        "def test_before():\n    pass\n"
        "def test_segfault():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "def test_after():\n    pass\n"),
    "test_b_abort.py": (
        "import os\n"
        "def test_abort():\n    os.abort()\n"
        "def test_after():\n    pass\n"),
}
FINE = {
    "test_c_fine.py": "def test_one():\n    pass\ndef test_two():\n    pass\n",
    "test_d_fine.py": "def test_one():\n    pass\n",
}


@pytest.mark.parametrize("crash", sorted(CRASHES))
def test_crashed_worker_ends_the_run_with_a_failure(tmp_path, crash):
    for name, text in {crash: CRASHES[crash], **FINE}.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONFAULTHANDLER="0")
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    # -c: this project's [tool.pytest.ini_options] (timeout, addopts), nothing else. Not
    # -q as in the README: xdist prints why it stopped only at the default verbosity.
    cmd = [sys.executable, "-m", "pytest", "-c", str(PYPROJECT), "--rootdir", str(tmp_path),
           "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", str(tmp_path)]
    try:
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=100)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"pytest -n 2 --dist loadfile hung after a worker crashed:\n"
                             f"{e.stdout}") from None
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "crashed and worker restarting disabled" in out, out
    # Restarting workers is what deadlocked or broke the loadfile scheduler (here, without
    # --max-worker-restart=0: an INTERNALERROR, and crashed tests run and crash again).
    assert "replacing crashed worker" not in out and "INTERNALERROR" not in out, out
    assert "crashed while running" in out, out
    # The crash is reported as the failing test's own failure, not lost.
    crashed = {"test_a_segfault.py": "test_segfault", "test_b_abort.py": "test_abort"}[crash]
    assert f"{crash}::{crashed}" in out, out
