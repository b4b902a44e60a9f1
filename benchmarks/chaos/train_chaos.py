"""Chaos benchmark: training on a multi-node cluster while trainers and nodes die and nodes join.

    python benchmarks/chaos/train_chaos.py [--runs 20] [--numpy | --framework keras|torch]
                                     [--nodes 2] [--schemes sync,async]
                                     [--train-size 12000] [--test-size 2000] [--epochs E]
                                     [--rounds-per-epoch 4] [--faults-per-run 3] [--seed 0]
                                     [--timeout S] [--json out.json] [--logs DIR]

Each run is its own process (this script with ``--one-run``), and starts its own local
cluster: a head and ``--nodes`` K one-CPU nodes on 127.0.0.1 (``MultiNodeCluster`` from
tests/cluster_utils.py, what ``ddlf-node start`` runs). It trains K trainers on a subset
of Fashion-MNIST (``--train-size`` images, ``--test-size`` test images), checkpointing
every round into a temporary directory: the paper's CNN (Keras on TensorFlow; with
``--framework torch`` the same CNN in PyTorch, ``models.paper_cnn_torch``, SGD 0.01 as
Keras compiles it), or with ``--numpy`` the softmax regression of tests/helpers_modules/numpy_trainer.py, whose
``fit`` sleeps ``--numpy-fit-s`` per call to stand for compute (so rounds last long
enough for faults to land mid-round, without loading the shared machine). Runs
alternate between the schemes given (``sync`` and ``async`` by default).

Faults come from a generator seeded by ``(--seed, run)``, at random times in the middle
of the run (after 10 % of its rows and before 75 %: rows, not seconds, since the shared
machine's load changes a run's length severalfold), spaced so that about
``--faults-per-run`` fit in the run's time (estimated from its own pace up to the window's
start, not the fault-free run's, which a change of load makes several times off), one at
a time:

- ``trainer``: SIGKILL to one trainer's process, by pid (read from the head's actor
  list), from outside; its replacement starts in its reserved bundle on the same node.
- ``node``: a node daemon and every process under it SIGKILLed; its trainer has nowhere
  to go until a node joins (or a spare node that joined earlier takes it at once).
- ``join``: a new one-CPU node starts and joins. It is forced while a node's trainer
  waits for capacity, and otherwise happens at random while there is no spare node.

A trainer or node is killed only while every one of the K trainers is live and at
least two are (so at most K - 1 of K are ever lost, one at a time; never all at once).

Each run has a watchdog (``--timeout``; by default 4x the fault-free run plus 60 s):
a run still going then is a *hang*. Its Python stacks are dumped (SIGUSR1 to
faulthandler) into its log, and its whole process tree is killed. A run whose training
call raises is a *failed run*, reported with the exception.

What is measured, all on the wall clock (``time.time()``, one clock for every process
on the machine):

- detection: from the fault to the ``trainer_lost`` event, seen by an ``on_event``
  callback on the driver;
- reconfiguration, two ways: to the next call (train, or the evaluation shard a round
  queues first) another trainer starts after the loss (sync: the next round, started
  without the lost trainer; async: the next piece, the lost one requeued), and to the
  ``trainer_joined`` of the lost slot's replacement; for a join, from the node's start
  to the trainer it takes joining;
- wasted work per fault, in units of one trainer's share of one round: the compute the
  lost trainer had spent on its unfinished call (its log of train calls: kill time
  minus call start, over the run's median call), and for sync also the samples the
  round of the loss trained short of its plan, over the share;
- final test accuracy against a fault-free run of the same scheme with the same seed
  (``--baselines`` of them; a second one shows the run-to-run noise);
- checkpoint cost: ``result.checkpoint_s`` (time the training loop waited on
  checkpoints) plus ``result.checkpoint_cpu_s`` (the CPU the background writer took),
  over the training call's wall time; ``result.checkpoint_write_s``, the writer's wall
  time, is shown too (most of it waits on ``fsync`` and costs training nothing).

The report is a table per run, one per fault kind, and the issue's targets, met or
missed. Exit status 0 only with no hang and no failed run.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TESTS = os.path.join(_ROOT, "tests")
for _p in (_TESTS, _ROOT):   # run from a source checkout; MultiNodeCluster, NumpyTrainer
    if _p not in sys.path:
        sys.path.insert(0, _p)

RESULT_PREFIX = "TRAIN_CHAOS_RESULT "
CALL_LOG_ENV = "DDLF_CHAOS_CALL_LOG"
FIT_SLEEP_ENV = "DDLF_CHAOS_FIT_S"
TRAINER_CLASSES = ("ChaosCnnTrainer", "ChaosNumpyTrainer")
# The targets of the issue (section 1 and 4).
TARGET_RECONFIG_S = 3.0
TARGET_ACC_POINTS = 0.5
TARGET_CKPT_FRACTION = 0.02
TARGET_WASTE_SHARES = 1.0


def now() -> float:
    return time.time()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- what runs on the trainers ----------------------------------------------------------------


def fashion_subset(n_train: int, n_test: int):
    """The first ``n_train``/``n_test`` images of Fashion-MNIST (a dataset callable)."""
    from ddlf_actors.apps import datasets

    (x, y), (x_test, y_test) = datasets.load("fashion-mnist")
    return (x[:n_train], y[:n_train]), (x_test[:n_test], y_test[:n_test])


def seeded_cnn(seed: int):
    """The paper's CNN, initialised from ``seed`` (every trainer and every run alike)."""
    import keras

    from ddlf_actors.apps.models import paper_cnn

    keras.utils.set_random_seed(seed)
    return paper_cnn()


