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


def _attributes_used(path: str) -> set[str]:
    with open(path) as f:
        tree = ast.parse(f.read())
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_api_layer_uses_only_public_core_methods():
    """The API layer and the CLI stop a core with its own methods (close, stop_cluster),
    not by reaching into its I/O thread or its closing flag."""
    runtime_dir = os.path.join(os.path.dirname(_PKG), "runtime")
    files = [os.path.join(root, f) for root, _, names in os.walk(_PKG) for f in names
             if f.endswith(".py")]
    if os.path.isdir(runtime_dir):
        files.append(os.path.join(runtime_dir, "cli.py"))
    offenders = {p: used for p in files
                 if (used := _attributes_used(p) & {"io", "closing"})}
    assert not offenders, offenders


def test_failed_init_stops_the_io_thread():
    import threading

    import pytest

    from ddlf_actors.runtime.errors import DDLFError

    before = {t for t in threading.enumerate() if t.name == "ddlf-io"}
    with pytest.raises((OSError, DDLFError)):
        ddlf_actors.init(address="127.0.0.1:1", token="not-used")
    left = {t for t in threading.enumerate() if t.name == "ddlf-io"} - before
    assert not any(t.is_alive() for t in left)
    assert not ddlf_actors.is_initialized()


def test_only_runtime_and_apps_are_subpackages_from_the_repository_root():
    """ddlf_actors used to append the repository root to its __path__, which made every
    folder there a subpackage: ddlf_actors.tests, even ddlf_actors.ddlf_actors."""
    import importlib
    import importlib.util

    for name in ("ddlf_actors.tests", "ddlf_actors.ddlf_actors", "ddlf_actors.benchmarks",
                 "ddlf_actors.examples"):
        assert importlib.util.find_spec(name) is None, name
    assert ddlf_actors.__path__ == [_PKG]
    runtime = importlib.import_module("ddlf_actors.runtime")
    apps = importlib.util.find_spec("ddlf_actors.apps")
    assert runtime.__file__ and apps is not None and apps.submodule_search_locations


def test_every_package_is_listed_in_pyproject():
    """A non-editable `pip install .` installs only the packages pyproject lists."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    text = (root / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(ddlf_actors[\w.]*)"', text.split("packages = [", 1)[1]
                            .split("]", 1)[0]))
    mapping = {"runtime": "ddlf_actors.runtime", "apps": "ddlf_actors.apps"}
    found = set()
    for init in root.glob("**/__init__.py"):
        rel = init.parent.relative_to(root).parts
        if not rel or rel[0] not in ("ddlf_actors", "runtime", "apps"):
            continue
        head = mapping.get(rel[0], rel[0])
        found.add(".".join([head, *rel[1:]]))
    assert found - listed == set(), f"add these to [tool.setuptools] packages: {found - listed}"


_RUNTIME = os.path.join(os.path.dirname(_PKG), "runtime")
_CORE_PARTS = ("object_store", "dependencies", "streams", "actor_submitter", "task_submitter")


def test_the_core_parts_do_not_import_the_core():
    """core.py wires the object store, dependency resolution and the submitters together;
    none of them imports core.py back (it would be an import cycle)."""
    for name in _CORE_PARTS:
        mods = _imported_modules(os.path.join(_RUNTIME, "client", f"{name}.py"))
        assert not {m for m in mods if m in (".core", "core") or m.startswith(".core.")
                    or m.endswith("client.core")}, (name, mods)


def test_no_runtime_module_calls_private_methods_of_a_core():
    """The submitters, oob.py and the worker use the core's public attributes and the
    object store's public methods, never ``core._something``."""
    offenders = []
    for name in _runtime_modules():
        if name == os.path.join("client", "core.py"):
            continue
        with open(os.path.join(_RUNTIME, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                owner = node.value
                owner_name = owner.id if isinstance(owner, ast.Name) else (
                    owner.attr if isinstance(owner, ast.Attribute) else "")
                if owner_name in ("core", "_core", "core_mod"):
                    offenders.append(f"{name}:{node.lineno}: {owner_name}.{node.attr}")
    assert not offenders, offenders


_HEAD = os.path.join(_RUNTIME, "head")


def test_the_heads_modules_and_classes_stay_small():
    """The head was one 1,000-line class; it is one manager per concern behind a thin
    shell. Keep it that way: no module over 600 lines, no class over 400."""
    for name in sorted(os.listdir(_HEAD)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(_HEAD, name)) as f:
            text = f.read()
        assert text.count("\n") <= 600, f"head/{name} is over 600 lines: split it"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                assert size <= 400, f"head/{name}: class {node.name} is {size} lines"


_STATE_WORDS = {"PENDING", "ALIVE", "RESTARTING", "DEAD", "RESERVED", "CREATED",
                "RESCHEDULING", "REMOVED", "FINISHED", "INFEASIBLE", "NO_RESOURCES",
                "resolving", "ready", "dead"}


def test_states_are_compared_and_set_as_enums_on_the_head_side():
    """No ``state == "DEAD"`` or ``self.state = "ready"``: a state is an Enum member."""
    files = [os.path.join(_HEAD, n) for n in os.listdir(_HEAD) if n.endswith(".py")]
    files.append(os.path.join(_RUNTIME, "client", "actor_submitter.py"))
    offenders = []
    for path in files:
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                values = [node.left, *node.comparators]
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == "state" for t in node.targets):
                values = [node.value]
            else:
                continue
            for v in values:
                if isinstance(v, ast.Constant) and v.value in _STATE_WORDS:
                    offenders.append(f"{os.path.basename(path)}:{node.lineno}: {v.value!r}")
    assert not offenders, offenders


def _runtime_modules() -> list:
    """Every module of runtime/, its subpackages (wire/, client/, head/, node/, worker/)
    included, by path."""
    return sorted(os.path.relpath(os.path.join(root, f), _RUNTIME)
                  for root, _, names in os.walk(_RUNTIME) for f in names if f.endswith(".py"))


def test_runtime_imports_neither_the_api_nor_the_apps():
    """runtime/ is the bottom layer: ddlf_actors re-exports its types, never the reverse."""
    offenders = {}
    for name in _runtime_modules():
        mods = _imported_modules(os.path.join(_RUNTIME, name))
        depth = name.count(os.sep) + 1   # "..." from runtime/worker/x.py reaches ddlf_actors
        bad = {m for m in mods
               if (m.startswith("ddlf_actors") and not m.startswith("ddlf_actors.runtime"))
               or m.startswith("apps") or m.startswith("." * (depth + 1))}
        if bad:
            offenders[name] = bad
    assert not offenders, offenders
    assert "worker/runner.py" in _runtime_modules() and "node/pool.py" in _runtime_modules()


def test_the_process_classes_are_small():
    """The structure issue's bound: no class in the worker or node packages over 400
    lines, no module over 600."""
    for name in _runtime_modules():
        if not name.startswith(("worker", "node")):
            continue
        with open(os.path.join(_RUNTIME, name)) as f:
            text = f.read()
        assert len(text.splitlines()) <= 600, name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno < 400, (name, node.name)
