"""How apps/ hangs together (issue 22): small modules and classes, schemes that do not
reach into one another, and the runtime reached only through a backend."""

from __future__ import annotations

import ast
import os

import ddlf_actors

_APPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(ddlf_actors.__file__))),
                     "apps")


def _modules() -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, f), _APPS)
                  for root, dirs, names in os.walk(_APPS) for f in names if f.endswith(".py"))


def _tree(name: str) -> ast.Module:
    with open(os.path.join(_APPS, name)) as f:
        return ast.parse(f.read())


def test_apps_modules_and_classes_are_small():
    """The bound runtime/ keeps: no module over 600 lines, no class over 400."""
    assert "schemes/sync.py" in _modules() and "trainer.py" in _modules()
    for name in _modules():
        with open(os.path.join(_APPS, name)) as f:
            lines = len(f.read().splitlines())
        assert lines <= 600, f"apps/{name} has {lines} lines: split it"
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                assert size <= 400, f"apps/{name}: class {node.name} is {size} lines"


def _scheme_modules() -> set[str]:
    from ddlf_actors.apps.schemes import registry

    return {registry.get(n).__module__.rsplit(".", 1)[1] for n in registry.names()}


def test_a_scheme_module_imports_no_other_scheme_module():
    """A scheme is one file plus its register line: what schemes share lives in modules
    that are not schemes (rounds.py, workqueue.py, machine.py ...)."""
    schemes = _scheme_modules()
    assert {"sync", "asynchronous", "allreduce", "easgd", "downpour"} <= schemes
    offenders = {}
    for scheme in schemes:
        imported = set()
        for node in ast.walk(_tree(f"schemes/{scheme}.py")):
            if isinstance(node, ast.ImportFrom):
                mod = (node.module or "").rsplit(".", 1)[-1]
                imported.add(mod)
                imported.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update(a.name.rsplit(".", 1)[-1] for a in node.names)
        # auto runs the scheme it chooses (today allreduce), with that scheme's options;
        # dataparallel is allreduce's machine (its ring, faults, fetches) with another round.
        allowed = {scheme} | ({"allreduce"} if scheme in ("auto", "dataparallel") else set())
        bad = (imported & schemes) - allowed
        if bad:
            offenders[scheme] = bad
    assert not offenders, offenders


def _runtime_calls(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, "ddlf.put")`` for each put/get/wait of ``ddlf_actors`` in ``tree``."""
    aliases, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname or a.name for a in node.names if a.name == "ddlf_actors")
        elif isinstance(node, ast.ImportFrom) and node.module == "ddlf_actors":
            names.update(a.asname or a.name for a in node.names
                         if a.name in ("put", "get", "wait"))
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr in ("put", "get", "wait")):
            out.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in names:
            out.append((node.lineno, node.id))
    return out


def test_only_the_backends_call_the_runtime():
    """put/get/wait go through the run's Backend, so the same code runs on DDLF, on Ray
    and in-process (backends/fake.py)."""
    offenders = [f"apps/{name}:{line}: {what}" for name in _modules()
                 if not name.startswith("backends" + os.sep)
                 for line, what in _runtime_calls(_tree(name))]
    assert not offenders, offenders


def test_the_runtime_call_check_finds_a_direct_call():
    code = ("import ddlf_actors as ddlf\nfrom ddlf_actors import wait\n\n"
            "def f(x):\n    return ddlf.get(ddlf.put(x)), wait([x])\n")
    assert sorted(w for _, w in _runtime_calls(ast.parse(code))) == \
        ["ddlf.get", "ddlf.put", "wait"]
