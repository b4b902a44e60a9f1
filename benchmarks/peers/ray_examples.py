"""Run Ray's Core doc examples under real Ray and under DDLF's Ray layer; print a table.

    python benchmarks/peers/ray_examples.py /tmp/ray_doc_code [--timeout 120] [--only NAME ...]

Each example runs in a fresh process (its own process group, so a timeout ends all of
its children) once as ``python EXAMPLE.py`` (Ray) and once as ``python -m
ddlf_actors.compat.ray EXAMPLE.py`` (DDLF). The examples come from Ray's repository
(``doc/source/ray-core/doc_code/``) and are not part of this one: fetch them first.
Nothing here runs ``ray stop``: it could end other users' Ray clusters. Each example shuts
its own cluster down, and a timed-out one is ended with its process group.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd: list, cwd: str, timeout: float, env: dict) -> tuple[int | str, str, float]:
    """``(returncode or "timeout", combined output, seconds)``."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
        out = b""
        # Children that left the group (a cluster started with its own session) are
        # still our descendants while the example runs: end them by pid.
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        except psutil.Error:
            pass
    finally:
        # The example's session may hold leftover children (a Ray or DDLF cluster that
        # did not stop): end the whole group, which holds only what this example started.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if rc == "timeout":
            out, _ = proc.communicate()
    return rc, out.decode(errors="replace"), time.monotonic() - t0


def first_error(output: str) -> str:
    """The last line that names an exception (the one a traceback ends with)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        head = ln.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit")) or head.startswith("ddlf_actors."):
            return ln[:150]
    return (lines[-1][:150] if lines else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("examples_dir")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--only", nargs="*", help="run only these example files")
    p.add_argument("--skip-ray", action="store_true", help="run under DDLF only")
    a = p.parse_args(argv)

    names = sorted(f for f in os.listdir(a.examples_dir) if f.endswith(".py"))
    if a.only:
        names = [n for n in names if n in a.only or n[:-3] in a.only]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    # Examples must not reach the internet or a dashboard; keep Ray quiet and local.
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    rows = []
    for name in names:
        path = os.path.join(a.examples_dir, name)
        if a.skip_ray:
            ray_rc, ray_out, ray_secs = "-", "", None
        else:
            ray_rc, ray_out, ray_secs = run([sys.executable, path], a.examples_dir, a.timeout, env)
        ddlf_rc, ddlf_out, secs = run([sys.executable, "-m", "ddlf_actors.compat.ray", path],
                                      a.examples_dir, a.timeout, env)
        err = "" if ddlf_rc == 0 else first_error(ddlf_out)
        ray_err = "" if ray_rc in (0, "-") else first_error(ray_out)
        rows.append((name, ray_rc, ddlf_rc, err, ray_err, ray_secs, secs))
        print(f"{name:55s} ray={ray_rc!s:8s} ddlf={ddlf_rc!s:8s} {secs:5.1f}s {err}",
              file=sys.stderr, flush=True)

    # Wall time of the whole script, start-up and shutdown included, in the same run.
    print("\n| example | ray rc | ddlf rc | ray s | ddlf s | DDLF/Ray time "
          "| first error (DDLF; Ray's if only Ray failed) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, ray_rc, ddlf_rc, err, ray_err, ray_secs, secs in rows:
        shown = err or (f"(ray) {ray_err}" if ray_err else "")
        ratio = f"{secs / ray_secs:.2f}x" if ray_secs and ray_rc == 0 and ddlf_rc == 0 else ""
        rs = f"{ray_secs:.1f}" if ray_secs is not None else "-"
        print(f"| {name} | {ray_rc} | {ddlf_rc} | {rs} | {secs:.1f} | {ratio} "
              f"| {shown.replace('|', '/')} |")
    on_ray = [r for r in rows if r[1] == 0]
    both = [r for r in on_ray if r[2] == 0]
    print(f"\n{len(rows)} examples; {len(on_ray)} run on Ray; {len(both)} of those run on "
          f"DDLF; {sum(1 for r in rows if r[2] == 0)} run on DDLF in all.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
