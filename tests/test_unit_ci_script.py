"""CI's entry point (``.ci/run``) runs README's test command as README writes it, after
README's install line (with the torch and jax extras README tells users to add), on Python
3.10 and with no-tests-collected turned into a failure: what the developers' guide asks of
CI, checked here so that an edit of either file cannot drift from the other."""

from __future__ import annotations

import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def _readme_test_line() -> tuple[str, str]:
    """README's test command: (its install extras, its pytest command)."""
    lines = [ln for ln in _read("README.md").splitlines()
             if "pip install" in ln and "&&" in ln and "pytest" in ln]
    assert len(lines) == 1, f"README should quote one install-and-test line, found {lines}"
    install, test = (part.strip() for part in lines[0].split("&&"))
    extras = re.search(r'\.\[([a-z,]+)\]', install)
    assert extras, f"README's install line names no extras: {install!r}"
    return extras.group(1), test


def _commands(script: str) -> list[str]:
    """The script's lines that run something (comments and blank lines left out)."""
    return [ln.strip() for ln in script.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def test_ci_runs_readmes_test_command_as_written_on_python_310():
    extras, test = _readme_test_line()
    lines = _commands(_read(".ci/run"))
    runs = [ln for ln in lines if ln.endswith(test)]
    assert runs, f".ci/run never runs README's test command {test!r}"
    # Under a PATH with the 3.10 venv first, so that the bare `pytest` is that venv's.
    assert any(shlex.split(ln)[0].startswith("PATH=$venv/bin") for ln in runs), runs
    installs = [ln for ln in lines if "pip" in ln and "install" in ln and "-e" in ln]
    wanted = set(extras.split(",")) | {"torch", "jax"}
    assert any(wanted <= set(re.search(r'\.\[([a-z,]+)\]', ln).group(1).split(","))
               for ln in installs if re.search(r'\.\[([a-z,]+)\]', ln)), installs
    assert any("find_python310" in ln for ln in lines)


def test_ci_turns_no_tests_collected_into_a_failure():
    script = _read(".ci/run")
    assert re.search(r'if \[ "\$1" -eq 5 \]; then\s+echo "pytest collected no tests[^"]*" >&2'
                     r'\s+return 1', script), "exit code 5 must fail CI"
