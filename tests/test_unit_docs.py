"""The repository's documents point only at files inside the repository."""

from __future__ import annotations

import os
import re

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# [text](target) links, and `path/to/file.md` or `../x` written as code.
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE_PATH = re.compile(r"`([^`\s]*(?:\.md|\.\./[^`\s]*))`")


def _documents() -> list[str]:
    out = []
    for top in ("README.md", "docs", "benchmarks", "examples"):
        path = os.path.join(_REPO, top)
        if os.path.isfile(path):
            out.append(path)
        for root, _dirs, files in os.walk(path):
            out.extend(os.path.join(root, f) for f in files if f.endswith(".md"))
    return sorted(out)


def _targets(text: str) -> list[str]:
    found = _LINK.findall(text) + _CODE_PATH.findall(text)
    return [t.split("#")[0] for t in found
            if "://" not in t and not t.startswith(("#", "mailto:")) and t.split("#")[0]]


def _inside_repo(doc: str, target: str) -> str | None:
    """The file ``target`` names (relative to the document, or to the repository's root),
    if it exists inside the repository."""
    for base in (os.path.dirname(doc), _REPO):
        path = os.path.realpath(os.path.join(base, target))
        if path.startswith(_REPO + os.sep) and os.path.exists(path):
            return path
    return None


def test_the_scanner_finds_a_dangling_reference():
    text = "The design is `../shared/ARCHITECTURE.md`; see [the wire](docs/nowhere.md#x)."
    assert _targets(text) == ["docs/nowhere.md", "../shared/ARCHITECTURE.md"]
    doc = os.path.join(_REPO, "docs", "architecture.md")
    assert _inside_repo(doc, "../shared/ARCHITECTURE.md") is None
    assert _inside_repo(doc, "design.md") == os.path.join(_REPO, "docs", "design.md")


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: os.path.relpath(p, _REPO))
def test_every_reference_resolves_inside_the_repository(doc):
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    dangling = [t for t in _targets(text) if _inside_repo(doc, t) is None]
    assert not dangling, f"{os.path.relpath(doc, _REPO)} points outside the repository " \
                         f"or at missing files: {dangling}"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def test_readme_names_the_tests_its_test_command_skips_and_how_to_include_them():
    """README's test command skips what needs a tool a fresh machine lacks; a user who sees
    a skip must find in the Quickstart which test it is, and the command that includes it
    (the same one the skip's own message gives)."""
    with open(os.path.join(_REPO, "README.md"), encoding="utf-8") as f:
        quick = _section(f.read(), "## Quickstart")
    with open(os.path.join(_REPO, "tests", "test_dashboard_browser.py"), encoding="utf-8") as f:
        install = re.search(r"apt-get install [\w-]+", f.read())
    assert install, "the browser test's skip no longer says how to install Chromium"
    assert "tests/test_dashboard_browser.py" in quick and install.group(0) in quick
    assert "tests/test_netns.py" in quick and "root" in quick
    with open(os.path.join(_REPO, "tests", "ssh_hosts.py"), encoding="utf-8") as f:
        sshd = re.search(r"apt-get install [\w-]+", f.read())
    assert sshd and "tests/test_deploy_ssh.py" in quick and sshd.group(0) in quick
