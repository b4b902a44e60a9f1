"""Single-node microbenchmark: DDLF next to Ray, in the same run, on the same workloads.

    python benchmarks/runtime/microbench.py [--quick] [--only ddlf] [--tls] [--json out.json]

The workloads mirror ``ray microbenchmark``:

1. 1:1 actor calls, sync: call, then get, one at a time.
2. 1:1 actor calls, async: submit 1,000 calls, then get them all.
3. n:n actor calls, async: n = CPU-count caller actors, each holding a handle to its own
   callee actor (given to it as a constructor argument); each caller submits a batch of
   calls to its callee and gets them. Calls/s summed over the callers.
4. tasks, sync: submit one no-op task, then get it, one at a time.
5. tasks, async: submit 1,000 no-op tasks, then get them all.
6. 100 MB float32 array: put then get in the driver; driver put then an actor method
   that takes the ref and returns ``arr.nbytes``; an actor method that returns the array
   and the driver gets it. Best of a few repetitions, in GB/s (1 GB = 1e9 bytes).
7. creating 8 actors (``num_cpus=0``) until each has answered one call; best of a
   few rounds, in seconds and actors/s. The actors are killed after each round.

``--tls`` adds a phase that runs DDLF again with mutual TLS on every connection (fresh
certificates made with the ``openssl`` command of README's "TLS" section) on the call
and 100 MB workloads, and prints DDLF plain vs DDLF TLS under the main table.

Each framework runs in its own phase (init, workloads, shutdown) so they never share
the machine at the same time. Every workload warms up before it is timed, and a
workload that fails (or runs past its time limit) prints ``error: ...`` in its cell
without stopping the others.
"""

from __future__ import annotations

import os

# Before numpy (and the frameworks' workers, which inherit the environment) start.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)

from benchmarks.runtime.microbench_report import (  # noqa: E402
    build_rows,
    build_tls_rows,
    fmt,
    machine_info,
    print_table,
    print_tls_table,
)

N_FLOATS = 25_000_000  # 100 MB of float32
BIG_BYTES = N_FLOATS * 4
GB = 1e9
N_ASYNC = 1_000  # calls/tasks submitted before getting them all
N_CREATE = 8  # actors created per round in the creation workload
NCPU = os.cpu_count() or 1


class Config:
    """How long to measure: ~2 s per rate workload by default, much less with --quick."""

    def __init__(self, quick: bool):
        self.quick = quick
        self.seconds = 0.4 if quick else 2.0  # timed part of each rate workload
        self.warmup = 0.15 if quick else 0.5  # untimed part before it
        self.big_reps = 3 if quick else 6  # timed 100 MB repetitions (after one warm-up)
        self.create_rounds = 1 if quick else 3
        self.nn_batch = 250 if quick else 1_000  # calls per caller per n:n round
        self.time_limit = 60 if quick else 120  # per workload, seconds


class WorkloadTimeout(Exception):
    pass


# -- what runs remotely ---------------------------------------------------------------------


def make_defs(fw):
    """The remote classes and functions of one framework (``fw`` is ddlf or ray)."""

    @fw.remote(num_cpus=0)
    class Actor:
        def __init__(self, callee=None):
            self.callee = callee
            self.arr = None

        def small_value(self):
            return b"ok"

        def batch(self, n):
            # n:n: this caller actor submits n calls to its own callee, then gets them.
            fw.get([self.callee.small_value.remote() for _ in range(n)])
            return n

        def nbytes(self, arr):
            return arr.nbytes

        def make_big(self):
            self.arr = np.ones(N_FLOATS, dtype=np.float32)
            return self.arr.nbytes

        def big(self):
            return self.arr

    @fw.remote
    def small_value():
        return b"ok"

    return Actor, small_value


# -- timing helpers --------------------------------------------------------------------------


def rate(fn, ops_per_call: int, cfg: Config) -> float:
    """Run ``fn`` for ``cfg.warmup`` s untimed, then for ``cfg.seconds`` s; return ops/s."""
    t_end = time.perf_counter() + cfg.warmup
    fn()
    while time.perf_counter() < t_end:
        fn()
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= cfg.seconds:
            return n * ops_per_call / dt