def seeded_cnn_torch(seed: int):
    """The paper's CNN in PyTorch, initialised from ``seed`` (every trainer and run alike)."""
    import torch

    from ddlf_actors.apps.models import paper_cnn_torch

    torch.manual_seed(seed)
    return paper_cnn_torch()


def softmax_784(seed: int):
    from helpers_modules.numpy_trainer import SoftmaxModel

    return SoftmaxModel(28 * 28, 10, lr=0.1, seed=seed)


def _call_log(record: dict) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if not path:
        return
    # One short line per write with O_APPEND: lines of concurrent trainers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


class _LoggedCalls:
    """Logs when each train call starts and ends (pid, slot, wall clock): the benchmark's
    record of work in progress when a fault hits, and of when the next round starts."""

    def train(self, weights, indices, epochs, batch_size, return_state=False, **kwargs):
        slot, pid = getattr(self, "_ddlf_index", None), os.getpid()
        _call_log({"e": "start", "slot": slot, "pid": pid, "t": time.time()})
        out = super().train(weights, indices, epochs, batch_size, return_state, **kwargs)
        _call_log({"e": "end", "slot": slot, "pid": pid, "t": time.time(),
                   "n": out[1]["samples"]})
        return out

    def evaluate(self, weights=None, shard=None):
        # A round's first work on a trainer is its shard of the last row's evaluation.
        _call_log({"e": "eval", "slot": getattr(self, "_ddlf_index", None),
                   "pid": os.getpid(), "t": time.time()})
        return super().evaluate(weights, shard)


def _trainer_classes():
    from helpers_modules.numpy_trainer import NumpyTrainer

    from ddlf_actors.apps import TrainerActor

    class ChaosCnnTrainer(_LoggedCalls, TrainerActor):
        pass

    class ChaosNumpyTrainer(_LoggedCalls, NumpyTrainer):
        def fit(self, x, y, epochs, batch_size):
            time.sleep(float(os.environ.get(FIT_SLEEP_ENV, "0")))
            return super().fit(x, y, epochs, batch_size)

    return ChaosCnnTrainer, ChaosNumpyTrainer


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

    cnn_cls, numpy_cls = _trainer_classes()
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


# -- the parent: runs, watchdog, report -------------------------------------------------------


