"""A trainer keeps a step's freed blocks for the next step (apps/frameworks/heap.py)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from ddlf_actors.apps.frameworks import heap

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(TESTS, "helpers_modules", "heap_faults.py")
REPO = os.path.dirname(TESTS)

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="the thresholds are glibc's")


def _faults(mode: str, where: str = "main", **env) -> int:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                          "GLIBC_TUNABLES")}
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, clean.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, SCRIPT, mode, where], capture_output=True, text=True,
                         timeout=120, env=dict(clean, **env))
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.parametrize("where", ["main", "thread"])
def test_default_glibc_unmaps_what_a_step_frees(where):
    # The premise: without the setting, 20 steps of 16 MiB refault most of their pages.
    assert _faults("default", where) > 20 * 16 * 256 // 4


@pytest.mark.parametrize("where", ["main", "thread"])
@pytest.mark.parametrize("mode", ["keep", "trainer"])
def test_freed_blocks_are_reused_without_faults(mode, where):
    # "thread": an actor's execution thread, whose arena's heaps glibc deletes when they
    # empty unless their top is padded (the thresholds alone left 46,100 faults here).
    default = _faults("default", where)
    assert _faults(mode, where) < default / 20


def test_a_users_choice_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert heap.keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072")
    assert heap.keep_freed_memory() is False


def test_a_trainer_keeps_a_users_threshold():
    # 128 KiB fixed by the user: every 1 MiB block is its own mapping, as the user asked.
    assert _faults("trainer", MALLOC_MMAP_THRESHOLD_="131072") > 20 * 16 * 256 // 4
