"""``python -m ddlf_actors.compat.ray script.py [args...]``: run a Ray script on DDLF.

``import ray`` in the script (and in the workers that run its code) resolves to DDLF's
Ray layer; the script runs as ``__main__`` with ``sys.argv = [script.py, args...]``, and
the process exits with the script's status.
"""

from __future__ import annotations

import os
import runpy
import sys

from ._finder import install

_USAGE = "usage: python -m ddlf_actors.compat.ray SCRIPT.py [ARGS...]"


def main(argv: list | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE + "\nRuns a Ray script on DDLF: `import ray` loads ddlf_actors.compat.ray.",
              file=sys.stderr if not argv else sys.stdout)
        sys.exit(2 if not argv else 0)
    script = argv[0]
    if not os.path.isfile(script):
        print(f"{_USAGE}\nerror: no such script: {script}", file=sys.stderr)
        sys.exit(2)
    install()
    sys.argv = list(argv)
    # As `python script.py` does: the script's folder comes first on sys.path.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
