"""What a worker applies before user code runs: the caller's ``sys.path``, the runtime env."""

from __future__ import annotations

import os
import sys

from .. import context, runtime_env

__all__ = ["apply_sys_path", "apply_env"]


def apply_sys_path(paths, cwd: str | None = None) -> None:
    """Put the caller's ``sys.path`` entries in front of ours, skipping ones absent here.

    This mirrors Ray: classes and functions defined in the driver's own modules (test
    files, scripts in the current folder) unpickle on workers of the same host. They go
    after the runtime env's working_dir and py_modules, which keep the front.
    """
    new = []
    for p in paths:
        if p == "" and cwd:
            p = cwd
        if p and p not in sys.path and p not in new and os.path.isdir(p):
            new.append(p)
    if new:
        at = runtime_env.front()
        sys.path[at:at] = new


def apply_env(setup: dict | None) -> None:
    """Enter the runtime env (variables, cwd, sys.path, GPU ids) before any user code."""
    if not setup:
        return
    runtime_env.apply(setup)
    ctx = context.worker_context()
    ctx.runtime_env = setup.get("runtime_env")
    ctx.gpu_ids = list(setup.get("gpu_ids") or ())
