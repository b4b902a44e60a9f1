"""What the training docs quote from the code agrees with the code (issue 29's guard).

- every ``--flag`` of a ``ddlf-train run`` command written in the README or docs/ is a flag
  of ``ddlf-train run``'s parser;
- every ``XOptions.name`` and ``TrainConfig.name`` the docs or ``apps/`` docstrings quote is
  a field or attribute of that class;
- ``ddlf-train run``'s flags default to ``TrainConfig``'s defaults (they are generated from
  its fields; this checks that nothing is hand-written beside them);
- the defaults the docs and the options' help quote for the rounds' outer step are
  ``RoundOptions.DEFAULTS`` and ``STEPS_PER_ROUND``.

Each check is also run on a stale line, to show that it can fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re

import pytest

from ddlf_actors.apps import cli
from ddlf_actors.apps.config import TrainConfig
from ddlf_actors.apps.options import SchemeOptions
from ddlf_actors.apps.schemes import registry
from ddlf_actors.apps.schemes.rounds import STEPS_PER_ROUND, RoundOptions

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(rel: str) -> str:
    with open(os.path.join(_REPO, rel), encoding="utf-8") as f:
        return f.read()


def _docs() -> dict[str, str]:
    paths = ["README.md", *sorted(os.path.relpath(p, _REPO)
                                  for p in glob.glob(os.path.join(_REPO, "docs", "*.md")))]
    return {p: _read(p) for p in paths}


def _sources() -> dict[str, str]:
    return {os.path.relpath(p, _REPO): _read(os.path.relpath(p, _REPO))
            for p in sorted(glob.glob(os.path.join(_REPO, "apps", "**", "*.py"), recursive=True))}


# -- flags --------------------------------------------------------------------------------------
def _run_parser() -> argparse.ArgumentParser:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def _run_commands(text: str) -> list[str]:
    """Every ``ddlf-train run ...`` command in ``text``: inline code spans, and lines of
    code blocks (with their backslash continuations)."""
    out = re.findall(r"`(ddlf-train run[^`]*)`", text)
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("ddlf-train run") or line.startswith("$ ddlf-train run"):
            command = line
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            out.append(command)
        i += 1
    return out


def _unknown_flags(text: str, flags: set[str]) -> list[str]:
    found = []
    for command in _run_commands(text):
        command = command.split("#")[0]   # a shell comment after the command
        found += [f for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", command)
                  if f not in flags]
    return found


def _parser_flags() -> set[str]:
    return {s for a in _run_parser()._actions for s in a.option_strings}


def test_every_ddlf_train_run_flag_the_docs_write_exists():
    flags = _parser_flags()
    wrong = {path: bad for path, text in _docs().items() if (bad := _unknown_flags(text, flags))}
    assert not wrong, f"flags of `ddlf-train run` the docs write but the parser lacks: {wrong}"
    # ... and a stale one is caught
    assert _unknown_flags("`ddlf-train run --workers 2 --rejoin-timout 5`", flags) == [
        "--rejoin-timout"]
    assert _unknown_flags("```\nddlf-train run --dataset x \\\n    --no-such-flag 3\n```",
                          flags) == ["--no-such-flag"]


# -- option names -------------------------------------------------------------------------------
def _options_classes() -> dict[str, type]:
    registry.names()   # imports every scheme module
    out: dict[str, type] = {"TrainConfig": TrainConfig}
    todo = [SchemeOptions]
    while todo:
        cls = todo.pop()
        out[cls.__name__] = cls
        todo += cls.__subclasses__()
    return out


# An options class and a setting of it (``...Scheme.x`` too: the name the docs once gave
# the allreduce options, which no class has).
_QUOTED = re.compile(r"\b([A-Z]\w*(?:Options|Scheme)|TrainConfig)\.([A-Za-z_]\w*)")


def _unknown_names(text: str, classes: dict[str, type]) -> list[str]:
    bad = []
    for cls_name, attr in _QUOTED.findall(text):
        cls = classes.get(cls_name)
        known = cls is not None and (
            hasattr(cls, attr) or attr in {f.name for f in dataclasses.fields(cls)})
        if not known:
            bad.append(f"{cls_name}.{attr}")
    return bad


def test_every_options_name_the_docs_quote_exists():
    classes = _options_classes()
    texts = {**_docs(), **_sources()}
    wrong = {path: bad for path, text in texts.items() if (bad := _unknown_names(text, classes))}
    assert not wrong, f"options the docs name that do not exist: {wrong}"
    # ... and a stale one is caught (issue 29: the class was AllreduceScheme, then renamed)
    assert _unknown_names("`AllreduceScheme.chunk_timeout_s`, `SyncOptions.nope`", classes) == [
        "AllreduceScheme.chunk_timeout_s", "SyncOptions.nope"]
    assert _unknown_names("`AllreduceOptions.chunk_timeout_s`", classes) == []


# -- the CLI's defaults -------------------------------------------------------------------------
def test_ddlf_train_run_defaults_are_train_configs():
    args = _run_parser().parse_args([])
    differ = {}
    for f in dataclasses.fields(TrainConfig):
        if hasattr(args, f.name) and getattr(args, f.name) != f.default \
                and f.name not in ("workers", "compression", "backend"):
            differ[f.name] = (getattr(args, f.name), f.default)
    assert not differ, f"ddlf-train run flag defaults that differ from train()'s: {differ}"
    assert args.master_epochs == TrainConfig.master_epochs == 1
    # every setting with a cli kind has a flag; the old spelling still parses
    assert {f.name for f in cli._config_fields()} <= set(vars(args))
    assert _run_parser().parse_args(["--rejoin-timeout", "5"]).rejoin_timeout_s == 5.0
    assert cli._option_flag("rejoin_timeout_s=-1") == "--rejoin-timeout-s -1"


# -- the defaults the docs quote ----------------------------------------------------------------
def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _quoted_default_problems(docs: dict[str, str], helps: dict[str, str]) -> list[str]:
    """Where a doc or an option's help quotes a rounds default other than the code's."""
    d = RoundOptions.DEFAULTS
    lr, mom = _fmt(d["outer_lr"]), _fmt(d["outer_momentum"])
    bad = []
    # The table of the defaults in docs/training.md.
    row = re.search(r"\| `outer_lr`, `outer_momentum`, `nesterov`, `lr_scaling` \| "
                    r"([\d.]+), ([\d.]+)(?: \([^)]*\))?, (\w+), `\"(\w+)\"`", docs["docs/training.md"])
    if row is None:
        bad.append("docs/training.md: the defaults table's outer_lr row is gone or reworded "
                   "(update this test with it)")
    elif row.groups() != (lr, mom, str(d["nesterov"]), d["lr_scaling"]):
        bad.append(f"docs/training.md defaults table: {row.groups()}")
    # The outer step written out, and in prose.
    for m in re.finditer(r"v ← ([\d.]+) v \+ g`, `w ← w − ([\d.]+) \(g \+ ([\d.]+) v\)",
                         docs["docs/training.md"]):
        if (m.group(1), m.group(2), m.group(3)) != (mom, lr, mom):
            bad.append(f"docs/training.md outer step: {m.group(0)}")
    for path, text in docs.items():
        for m in re.finditer(r"Nesterov momentum ([\d.]+) at ([\d.]+)", text):
            if (m.group(1), m.group(2)) != (mom, lr):
                bad.append(f"{path}: {m.group(0)}")
        for m in re.finditer(r"[Ee]very ~(\d+) local steps", text):
            if int(m.group(1)) != STEPS_PER_ROUND:
                bad.append(f"{path}: {m.group(0)}")
    # The options' help (ddlf-train's flags): "(default X" for a setting in DEFAULTS.
    for name, text in helps.items():
        m = re.search(r"\(default ([^;),]+)", text)
        if m is None or name not in d:
            continue
        value = d[name]
        want = {True: "on", False: "off"}.get(value, _fmt(value)) \
            if isinstance(value, bool) else _fmt(value)
        if m.group(1).strip() != want:
            bad.append(f"RoundOptions.{name} help: {m.group(0)} (DEFAULTS: {value!r})")
    return bad


def _round_helps() -> dict[str, str]:
    return {f.name: f.metadata["help"] for f in dataclasses.fields(RoundOptions)
            if "help" in f.metadata}


def test_the_rounds_defaults_the_docs_quote_are_the_codes():
    docs = _docs()
    assert _quoted_default_problems(docs, _round_helps()) == []
    # The help says "(default on)" for nesterov and "(default 16)" for steps_per_round.
    assert "(default 16)" in _round_helps()["steps_per_round"]
    # ... and stale lines are caught: last turn's sync.py docstring, an old table row, help.
    stale = dict(docs)
    stale["docs/training-guide.md"] = ("optimizer would: Nesterov momentum 0.9 at 0.5 "
                                       "(none with one trainer), every ~32 local steps")
    stale["docs/training.md"] = docs["docs/training.md"].replace(
        f"| {_fmt(RoundOptions.DEFAULTS['outer_lr'])}, ", "| 0.5, ", 1)
    helps = {**_round_helps(), "outer_momentum": "momentum (default 0.9; none with one)"}
    problems = _quoted_default_problems(stale, helps)
    assert any("training-guide.md: Nesterov momentum 0.9 at 0.5" in p for p in problems)
    assert any("every ~32 local steps" in p for p in problems)
    assert any("defaults table" in p for p in problems)
    assert any("RoundOptions.outer_momentum help" in p for p in problems)


def test_sync_docstring_quotes_no_default_numbers():
    """sync.py's docstring named last turn's defaults; it now points at DEFAULTS."""
    import ddlf_actors.apps.schemes.sync as sync

    doc = sync.__doc__ or ""
    assert "RoundOptions.DEFAULTS" in doc
    assert not re.search(r"momentum \d|0\.5·K|~\d+ local steps", doc)


@pytest.mark.parametrize("name", sorted(RoundOptions.DEFAULTS))
def test_defaults_name_real_round_options(name):
    assert name in RoundOptions.names()