def best_time(fn, reps: int, warm: bool = True) -> float:
    """Shortest wall time of ``reps`` calls of ``fn`` (after one untimed call if ``warm``)."""
    if warm:
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kill_all(fw, handles) -> None:
    for h in handles:
        try:
            fw.kill(h)
        except Exception:
            pass


# -- workloads: each takes (fw, defs, cfg) and returns {row label: (value, unit)} -----------


def wl_actor_sync(fw, defs, cfg):
    Actor, _ = defs
    a = Actor.remote()
    try:
        assert fw.get(a.small_value.remote()) == b"ok"
        v = rate(lambda: fw.get(a.small_value.remote()), 1, cfg)
    finally:
        kill_all(fw, [a])
    return {"1:1 actor calls sync": (v, "calls/s")}


def wl_actor_async(fw, defs, cfg):
    Actor, _ = defs
    a = Actor.remote()
    try:
        assert fw.get([a.small_value.remote() for _ in range(N_ASYNC)]) == [b"ok"] * N_ASYNC
        v = rate(lambda: fw.get([a.small_value.remote() for _ in range(N_ASYNC)]), N_ASYNC, cfg)
    finally:
        kill_all(fw, [a])
    return {"1:1 actor calls async": (v, "calls/s")}


def wl_nn_async(fw, defs, cfg):
    Actor, _ = defs
    callees = [Actor.remote() for _ in range(NCPU)]
    callers = [Actor.remote(c) for c in callees]
    try:
        fw.get([h.small_value.remote() for h in callees + callers])
        n = cfg.nn_batch
        assert fw.get([c.batch.remote(n) for c in callers]) == [n] * len(callers)
        v = rate(lambda: fw.get([c.batch.remote(n) for c in callers]), n * len(callers), cfg)
    finally:
        kill_all(fw, callers + callees)
    return {f"n:n actor calls async (n={NCPU})": (v, "calls/s")}


def wl_task_sync(fw, defs, cfg):
    _, small_value = defs
    assert fw.get(small_value.remote()) == b"ok"
    v = rate(lambda: fw.get(small_value.remote()), 1, cfg)
    return {"tasks sync": (v, "tasks/s")}


def wl_task_async(fw, defs, cfg):
    _, small_value = defs
    assert fw.get([small_value.remote() for _ in range(N_ASYNC)]) == [b"ok"] * N_ASYNC
    v = rate(lambda: fw.get([small_value.remote() for _ in range(N_ASYNC)]), N_ASYNC, cfg)
    return {"tasks async": (v, "tasks/s")}


def wl_put_get(fw, defs, cfg):
    arr = np.ones(N_FLOATS, dtype=np.float32)

    def once():
        out = fw.get(fw.put(arr))
        assert out.nbytes == BIG_BYTES
        del out

    return {"100 MB put+get in driver": (BIG_BYTES / best_time(once, cfg.big_reps) / GB, "GB/s")}


def wl_put_to_actor(fw, defs, cfg):
    Actor, _ = defs
    arr = np.ones(N_FLOATS, dtype=np.float32)
    a = Actor.remote()
    try:
        fw.get(a.small_value.remote())

        def once():  # a fresh put each time, so nothing is cached on the actor's side
            assert fw.get(a.nbytes.remote(fw.put(arr))) == BIG_BYTES

        v = BIG_BYTES / best_time(once, cfg.big_reps) / GB
    finally:
        kill_all(fw, [a])
    return {"100 MB driver put -> actor arg": (v, "GB/s")}


def wl_actor_to_driver(fw, defs, cfg):
    Actor, _ = defs
    a = Actor.remote()
    try:
        fw.get(a.make_big.remote())

        def once():
            out = fw.get(a.big.remote())
            assert out.nbytes == BIG_BYTES
            del out

        v = BIG_BYTES / best_time(once, cfg.big_reps) / GB
    finally:
        kill_all(fw, [a])
    return {"100 MB actor return -> driver get": (v, "GB/s")}


def wl_create_actors(fw, defs, cfg):
    Actor, _ = defs
    best = float("inf")
    for _ in range(cfg.create_rounds):
        hs = []
        try:
            t0 = time.perf_counter()
            hs = [Actor.remote() for _ in range(N_CREATE)]
            assert fw.get([h.small_value.remote() for h in hs]) == [b"ok"] * N_CREATE
            best = min(best, time.perf_counter() - t0)
        finally:
            kill_all(fw, hs)
        time.sleep(0.5)  # let the killed actors' processes go before the next round
    return {f"create {N_CREATE} actors until each answered": (best, "s"),
            "actor creation rate": (N_CREATE / best, "actors/s")}


