"""One run of ``train_chaos.py`` in its own process: a cluster, a training run and the
faults injected into it (:class:`Chaos`), the rows recorded as they come, and one result
line printed for the parent.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import threading
import traceback

from benchmarks.chaos.chaos_trainers import (
    CALL_LOG_ENV,
    FIT_SLEEP_ENV,
    TRAINER_CLASSES,
    fashion_subset,
    log,
    now,
    seeded_cnn,
    seeded_cnn_torch,
    softmax_784,
    trainer_classes,
)

RESULT_PREFIX = "TRAIN_CHAOS_RESULT "
# The run's nodes import the trainers (and the tests' helpers) from the checkout.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TESTS = os.path.join(_ROOT, "tests")


# -- one run (its own process) ----------------------------------------------------------------


class Chaos:
    """Injects faults into one run from a seeded generator, one at a time (see the module
    docstring), and records each: ``{kind, t, pid, node, ...}``."""

    def __init__(self, cluster, rng: random.Random, workers: int, window: tuple,
                 mean_gap: float, faults: float | None = None):
        self.cluster = cluster
        self.rng = rng
        self.K = workers
        # Faults land between these fractions of the run's rows (not seconds: the shared
        # machine's load changes a run's length severalfold), ``mean_gap`` s apart.
        self.window = window
        self.mean_gap = mean_gap
        # With ``faults``: the gap is set again from this run's own pace once the window
        # opens (the fault-free run's time, measured at another load, can be several
        # times off: faults then miss the window).
        self.faults = faults
        self.progress = 0.0
        self.faults: list[dict] = []
        self.live = workers
        self.dead_nodes: set[str] = set()
        self.t_begin: float | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self.error: str | None = None

    # -- called from the training loop's callbacks
    def begin(self) -> None:
        self.t_begin = now()
        self._thread.start()

    def on_row(self, done: int, total: int) -> None:
        self.progress = done / max(1, total)

    def on_event(self, event: dict) -> None:
        with self._lock:
            if event["kind"] == "trainer_lost":
                self.live -= 1
            elif event["kind"] == "trainer_joined":
                self.live += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    # -- the chaos thread
    def _run(self) -> None:
        try:
            while self.progress < self.window[0] and not self._stop.is_set():
                self._sleep(0.05)
            if self.faults and self.progress > 0 and self.t_begin is not None:
                expected = (now() - self.t_begin) / self.progress   # this run's length
                self.mean_gap = (self.window[1] - self.window[0]) * expected / self.faults
            gap = self.rng.uniform(0.5, 1.5) * self.mean_gap
            while not self._stop.is_set():
                self._sleep(gap)
                action, waited = self._wait_for_action()
                if action is None:
                    return
                if waited:
                    # The run was still recovering when the gap ended: the next fault
                    # comes at a random time from now, not the moment recovery ends.
                    gap = self.rng.uniform(0.2, 1.0) * self.mean_gap
                    continue
                self._do(action)
                # A lost node comes back sooner than the next fault would come.
                down = len(self._alive_nodes()) < self.K
                gap = self.rng.uniform(*((0.2, 1.0) if down else (0.5, 1.5))) * self.mean_gap
        except Exception:
            self.error = traceback.format_exc()
            log(f"chaos thread failed:\n{self.error}")

    def _sleep(self, s: float) -> None:
        self._stop.wait(max(0.0, s))

    def _alive_nodes(self) -> list[dict]:
        return [n for n in self.cluster.nodes if n["node_id"] not in self.dead_nodes]

    def _trainer_actors(self) -> list[dict]:
        from ddlf_actors.runtime.client.current import get_core

        return [a for a in get_core().head_call("list_actors")
                if a.get("class_name") in TRAINER_CLASSES and a.get("state") == "ALIVE"]

    def _wait_for_action(self):
        """``(fault, waited)``: the next fault to inject, once one is allowed (None when the
        run is over), and whether it had to wait for that."""
        waited = False
        while not self._stop.is_set():
            in_window = self.progress < self.window[1]
            nodes = self._alive_nodes()
            with self._lock:
                live = self.live
            if len(nodes) < self.K:
                return ("join", None), waited   # a lost node's trainer waits for capacity
            if not in_window:
                return None, waited
            choices = []
            if live == self.K and live >= 2:
                actors = self._trainer_actors()
                # Settled: no replacement is starting, every actor the head has is a live
                # trainer of the run (so the pid killed is one the run counts on).
                if len(actors) == live:
                    choices += [("trainer", actors)] * 2 + [("node", actors)] * 2
            if len(nodes) <= self.K:
                choices.append(("join", None))
            if choices:
                return self.rng.choice(choices), waited
            waited = True
            self._sleep(0.1)
        return None, waited

    def _do(self, action) -> None:
        kind, actors = action
        if kind == "trainer":
            victim = self.rng.choice(actors)
            t = now()
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim["pid"], signal.SIGKILL)
            self.faults.append({"kind": "trainer", "t": t, "pid": victim["pid"],
                                "node": victim["node_id"]})
        elif kind == "node":
            victim = self.rng.choice(actors)
            node = next(n for n in self._alive_nodes() if n["node_id"] == victim["node_id"])
            spare = len(self._alive_nodes()) > len(actors)   # a node with no trainer on it
            t = now()
            self._kill_node_tree(node)
            self.dead_nodes.add(node["node_id"])
            self.faults.append({"kind": "node", "t": t, "pid": victim["pid"],
                                "node": node["node_id"], "spare": spare})
        else:
            t = now()
            node = self.cluster.add_node(1)
            self.faults.append({"kind": "join", "t": t, "node": node["node_id"],
                                "started_s": now() - t})

    @staticmethod
    def _kill_node_tree(node: dict) -> None:
        import psutil

        proc = psutil.Process(node["proc"].pid)
        victims = [proc, *proc.children(recursive=True)]
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(victims, timeout=10)


def _recorder(chaos: Chaos | None):
    from ddlf_actors.apps.callbacks import Callback

    class Recorder(Callback):
        """Everything the driver sees, on the wall clock; drives the chaos thread."""

        def __init__(self):
            self.events: list[dict] = []
            self.rows: list[dict] = []
            self.t_begin = None

        def on_train_begin(self, run):
            self.t_begin = now()
            if chaos is not None:
                chaos.begin()

        def on_event(self, event, run):
            self.events.append({**event, "wall": now()})
            if chaos is not None:
                chaos.on_event(event)

        def on_row(self, row, run):
            if chaos is not None:
                chaos.on_row(len(self.rows) + 1, run.total_rows)
            self.rows.append({k: row.get(k) for k in ("round", "epoch", "samples", "workers",
                                                      "test_accuracy", "wall_s")}
                             | {"wall": now()})

        def on_train_end(self, result):
            if chaos is not None:
                chaos.stop()

    return Recorder()


def one_run(spec: dict) -> dict:
    """Run one training under chaos (or none, for a baseline); return what happened."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    run_dir = spec["dir"]
    os.makedirs(run_dir, exist_ok=True)
    call_log = os.path.join(run_dir, "calls.jsonl")
    os.environ[CALL_LOG_ENV] = call_log
    os.environ[FIT_SLEEP_ENV] = str(spec["numpy_fit_s"])
    # Nodes and their workers inherit the environment: they find tests/ as we do.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [_ROOT, _TESTS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

    from cluster_utils import MultiNodeCluster

    import ddlf_actors as ddlf
    from ddlf_actors.apps import train_async, train_sync

    cnn_cls, numpy_cls = trainer_classes()
    K = spec["nodes"]
    out: dict = {"run": spec["run"], "scheme": spec["scheme"], "chaos": spec["chaos"],
                 "load_before": os.getloadavg()[0]}
    t_process = now()
    cluster = MultiNodeCluster(node_cpus=(1,) * K)
    chaos = None
    try:
        ddlf.init(address=cluster.address, token=cluster.token)
        out["cluster_s"] = now() - t_process
        if spec["chaos"]:
            chaos = Chaos(cluster, random.Random(spec["chaos_seed"]), K, tuple(spec["window"]),
                          spec["mean_gap"], spec.get("faults_per_run"))
        recorder = _recorder(chaos)
        if spec["numpy"]:
            model_fn, trainer_cls = functools.partial(softmax_784, spec["seed"]), numpy_cls
        elif spec.get("framework") == "torch":   # the adapter follows the model: PyTorch
            model_fn, trainer_cls = functools.partial(seeded_cnn_torch, spec["seed"]), cnn_cls
        else:
            model_fn, trainer_cls = functools.partial(seeded_cnn, spec["seed"]), cnn_cls
        train = train_sync if spec["scheme"] == "sync" else train_async
        t0 = now()
        try:
            result = train(model_fn, functools.partial(fashion_subset, spec["train_size"],
                                                       spec["test_size"]),
                           workers=K, master_epochs=spec["epochs"],
                           rounds_per_epoch=spec["rounds_per_epoch"], batch_size=32,
                           seed=spec["seed"], trainer_cls=trainer_cls, progress=False,
                           checkpoint_dir=os.path.join(run_dir, "ckpt"), checkpoint_every=1,
                           callbacks=[recorder])
            out["status"] = "ok"
        except Exception as e:
            result = None
            out["status"] = "failed"
            out["error"] = f"{type(e).__name__}: {e}"
            out["traceback"] = traceback.format_exc()[-4000:]
        t1 = now()
        out["train_s"] = t1 - t0
        out["t_call"] = t0
        out["t_begin"] = recorder.t_begin
        out["events"] = recorder.events
        out["rows"] = recorder.rows
        if result is not None:
            out["final_accuracy"] = result.history[-1]["test_accuracy"]
            out["history_rounds"] = [r["round"] for r in result.history]
            out["samples"] = [r["samples"] for r in result.history]
            out["workers"] = [r["workers"] for r in result.history]
            out["checkpoint_s"] = result.checkpoint_s
            out["checkpoint_write_s"] = getattr(result, "checkpoint_write_s", None)
            out["checkpoint_cpu_s"] = getattr(result, "checkpoint_cpu_s", None)
            out["checkpoints"] = sum(1 for e in result.events if e["kind"] == "checkpoint")
            out["updates"] = len(result.updates)
    finally:
        if chaos is not None:
            chaos.stop()
            out["faults"] = chaos.faults
            out["chaos_error"] = chaos.error
        ddlf.shutdown()
        cluster.stop()
    out["calls"] = _read_calls(call_log)
    out["load_after"] = os.getloadavg()[0]
    return out


def _read_calls(path: str) -> list:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
