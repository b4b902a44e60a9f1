"""Parse command lines with the real scripts' argument parsers, running nothing else.

    python tests/helpers_modules/parse_only.py '[["benchmarks/x/y.py", ["--a", "1"]], ...]'

Each command is either a script path (relative to the checkout) or ``"ddlf-train"``
(``ddlf_actors.apps.cli:main``, the console script). For each, ``ArgumentParser.parse_args``
is wrapped so that it parses and then stops the program (``_Parsed``): the script's own
``main`` builds its own parser and hands it the arguments, exactly as when run, and
nothing after the parse runs (no cluster, no training). The script runs as
``__main__`` with ``sys.argv`` set and its folder first on ``sys.path``, as
``python benchmarks/x/y.py`` would.

Prints one JSON list: per command ``{"ok": true}`` when the parse succeeded (or the
command asked for ``--help``), else ``{"ok": false, "why": ...}`` with the parser's
message (an unknown flag, a bad value) or the error that stopped the script first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Parsed(BaseException):
    """Raised right after a successful parse: the command line is valid."""


_original = argparse.ArgumentParser.parse_args


def _parse_then_stop(self, args=None, namespace=None):
    _original(self, args, namespace)
    raise _Parsed


def check(command: str, argv: list) -> dict:
    """Parse ``argv`` with ``command``'s parser; ``{"ok": ...}`` as the module says."""
    err = io.StringIO()
    saved = (list(sys.argv), list(sys.path), dict(os.environ))
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if command == "ddlf-train":
                from ddlf_actors.apps.cli import main

                sys.argv = ["ddlf-train", *argv]
                main(argv)
            else:
                path = os.path.join(ROOT, command)
                if not os.path.isfile(path):
                    return {"ok": False, "why": f"no such script: {command}"}
                with open(path) as f:
                    if "argparse" not in f.read():
                        return {"ok": False, "why": f"{command} has no argument parser, so "
                                                    "running it would run the benchmark"}
                sys.argv = [path, *argv]
                sys.path.insert(0, os.path.dirname(path))
                runpy.run_path(path, run_name="__main__")
        return {"ok": False, "why": "the program ended without parsing its arguments"}
    except _Parsed:
        return {"ok": True}
    except SystemExit as e:
        if e.code in (0, None):   # --help
            return {"ok": True}
        lines = err.getvalue().strip().splitlines()
        return {"ok": False, "why": lines[-1] if lines else f"exit status {e.code}"}
    except Exception as e:
        return {"ok": False, "why": f"{type(e).__name__}: {e}"}
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        # Forget the benchmarks package, so the next script must find it on its own (a
        # script that cannot import it when run alone would otherwise pass here).
        for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
            del sys.modules[name]
        os.environ.clear()
        os.environ.update(saved[2])


def main() -> None:
    argparse.ArgumentParser.parse_args = _parse_then_stop   # type: ignore[method-assign]
    commands = json.loads(sys.argv[1])
    print(json.dumps([check(c, a) for c, a in commands]))


if __name__ == "__main__":
    main()
