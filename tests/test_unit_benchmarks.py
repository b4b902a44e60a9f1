"""benchmarks/ stays a set of small tools (issue 31): no module over 600 lines, no import
circle, no module imported by a bare name from a sibling folder, and every script answers
``python benchmarks/<subject>/<script>.py --help`` without running its benchmark."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
PARSE_ONLY = os.path.join(ROOT, "tests", "helpers_modules", "parse_only.py")
MAX_LINES = 600


def _modules() -> dict:
    """``{"benchmarks.x.y": path}`` of every Python file under benchmarks/."""
    out = {}
    for folder, dirs, files in os.walk(BENCH):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join(parts)] = path
    return out


def _imports(name: str, path: str, known: dict) -> set:
    """The benchmarks modules ``name`` imports anywhere in its file (inside functions too:
    a circle through a function-level import is still a circle)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                base = ".".join(up[:len(up) - node.level + 1] + ([base] if base else []))
            # "from benchmarks.x import y": y may be a module of its own or a name in x.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def _cycles(graph: dict) -> list:
    """Every strongly connected set of more than one module (Tarjan), and self-loops."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle_and_passes_a_chain():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_under_benchmarks_is_over_600_lines():
    long = {}
    for path in _modules().values():
        with open(path) as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long[os.path.relpath(path, ROOT)] = n
    assert not long, f"split these into modules of one concept each: {long}"


def test_benchmarks_modules_import_no_circle():
    known = _modules()
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    # The check sees real edges (the training script does import the shared protocol).
    assert "benchmarks.protocol" in graph["benchmarks.training.train_compare"]
    assert _cycles(graph) == []


def test_no_benchmark_module_is_imported_by_its_bare_name():
    """``import cluster_emu`` from a sibling would load a second copy of the module next to
    ``benchmarks.emulation.cluster_emu`` (and works only from the script's own folder)."""
    known = _modules()
    bare = {name.rpartition(".")[2] for name in known} - {"benchmarks"}
    wrong = []
    for path in known.values():
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                mods = [node.module]
            else:
                continue
            wrong += [f"{os.path.relpath(path, ROOT)}: {m}" for m in mods
                      if m.split(".")[0] in bare]
    assert not wrong, f"import these as benchmarks.<subject>.<module>: {wrong}"


def _scripts() -> list:
    out = []
    for _name, path in sorted(_modules().items()):
        with open(path) as f:
            if 'if __name__ == "__main__"' in f.read():
                out.append(os.path.relpath(path, ROOT))
    return out


def parse_only(commands: list) -> list:
    """``parse_only.py``'s verdicts on ``[(script or "ddlf-train", argv)]``, run in a
    fresh interpreter from outside the checkout (so nothing is found through the cwd)."""
    proc = subprocess.run([sys.executable, PARSE_ONLY, json.dumps(commands)],
                          capture_output=True, text=True, timeout=300, cwd=os.sep,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_parse_check_rejects_a_bad_flag_and_a_missing_script():
    got = parse_only([["benchmarks/training/train_compare.py", ["--no-such-flag"]],
                      ["benchmarks/nowhere.py", []], ["ddlf-train", ["run", "--workers"]]])
    assert [g["ok"] for g in got] == [False, False, False]
    assert "--no-such-flag" in got[0]["why"] and "no such script" in got[1]["why"]


@pytest.mark.timeout(300)
def test_every_script_answers_help_when_run_as_a_file():
    scripts = _scripts()
    assert "benchmarks/emulation/cluster_emu.py" in scripts and len(scripts) > 20
    got = parse_only([[s, ["--help"]] for s in scripts])
    bad = {s: g["why"] for s, g in zip(scripts, got) if not g["ok"]}
    assert not bad, bad