def _spin(n: int) -> int:
    """Pure-Python CPU work (holds the GIL: only more processes can run it in parallel)."""
    acc = 0
    for i in range(n):
        acc += i * i % 7
    return acc


def wl_cpu_tasks(fw, defs, cfg):
    # Calibrate one unit of work to ~0.25 s here, then run 4 units per CPU as tasks:
    # perfect spreading over the N CPUs takes 4 units' time.
    n = 200_000
    t0 = time.perf_counter()
    _spin(n)
    n = int(n * 0.25 / (time.perf_counter() - t0))
    spin = fw.remote(_spin)
    fw.get([spin.remote(1000) for _ in range(NCPU)])  # warm the workers
    unit_t0 = time.perf_counter()
    _spin(n)
    unit = time.perf_counter() - unit_t0
    t0 = time.perf_counter()
    fw.get([spin.remote(n) for _ in range(4 * NCPU)])
    elapsed = time.perf_counter() - t0
    return {f"{4 * NCPU} CPU-bound tasks on {NCPU} CPUs": (elapsed / (4 * unit), "x ideal")}


# (function, rows it reports) -- the rows are listed so a failure can fill each with "error"
WORKLOADS = [
    (wl_actor_sync, [("1:1 actor calls sync", "calls/s")]),
    (wl_actor_async, [("1:1 actor calls async", "calls/s")]),
    (wl_nn_async, [(f"n:n actor calls async (n={NCPU})", "calls/s")]),
    (wl_task_sync, [("tasks sync", "tasks/s")]),
    (wl_task_async, [("tasks async", "tasks/s")]),
    (wl_cpu_tasks, [(f"{4 * NCPU} CPU-bound tasks on {NCPU} CPUs", "x ideal")]),
    (wl_put_get, [("100 MB put+get in driver", "GB/s")]),
    (wl_put_to_actor, [("100 MB driver put -> actor arg", "GB/s")]),
    (wl_actor_to_driver, [("100 MB actor return -> driver get", "GB/s")]),
    (wl_create_actors, [(f"create {N_CREATE} actors until each answered", "s"),
                        ("actor creation rate", "actors/s")]),
]


# The rows the TLS phase repeats: what encryption can slow down (small-call latency and bulk
# bandwidth), not the ones dominated by process start-up or CPU work.
TLS_WORKLOADS = [(fn, rows) for fn, rows in WORKLOADS
                 if fn in (wl_actor_sync, wl_actor_async, wl_task_sync, wl_put_to_actor,
                           wl_actor_to_driver)]

# README's commands: a CA for the cluster and one P-256 certificate it signs.
_OPENSSL = [
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days",
     "30", "-subj", "/CN=bench-ca", "-keyout", "ca.key", "-out", "ca.pem"],
    ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj",
     "/CN=bench-node", "-keyout", "node.key", "-out", "node.csr"],
    ["x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
     "-days", "30", "-out", "node.pem"],
]


