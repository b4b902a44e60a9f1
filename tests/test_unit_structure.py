"""How the package hangs together: which module may import or touch what."""

from __future__ import annotations

import ast
import os

import ddlf_actors

_PKG = os.path.dirname(os.path.abspath(ddlf_actors.__file__))


def _imported_modules(path: str) -> set[str]:
    """Every module ``path`` imports, at any depth (function-local imports included)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out.add(base)
            out.update(f"{base}.{a.name}" if node.module else f"{base}{a.name}" for a in node.names)
    return out


def test_api_does_not_import_cluster():
    """api.py <-> cluster.py was a cycle (cluster builds on api; api read cluster.toml files
    with cluster.read_config). read_config lives in runtime.session now."""
    mods = _imported_modules(os.path.join(_PKG, "api.py"))
    assert not {m for m in mods if m.endswith("cluster") and "local_cluster" not in m}, mods


def test_read_config_is_still_public():
    from ddlf_actors.runtime.session import read_config

    assert ddlf_actors.read_config is read_config
    assert "read_config" in ddlf_actors.__all__
