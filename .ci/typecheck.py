#!/usr/bin/env python3
"""Run mypy over the package as it installs: ddlf_actors with runtime/ and apps/ inside it.

In the repository runtime/ and apps/ sit next to ddlf_actors/ (setuptools maps them to
ddlf_actors.runtime and ddlf_actors.apps; a checkout finds them with the finder in
ddlf_actors/__init__.py). mypy follows neither, so this builds the installed layout out
of symlinks in a temporary directory and checks it there, with the configuration in
pyproject.toml ([tool.mypy]). Error paths read ddlf_actors/runtime/... for runtime/...
Exit status: mypy's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="ddlf-mypy-") as tmp:
        pkg = os.path.join(tmp, "ddlf_actors")
        os.mkdir(pkg)
        src = os.path.join(ROOT, "ddlf_actors")
        for name in os.listdir(src):
            if name != "__pycache__":
                os.symlink(os.path.join(src, name), os.path.join(pkg, name))
        os.symlink(os.path.join(ROOT, "runtime"), os.path.join(pkg, "runtime"))
        os.symlink(os.path.join(ROOT, "apps"), os.path.join(pkg, "apps"))
        cmd = [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
               "--cache-dir", os.path.join(tmp, ".mypy_cache"), "-p", "ddlf_actors",
               *sys.argv[1:]]
        return subprocess.call(cmd, cwd=tmp)


if __name__ == "__main__":
    sys.exit(main())