def make_tls_env(folder: str) -> dict:
    """Fresh certificates in ``folder``; returns the DDLF_TLS_* variables naming them."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("--tls needs the openssl command to make test certificates")
    for args in _OPENSSL:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True)
    return {"DDLF_TLS_CERT": os.path.join(folder, "node.pem"),
            "DDLF_TLS_KEY": os.path.join(folder, "node.key"),
            "DDLF_TLS_CA": os.path.join(folder, "ca.pem")}


def run_tls_phase(cfg: Config) -> dict:
    """DDLF again, every connection mutual TLS: the embedded cluster and the driver both
    take it from DDLF_TLS_*, exactly as a user would turn it on."""
    with tempfile.TemporaryDirectory(prefix="ddlf-bench-tls-") as folder:
        try:
            env = make_tls_env(folder)
        except (RuntimeError, subprocess.CalledProcessError) as e:
            msg = f"no certificates: {e}"
            print(f"[DDLF TLS] {msg}", file=sys.stderr)
            return {row: {"error": msg, "unit": unit}
                    for _, rows in TLS_WORKLOADS for row, unit in rows}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return run_phase("ddlf", cfg, TLS_WORKLOADS, label="DDLF TLS")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# -- phases ----------------------------------------------------------------------------------


def _on_alarm(signum, frame):
    raise WorkloadTimeout("workload ran past its time limit")


def _init(name: str):
    if name == "ddlf":
        import ddlf_actors as fw

        fw.init(num_cpus=NCPU)
    else:
        import ray as fw

        fw.init(num_cpus=NCPU, include_dashboard=False, log_to_driver=False,
                configure_logging=False)
    return fw


def run_phase(name: str, cfg: Config, workloads=None, label: str | None = None) -> dict:
    """Init ``name`` (ddlf or ray), run every workload (or ``workloads``), shut down. Returns
    ``{row label: {"value": float, "unit": str} or {"error": str, "unit": str}}``."""
    workloads = WORKLOADS if workloads is None else workloads
    label = label or ("DDLF" if name == "ddlf" else "Ray")
    results: dict = {}
    errors: list = []
    fw = None
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        t_init = time.perf_counter()
        try:
            fw = _init(name)
        except Exception as e:
            msg = f"init failed: {type(e).__name__}: {e}"
            print(f"[{label}] {msg}", file=sys.stderr)
            traceback.print_exc()
            for _, rows in workloads:
                for row, unit in rows:
                    results[row] = {"error": msg, "unit": unit}
            return results
        print(f"[{label}] init took {time.perf_counter() - t_init:.1f} s", file=sys.stderr)
        defs = make_defs(fw)
        for fn, rows in workloads:
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, cfg.time_limit)
            try:
                out = fn(fw, defs, cfg)
                signal.setitimer(signal.ITIMER_REAL, 0)
                for row, (value, unit) in out.items():
                    results[row] = {"value": value, "unit": unit}
                    print(f"[{label}] {row}: {fmt(value)} {unit}", file=sys.stderr)
            except Exception as e:
                signal.setitimer(signal.ITIMER_REAL, 0)
                msg = f"{type(e).__name__}: {e}".strip()
                errors.append((fn.__name__, msg))
                print(f"[{label}] {fn.__name__} failed:", file=sys.stderr)
                traceback.print_exc()
                for row, unit in rows:
                    results[row] = {"error": msg, "unit": unit}
            print(f"[{label}]   ({fn.__name__}: {time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if fw is not None:
            t0 = time.perf_counter()
            try:
                fw.shutdown()
            except Exception:
                print(f"[{label}] shutdown failed:", file=sys.stderr)
                traceback.print_exc()
            print(f"[{label}] shutdown took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return results


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: short measurements (~20 s)")
    p.add_argument("--only", choices=["ddlf"], help="run DDLF only, skip Ray")
    p.add_argument("--tls", action="store_true", help="also run DDLF with mutual TLS on the "
                   "call and 100 MB workloads and print plain vs TLS")
    p.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    a = p.parse_args(argv)
    cfg = Config(a.quick)
    machine = machine_info()
    t_start = time.perf_counter()

    results = {"DDLF": run_phase("ddlf", cfg)}
    if a.tls:
        results["DDLF TLS"] = run_tls_phase(cfg)
    if a.only == "ddlf":
        ray_note = "skipped: --only ddlf"
    elif machine["ray"] is None:
        ray_note = "not importable"
    else:
        try:
            import ray  # noqa: F401
        except Exception as e:
            ray_note = f"not importable: {type(e).__name__}"
        else:
            ray_note = "same run"
            results["Ray"] = run_phase("ray", cfg)

    rows = build_rows(results, WORKLOADS)
    print_table(rows, machine, ray_note)
    tls_rows = build_tls_rows(results, TLS_WORKLOADS) if a.tls else None
    if tls_rows is not None:
        print_tls_table(tls_rows)
    total = time.perf_counter() - t_start
    print(f"(total {total:.0f} s{', --quick' if a.quick else ''}; "
          f"other processes on this machine make the figures noisy)")
    report = {"machine": machine, "quick": a.quick, "ray_note": ray_note,
              "total_seconds": total, "rows": rows}
    if tls_rows is not None:
        report["tls_rows"] = tls_rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {a.json}")
    return report


if __name__ == "__main__":
    main()