def run_process(spec: dict, timeout: float) -> dict:
    """Run ``spec`` in its own process group with a watchdog; return its result.

    A run still going after ``timeout`` s is a hang: its stacks go to its log (SIGUSR1 to
    faulthandler), then its whole tree is killed, by pid."""
    import psutil

    os.makedirs(spec["dir"], exist_ok=True)
    spec_path = os.path.join(spec["dir"], "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    stderr_path = os.path.join(spec["dir"], "stderr.log")
    t0 = now()
    with open(stderr_path, "w") as err, tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one-run", spec_path],
                                stdout=stdout, stderr=err, start_new_session=True)
        me = psutil.Process(proc.pid)
        seen: dict = {}
        hang = False
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for p in me.children(recursive=True):
                    seen.setdefault(p.pid, p)
            if now() - t0 > timeout:
                hang = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR1)   # stacks into stderr.log
                time.sleep(2)
                break
            time.sleep(0.2)
        leftovers = _end_tree(proc, seen)
        stdout.seek(0)
        text = stdout.read()
    if hang:
        result = {"run": spec["run"], "scheme": spec["scheme"], "chaos": spec["chaos"],
                  "status": "hang", "error": f"still running after {timeout:.0f} s (stacks in "
                  f"{stderr_path})"}
    else:
        result = _parse(text, spec, proc.returncode, stderr_path)
    result["process_s"] = now() - t0
    result["leftovers"] = leftovers
    result["log"] = stderr_path
    return result


