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


def test_runtime_modules_and_classes_are_small():
    """The structure issue's bound, for all of runtime/ (wire, client, head, node, worker
    and the shared modules): no class over 400 lines, no module over 600."""
    for name in _runtime_modules():
        with open(os.path.join(_RUNTIME, name)) as f:
            text = f.read()
        assert len(text.splitlines()) <= 600, name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno < 400, (name, node.name)


# -- import cycles --------------------------------------------------------------------------
_ROOT = os.path.dirname(_PKG)
_TOPS = {"ddlf_actors": "ddlf_actors", "runtime": "ddlf_actors.runtime",
         "apps": "ddlf_actors.apps"}


def _all_modules() -> dict:
    """Every module of ddlf_actors/, runtime/ and apps/ by dotted name: (path, is_package)."""
    out = {}
    for top, dotted in _TOPS.items():
        base = os.path.join(_ROOT, top)
        for root, dirs, names in os.walk(base):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in names:
                if not f.endswith(".py"):
                    continue
                parts = os.path.relpath(os.path.join(root, f), base)[:-3].split(os.sep)
                is_pkg = parts[-1] == "__init__"
                if is_pkg:
                    parts = parts[:-1]
                out[".".join([dotted, *parts])] = (os.path.join(root, f), is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_edges(name: str, path: str, is_pkg: bool, modules: dict) -> dict:
    """The modules of ``modules`` that module ``name`` imports, each with a line number.

    Every import statement counts, function-local ones included, except those under
    ``if TYPE_CHECKING:`` (never run). Relative imports are resolved against the module's
    package; ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
    else to ``pkg``. A package's own ``__init__`` reached implicitly (importing
    ``pkg.mod`` runs ``pkg/__init__``) is not an edge: only what the statements name.
    """
    with open(path) as f:
        tree = ast.parse(f.read())
    skipped: set = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for sub in node.body:
                skipped.update(id(n) for n in ast.walk(sub))
    package = name if is_pkg else name.rpartition(".")[0]
    edges: dict = {}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target:
                    edges.setdefault(target, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    edges.setdefault(full, node.lineno)
                elif base in modules:
                    edges.setdefault(base, node.lineno)
    edges.pop(name, None)
    return edges


def _import_cycles(graph: dict) -> list:
    """The strongly connected components of ``graph`` with more than one module (Tarjan,
    iterative)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found: list = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles_in_runtime_api_or_apps():
    """Issue 17: modules of runtime/, ddlf_actors/ and apps/ import one another without a
    cycle, counting function-local imports (a cycle hidden in a function is still one)."""
    modules = _all_modules()
    graph = {m: _import_edges(m, path, is_pkg, modules) for m, (path, is_pkg) in modules.items()}
    assert "ddlf_actors.runtime.client.core" in graph and "ddlf_actors.apps.trainer" in graph
    cycles = _import_cycles(graph)
    described = [[f"{m} -> {t} (line {line})" for m in c for t, line in graph[m].items()
                  if t in c] for c in cycles]
    assert not cycles, described


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a function-local import back is a cycle."""
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _import_cycles(graph) == [["a", "b", "c"]]
    assert _import_cycles({"a": {"b": 1}, "b": {}}) == []


def test_wire_imports_no_other_role():
    """wire/ is the bottom of the process roles: no client, head, node or worker import."""
    modules = _all_modules()
    offenders = {}
    for m, (path, is_pkg) in modules.items():
        if not m.startswith("ddlf_actors.runtime.wire"):
            continue
        bad = {t for t in _import_edges(m, path, is_pkg, modules)
               if t.split(".")[2:3] and t.split(".")[2] in ("client", "head", "node", "worker")}
        if bad:
            offenders[m] = bad
    assert not offenders, offenders


# -- swallowed exceptions -------------------------------------------------------------------
# Folders (from the repository root) where no broad handler may swallow an error silently
# (apps/ since its handlers were done in the issue 22 rewrite); add new top-level folders.
SWALLOW_CHECKED_FOLDERS = ["runtime", "ddlf_actors", "apps"]
# A handler catching one of these (alone, in a tuple, or bare `except:`) must do something:
# handle the error, or log it at debug level with a comment saying why dropping it is safe.
# A narrow handler (`except OSError: pass`) names the one failure it expects and may stay.
_BROAD_EXCEPTIONS = {"Exception", "BaseException"}


def _catches_broadly(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((isinstance(t, ast.Name) and t.id in _BROAD_EXCEPTIONS)
               or (isinstance(t, ast.Attribute) and t.attr in _BROAD_EXCEPTIONS)
               for t in types)


def _silent_broad_handlers(source: str) -> list[int]:
    """Lines of the broad handlers in ``source`` whose body does nothing (``pass``, ``...``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.ExceptHandler) and _catches_broadly(node)
                and all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr)
                        and isinstance(s.value, ast.Constant) and s.value.value is Ellipsis)
                        for s in node.body)):
            out.append(node.lineno)
    return out


def test_no_broad_handler_swallows_an_error_silently():
    """Issue 22: ``except Exception: pass`` hid real failures. Each one is handled, or
    logged at debug level with a comment saying why it is safe to drop."""
    offenders = []
    for folder in SWALLOW_CHECKED_FOLDERS:
        base = os.path.join(_ROOT, folder)
        assert os.path.isdir(base), base
        for root, dirs, names in os.walk(base):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in names:
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    with open(path) as fh:
                        lines = _silent_broad_handlers(fh.read())
                    offenders += [f"{os.path.relpath(path, _ROOT)}:{n}" for n in lines]
    assert not offenders, ("these handlers swallow every error silently; handle it, or "
                           f"log it at debug level saying why that is safe: {offenders}")


def test_the_swallow_finder_finds_silent_broad_handlers():
    """The check above can fail: it sees bare, Exception, BaseException and tuples holding
    them, with a body of ``pass`` or ``...``; a narrow or a logging handler passes."""
    source = (
        "try:\n    f()\nexcept Exception:\n    pass\n"                      # line 3
        "try:\n    f()\nexcept:\n    ...\n"                                  # line 7
        "try:\n    f()\nexcept (OSError, builtins.BaseException):\n    pass\n"  # line 11
        "try:\n    f()\nexcept OSError:\n    pass\n"
        "try:\n    f()\nexcept Exception as e:\n    log.debug('safe: %r', e)\n"
    )
    assert _silent_broad_handlers(source) == [3, 7, 11]