def _end_tree(proc, seen: dict) -> list[str]:
    """Kill the run's process group and every descendant we saw (by pid); name those that
    were still alive after the run's own clean-up had its chance."""
    import psutil

    ended = []
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # The run stops its cluster itself; give its daemons a moment to see their lifeline go.
    gone, alive = psutil.wait_procs(list(seen.values()), timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            ended.append(f"{p.name()} ({p.pid})")
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return ended


def _parse(text: str, spec: dict, returncode, stderr_path: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"run": spec["run"], "scheme": spec["scheme"], "chaos": spec["chaos"],
            "status": "failed", "error": f"the run process exited with {returncode} and no "
            f"result (see {stderr_path})"}


# -- analysis ----------------------------------------------------------------------------------


def _planned(round_no: int, n: int, R: int) -> int:
    r = (round_no - 1) % R
    return n * (r + 1) // R - n * r // R


def analyse(run: dict, base: dict | None, spec: dict) -> dict:
    """Per-fault timings and waste, accuracy and checkpoint cost of one run."""
    events = run.get("events", [])
    calls = run.get("calls", [])
    pid_slot = {c["pid"]: c["slot"] for c in calls}
    durations = _call_durations(calls)
    median_call = statistics.median(durations) if durations else None
    rows = {r["round"]: r for r in run.get("rows", [])}
    out = []
    faults = run.get("faults", [])
    for i, f in enumerate(faults):
        nxt = faults[i + 1]["t"] if i + 1 < len(faults) else float("inf")
        m = {"kind": f["kind"], "t": f["t"] - (run.get("t_begin") or f["t"])}
        if f["kind"] in ("trainer", "node"):
            slot = pid_slot.get(f["pid"])
            m["slot"] = slot
            m["spare"] = f.get("spare", False)
            lost = next((e for e in events if e["kind"] == "trainer_lost" and e["wall"] >= f["t"]
                         and (slot is None or e["trainer"] == slot)), None)
            if lost is None:
                m["undetected"] = True   # the run ended first (or missed it: see below)
                out.append(m)
                continue
            m["detect_s"] = lost["wall"] - f["t"]
            m["round"] = lost["round"]
            start = next((c for c in calls if c["e"] in ("start", "eval")
                          and c["t"] >= lost["wall"] and c["pid"] != f["pid"]), None)
            if start is not None:
                m["resume_s"] = start["t"] - f["t"]
            joined = next((e for e in events if e["kind"] == "trainer_joined"
                           and e["trainer"] == lost["trainer"] and e["wall"] >= lost["wall"]),
                          None)
            if joined is not None:
                m["replace_s"] = joined["wall"] - f["t"]
                m["replace_after_join"] = joined["wall"] > nxt
            m["wasted_compute"] = _wasted_compute(calls, f, median_call)
            if spec["scheme"] == "sync" and lost["round"] in rows:
                row = rows[lost["round"]]
                planned = _planned(lost["round"], spec["train_size"], spec["rounds_per_epoch"])
                share = planned / (row["workers"] + 1)
                m["wasted_samples"] = max(0, planned - row["samples"]) / share
        else:
            joined = next((e for e in events if e["kind"] == "trainer_joined"
                           and e["wall"] >= f["t"] and e["wall"] < nxt), None)
            m["started_s"] = f.get("started_s")
            if joined is not None:
                m["replace_s"] = joined["wall"] - f["t"]
        out.append(m)
    result = {"faults": out}
    if run.get("status") == "ok":
        result["checkpoint_frac"] = run["checkpoint_s"] / run["train_s"]
        if run.get("checkpoint_write_s") is not None:
            result["writer_frac"] = run["checkpoint_write_s"] / run["train_s"]
            result["writer_cpu_frac"] = run["checkpoint_cpu_s"] / run["train_s"]
        if base is not None and base.get("final_accuracy") is not None:
            result["acc_diff"] = 100 * (run["final_accuracy"] - base["final_accuracy"])
    # Rows trained by fewer than K trainers (sync: rounds; async: epochs).
    result["short_rows"] = sum(1 for w in run.get("workers", []) if w < spec["nodes"])
    lost_events = [e for e in events if e["kind"] == "trainer_lost"]
    result["unexplained_losses"] = max(0, len(lost_events) - sum(
        1 for m in out if "detect_s" in m))
    return result


def _call_durations(calls: list) -> list:
    starts: dict = {}
    out = []
    for c in calls:
        if c["e"] == "start":
            starts[c["pid"]] = c["t"]
        elif c["pid"] in starts:
            out.append(c["t"] - starts.pop(c["pid"]))
    return out


def _wasted_compute(calls: list, fault: dict, median_call: float | None) -> float:
    """The lost trainer's unfinished call at the fault, in shares (median calls)."""
    mine = [c for c in calls if c["pid"] == fault["pid"] and c["t"] <= fault["t"]
            and c["e"] != "eval"]
    if not mine or mine[-1]["e"] != "start" or not median_call:
        return 0.0
    return (fault["t"] - mine[-1]["t"]) / median_call


# -- the report --------------------------------------------------------------------------------


def _stat(values: list, spec: str = ".2f") -> str:
    if not values:
        return "-"
    return f"{format(statistics.median(values), spec)} / {format(max(values), spec)}"


def _mean_max(values: list, spec: str = ".2f") -> str:
    if not values:
        return "-"
    return f"{format(statistics.fmean(values), spec)} / {format(max(values), spec)}"


def format_runs(runs: list, analyses: list) -> str:
    head = (f"{'run':>4} {'scheme':<6} {'status':<7} {'train s':>8} {'faults':<22} "
            f"{'short':>5} {'acc':>7} {'Δ pts':>6} {'ckpt %':>7} {'writer %':>8} {'cpu %':>6} "
            f"{'load':>5}")
    lines = [head, "-" * len(head)]
    for run, a in zip(runs, analyses):
        kinds = [m["kind"] for m in a["faults"]]
        faults = " ".join(f"{k}x{kinds.count(k)}" for k in ("trainer", "node", "join")
                          if kinds.count(k)) or "-"
        acc = run.get("final_accuracy")
        lines.append(
            f"{run['run']:>4} {run['scheme']:<6} {run['status']:<7} "
            f"{run.get('train_s', 0):>8.1f} {faults:<22} {a.get('short_rows', 0):>5} "
            f"{'-' if acc is None else f'{acc:.4f}':>7} "
            f"{'-' if a.get('acc_diff') is None else format(a['acc_diff'], '+.2f'):>6} "
            f"{'-' if a.get('checkpoint_frac') is None else format(100 * a['checkpoint_frac'], '.2f'):>7} "
            f"{'-' if a.get('writer_frac') is None else format(100 * a['writer_frac'], '.2f'):>8} "
            f"{'-' if a.get('writer_cpu_frac') is None else format(100 * a['writer_cpu_frac'], '.2f'):>6} "
            f"{run.get('load_before', 0):>5.1f}")
        if run["status"] != "ok":
            lines.append(f"     {run.get('error', '')}")
    lines.append("short: history rows trained by fewer than K trainers (sync: rounds, async: "
                 "epochs); Δ pts: final test accuracy minus the fault-free run's; ckpt %: "
                 "time the loop waited on checkpoints; writer %, cpu %: the writer thread's "
                 "wall time (mostly fsync) and CPU time; load: 1-min load average at its start")
    return "\n".join(lines)


def format_faults(analyses: list, runs: list) -> str:
    head = (f"{'fault':<14} {'n':>3} {'detected':>8} {'detect s':>13} {'next call s':>13} "
            f"{'replaced s':>13} {'waste: compute':>15} {'samples':>13}")
    lines = ["times: median / max; waste: mean / max, in shares (one trainer's share of "
             "one round)", head, "-" * len(head)]
    groups: dict = {}
    for run, a in zip(runs, analyses):
        for m in a["faults"]:
            key = m["kind"]
            if m["kind"] == "node" and m.get("spare"):
                key = "node (spare)"
            groups.setdefault(f"{key} {run['scheme']}", []).append(m)
    for key in sorted(groups):
        ms = groups[key]
        det = [m for m in ms if "detect_s" in m]
        lines.append(
            f"{key:<14} {len(ms):>3} "
            f"{(f'{len(det)}/{len(ms)}' if not key.startswith('join') else '-'):>8} "
            f"{_stat([m['detect_s'] for m in det]):>13} "
            f"{_stat([m['resume_s'] for m in det if 'resume_s' in m]):>13} "
            f"{_stat([m['replace_s'] for m in ms if 'replace_s' in m]):>13} "
            f"{_mean_max([m['wasted_compute'] for m in det]):>15} "
            f"{_mean_max([m['wasted_samples'] for m in det if 'wasted_samples' in m]):>13}")
    lines.append("node: killed with no spare node, its trainer waits for a join (replaced s "
                 "includes that wait); join: from the node's start to a trainer joining on it")
    return "\n".join(lines)


def targets(runs: list, analyses: list) -> list[tuple[str, str, bool]]:
    chaos = [(r, a) for r, a in zip(runs, analyses) if r["chaos"]]
    hangs = sum(1 for r, _ in chaos if r["status"] == "hang")
    failed = sum(1 for r, _ in chaos if r["status"] == "failed")
    out = [("0 hangs, 0 failed runs (K-1 of K lost, one at a time)",
            f"{hangs} hangs, {failed} failed of {len(chaos)}", hangs == 0 and failed == 0)]
    procs = [m for _, a in chaos for m in a["faults"] if m["kind"] == "trainer"]
    det = [m for m in procs if "detect_s" in m]
    if procs:
        reconf = [min(m.get("resume_s", float("inf")), m.get("replace_s", float("inf")))
                  for m in det]
        worst_det = max((m["detect_s"] for m in det), default=float("inf"))
        worst = max(reconf, default=float("inf"))
        out.append(("lost process detected and reconfigured <= 3 s",
                    f"{len(det)}/{len(procs)} detected; detect max {worst_det:.2f} s; "
                    f"reconfigured (first of next call, replacement) max {worst:.2f} s, "
                    f"median {statistics.median(reconf) if reconf else float('nan'):.2f} s",
                    len(det) == len(procs) and worst_det <= TARGET_RECONFIG_S
                    and worst <= TARGET_RECONFIG_S))
    diffs = [a["acc_diff"] for _, a in chaos if a.get("acc_diff") is not None]
    if diffs:
        worst = min(diffs, key=lambda d: -abs(d))
        out.append(("final accuracy within 0.5 points of the fault-free run",
                    f"mean {statistics.fmean(diffs):+.2f}, furthest {worst:+.2f}, "
                    f"largest drop {min(0.0, min(diffs)):+.2f} points",
                    round(abs(worst), 6) <= TARGET_ACC_POINTS))
    fracs = [a["checkpoint_frac"] for _, a in chaos if a.get("checkpoint_frac") is not None]
    writer = [a["writer_frac"] for _, a in chaos if a.get("writer_frac") is not None]
    cpu = [a["writer_cpu_frac"] for _, a in chaos if a.get("writer_cpu_frac") is not None]
    if fracs:
        # The cost to training: what the loop waited, plus the CPU the writer thread took
        # from the driver (its waits on fsync take nothing from anyone).
        cost = [f + c for f, c in zip(fracs, cpu)] if len(cpu) == len(fracs) else fracs
        text = (f"loop waits mean {100 * statistics.fmean(fracs):.2f} %, max "
                f"{100 * max(fracs):.2f} %")
        if writer:
            text += (f"; writer CPU mean {100 * statistics.fmean(cpu):.2f} %, max "
                     f"{100 * max(cpu):.2f} % (its wall time, mostly fsync: mean "
                     f"{100 * statistics.fmean(writer):.2f} %, max {100 * max(writer):.2f} %)")
        out.append(("checkpoint cost <= 2 % of wall time (waits + writer CPU)", text,
                    max(cost) <= TARGET_CKPT_FRACTION))
    waste = [max(m.get("wasted_compute", 0.0), m.get("wasted_samples", 0.0))
             for _, a in chaos for m in a["faults"] if "detect_s" in m]
    if waste:
        out.append(("wasted work per failure <= one trainer's share of one round",
                    f"mean {statistics.fmean(waste):.2f}, max {max(waste):.2f} shares",
                    max(waste) <= TARGET_WASTE_SHARES))
    return out


def format_targets(rows: list) -> str:
    head = f"{'target':<62} {'met':<4} measured"
    lines = [head, "-" * 100]
    for name, text, ok in rows:
        lines.append(f"{name:<62} {'yes' if ok else 'NO':<4} {text}")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------


def _training_s(run: dict) -> float:
    """From training's start (trainers built) to its last row."""
    return run["rows"][-1]["wall"] - run["t_begin"]


def _spec(args, run: int, scheme: str, chaos: bool, root: str, base_s: float | None) -> dict:
    window = (0.1, 0.75)   # of the rows
    return {"run": run, "scheme": scheme, "chaos": chaos, "numpy": args.numpy,
            "framework": args.framework,
            "nodes": args.nodes, "train_size": args.train_size, "test_size": args.test_size,
            "epochs": args.epochs, "rounds_per_epoch": args.rounds_per_epoch,
            "seed": args.seed, "chaos_seed": args.seed * 100_003 + run,
            "numpy_fit_s": args.numpy_fit_s, "window": window,
            "mean_gap": (window[1] - window[0]) * (base_s or 0) / max(1, args.faults_per_run),
            "faults_per_run": args.faults_per_run,
            "dir": os.path.join(root, f"{'run' if chaos else 'base'}-{scheme}-{run:03d}")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="runs with faults (default 20)")
    p.add_argument("--numpy", action="store_true",
                   help="the numpy softmax trainer instead of the paper's CNN (fast)")
    p.add_argument("--framework", choices=("keras", "torch"), default="keras",
                   help="the paper's CNN in Keras (TensorFlow) or in PyTorch")
    p.add_argument("--nodes", type=int, default=2, help="K one-CPU nodes = K trainers")
    p.add_argument("--schemes", default="sync,async")
    p.add_argument("--train-size", type=int, default=12000)
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=None,
                   help="master epochs (default: 4 for the CNN, 8 with --numpy)")
    p.add_argument("--rounds-per-epoch", type=int, default=4)
    p.add_argument("--numpy-fit-s", type=float, default=0.4,
                   help="with --numpy: seconds each train call sleeps (stands for compute)")
    p.add_argument("--faults-per-run", type=float, default=3)
    p.add_argument("--baselines", type=int, default=2,
                   help="fault-free runs per scheme (the first is the reference)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=None,
                   help="a run's watchdog, s (default: 4x the fault-free run + 60 s)")
    p.add_argument("--json", help="write every run's raw record and analysis here")
    p.add_argument("--logs", help="keep each run's logs and checkpoints here (default: a "
                   "temp directory, removed unless a run hung or failed)")
    p.add_argument("--one-run", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.one_run:
        with open(args.one_run) as f:
            spec = json.load(f)
        result = one_run(spec)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    if args.epochs is None:
        args.epochs = 8 if args.numpy else 4
    if args.nodes < 2:
        p.error("--nodes must be at least 2: one trainer must survive each fault")
    schemes = [s for s in args.schemes.split(",") if s]
    from ddlf_actors.apps import datasets

    if datasets.locate("fashion-mnist") is None:
        p.error("Fashion-MNIST not found: `apt-get download dataset-fashion-mnist && dpkg-deb "
                "-x dataset-fashion-mnist_*.deb DIR` and set DDLF_DATA_DIR=DIR/usr/share/"
                "datasets, or run `ddlf-train fetch fashion-mnist`")
    root = args.logs or tempfile.mkdtemp(prefix="ddlf-chaos-")
    os.makedirs(root, exist_ok=True)
    # One dataset cache for every run: built by the first, mapped by the rest.
    os.environ.setdefault("DDLF_CACHE_DIR", os.path.join(root, "cache"))
    if args.numpy and args.framework != "keras":
        p.error("--numpy and --framework: the numpy model is neither")
    what = ("numpy softmax" if args.numpy else
            "paper CNN (PyTorch)" if args.framework == "torch" else "paper CNN (Keras)")
    log(f"train_chaos: {args.runs} runs, {what}, K={args.nodes}, schemes {schemes}, "
        f"logs in {root}; load {os.getloadavg()}")

    runs, specs = [], []
    bases: dict = {}
    for scheme in schemes:
        for b in range(args.baselines):
            spec = _spec(args, b, scheme, False, root, None)
            r = run_process(spec, args.timeout or 900)
            log(f"baseline {scheme} #{b}: {r['status']} {r.get('train_s', 0):.1f} s, "
                f"accuracy {r.get('final_accuracy')}")
            runs.append(r)
            specs.append(spec)
            if r["status"] == "ok" and scheme not in bases:
                bases[scheme] = r
        if scheme not in bases:
            log(f"no fault-free {scheme} run finished: cannot time faults for it")
    for i in range(args.runs):
        scheme = schemes[i % len(schemes)]
        base = bases.get(scheme)
        if base is None:
            continue
        spec = _spec(args, i, scheme, True, root, _training_s(base))
        timeout = args.timeout or 4 * base["train_s"] + 60
        r = run_process(spec, timeout)
        a = analyse(r, base, spec)
        kinds = [m["kind"] for m in a["faults"]]
        log(f"run {i} {scheme}: {r['status']} {r.get('train_s', 0):.1f} s, faults {kinds}, "
            f"accuracy {r.get('final_accuracy')} (Δ {a.get('acc_diff')}) "
            f"{r.get('error', '')}")
        runs.append(r)
        specs.append(spec)

    analyses = [analyse(r, bases.get(r["scheme"]), s) for r, s in zip(runs, specs)]
    print(f"\n{what} on Fashion-MNIST ({args.train_size} train / {args.test_size} test), "
          f"K={args.nodes} one-CPU nodes, {args.epochs} epochs x {args.rounds_per_epoch} "
          f"rounds, checkpoint every round, seed {args.seed}"
          + (f", fit sleeps {args.numpy_fit_s} s" if args.numpy else "")
          + f"; load average at the end {os.getloadavg()[0]:.1f}")
    print(format_runs(runs, analyses))
    print()
    print(format_faults(analyses, runs))
    chaos = [r for r in runs if r["chaos"]]
    print(f"\nruns with faults: {len(chaos)}; finished "
          f"{sum(r['status'] == 'ok' for r in chaos)}, hangs "
          f"{sum(r['status'] == 'hang' for r in chaos)}, failed "
          f"{sum(r['status'] == 'failed' for r in chaos)}; faults injected "
          f"{sum(len(a['faults']) for r, a in zip(runs, analyses) if r['chaos'])}; "
          f"losses with no injected fault "
          f"{sum(a['unexplained_losses'] for r, a in zip(runs, analyses) if r['chaos'])}")
    for scheme in schemes:
        accs = [r["final_accuracy"] for r in runs if not r["chaos"] and r["scheme"] == scheme
                and r.get("final_accuracy") is not None]
        if len(accs) > 1:
            print(f"fault-free {scheme} runs: accuracies {', '.join(f'{a:.4f}' for a in accs)} "
                  f"(spread {100 * (max(accs) - min(accs)):.2f} points)")
    print()
    print(format_targets(targets(runs, analyses)))
    leftovers = [x for r in runs for x in r.get("leftovers", [])]
    if leftovers:
        print(f"processes left behind and killed: {leftovers}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "analyses": analyses}, f, indent=1)
    bad = [r for r in chaos if r["status"] != "ok"]
    if not args.logs and not bad:
        shutil.rmtree(root, ignore_errors=True)
    elif bad:
        print(f"logs of the runs that hung or failed are in {root}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
