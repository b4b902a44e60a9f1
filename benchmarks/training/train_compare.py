"""Time to accuracy by the protocol of issue 21, with every column tuned on validation.

Every column is tuned on a validation split with the same grid, several seeds run
interleaved, and framework and algorithm are measured apart.

    # 1. selection: each column's grid on the first 50,000 training images, judged on the
    #    last 10,000 (validation); the test set is not read. Writes the choices file.
    python benchmarks/training/train_compare.py --select [--select-epochs 2] [--select-seeds 1]
    # 2. the final run (the default): every column on all 60,000 images with its chosen
    #    settings, evaluated on the test set, --seeds 3 interleaved, --epochs 10.
    python benchmarks/training/train_compare.py [--final] [--seeds 3] [--epochs 10]

    common: [--columns a,b] [--target 0.85] [--evals-per-epoch 4] [--workers 2]
            [--choices benchmarks/training/train_compare_choices.json] [--json out.json]
            [--png benchmarks/training/train_compare.png] [--timeout 3600]
            [--limit N] [--eval-limit M]        # smoke runs: N training images, M evaluated

The paper's CNN (``models.paper_cnn``) on Fashion-MNIST, batch 32 per trainer, K = 2
trainers of one TensorFlow thread each (intra-op 1, inter-op 1, ``OMP_NUM_THREADS=1``);
the single process gets K threads. Every run of seed s starts from the same initial
weights (the paper CNN built after ``keras.utils.set_random_seed(s)``) and shuffles with
s: seeds change both the data order and the initial weights. Selection uses seeds 1001,
1002, ... (``--select-seeds``, default 1 to keep the budget sane: one seed judges each
candidate, so close candidates may swap between runs), the final run seeds 1, 2, 3.

Columns (``protocol/columns.py`` holds their framework, algorithm and grid):

keras             one process, K TF threads, Keras ``fit``'s compiled loop over all epochs
                  (``shuffle=True``). Grid: SGD momentum 0.9 with lr in {0.01, 0.03, 0.1},
                  Adam with lr in {3e-4, 1e-3, 3e-3}.
raytrain          Ray Train ``TensorflowTrainer``: ``MultiWorkerMirroredStrategy`` over K
                  workers, gradients all-reduced every step (global batch 32 x K). Needs
                  ``tf_keras`` and ``TF_USE_LEGACY_KERAS=1`` (Keras 3 fails at once,
                  ray-project/ray#47464). Grid: the 6 above, each without and with the
                  linear scaling rule (lr x K): 12.
ray, spark        the paper's Algorithm 6 as before: one round per epoch, plain average of
                  the K deltas, SGD 0.01 (no grid: the published reference). ``ray`` by
                  hand on K actors; ``spark`` as the paper's Example 3.1 on ``local[K]``.
ray-rounds        the best scheme DDLF found, written by hand on Ray with
                  ``train_on_batch`` (:func:`run_ray_rounds`, about 30 lines): rounds of
                  about 32 local steps, the averaged delta taken as a gradient by outer
                  Nesterov momentum 0.9 at rate 0.5 x K, warmed up linearly from 0.5 over
                  half an epoch's rounds. Grid: the keras 6 (the trainers' optimizer).
ddlf-default      ``train_sync`` with no scheme options. Grid: the model's own optimizer
                  (whatever ``models.paper_cnn()`` compiles when the run starts) and the 6.
ddlf-alg6         ``train_sync(rounds_per_epoch=1, outer_momentum=0, lr_scaling="none")``,
                  SGD 0.01: Algorithm 6 in DDLF (no grid).
ddlf-default@ray  ddlf-default's chosen settings with ``backend="ray"``: DDLF's scheme and
                  trainers on a local Ray instance.

Selection picks, per column, the candidate reaching ``--target`` on validation in the
least training time (median over the selection seeds), ties broken by validation
accuracy after ``--select-epochs``; candidates that diverge (NaN loss, accuracy at
chance) are marked and never chosen (``protocol/choices.py``). The final run refuses
to start without a choice for every column that has a grid, and names the command.

Evaluation. Every column with a global model is evaluated at least ``--evals-per-epoch``
E times per epoch, and the first evaluation at or above the target counts (no
interpolation): keras and raytrain between steps (a callback after steps k*S/E of each
epoch of S steps), ray-rounds and DDLF every ``R // E`` rounds (R rounds per epoch, as
``apps/schemes/sync.py`` sizes them: about 32 local steps each) and after the last.
ray, spark and ddlf-alg6 average once per epoch, so they have a global model, and an
evaluation, once per epoch; the table marks them.

What is timed (``time.perf_counter``), the same way for every column:

- ``train_s``: training time: wall time from the start of training to the end of the
  last epoch *minus the evaluation pauses*. keras, ray, ray-rounds and spark time each
  evaluation on the process that drives training and subtract it; raytrain's rank 0
  does the same inside its workers (rank 0 evaluates a local copy of the weights while
  the other worker waits at the next all-reduce); DDLF evaluates on its trainers,
  queued before their next train call, and each history row's ``eval_s`` (the slower
  trainer's) is subtracted. An evaluation point's ``train_s`` is the training time up to
  the weights it evaluated. Start-up (framework, TensorFlow, data, model) is not
  training time and is reported apart (``startup_s``).
- seconds per epoch = ``train_s / epochs``: the framework's speed.
- epochs to the target: the evaluation's epoch (fractional): the algorithm.
- time to the target: that evaluation's ``train_s``: both.

Each column-run is its own process (this script with ``--job JSON``), in a fresh
process group; the parent takes one JSON line from it, samples the process tree's CPU,
ends anything it left behind (the parent makes itself the reaper of orphaned
descendants where Linux allows) and records the 1-minute load average at its start.
Runs are interleaved: seed 1 of every column (and candidate), then seed 2, and so on.
"""

from __future__ import annotations

import os
import sys

# Before numpy loads, so its BLAS and the trainers (which inherit the environment) start
# single-threaded; each column then sets TensorFlow's own pools explicitly.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The bookkeeping package (benchmarks.protocol) is in the checkout; trainers and Ray
# workers import it too (DDLF ships the driver's sys.path; Ray's and Spark's workers
# inherit PYTHONPATH).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks import protocol  # noqa: E402
from benchmarks.protocol import COLUMNS, Job, SplitDataset  # noqa: E402

RESULT_PREFIX = "TRAIN_COMPARE_RESULT "  # Spark's JVM shares the column's stdout
DATASET = "fashion-mnist"
FASHION_SIZES = (60_000, 10_000)   # train, test: to size DDLF's rounds before the run
BATCH_SIZE = 32
EVAL_BATCH = 512
SELECT_SEED_BASE = 1000       # selection seeds 1001, 1002, ...: never the final run's
# ray-rounds: DDLF's default scheme, written by hand (apps/schemes/sync.py, rounds.py,
# outer.py, rates.py), with DDLF's own numbers so the two cannot drift apart.
from ddlf_actors.apps.schemes.rounds import STEPS_PER_ROUND, RoundOptions  # noqa: E402

OUTER_LR = RoundOptions.DEFAULTS["outer_lr"]
OUTER_MOMENTUM = RoundOptions.DEFAULTS["outer_momentum"]
OUTER_K_RULE = RoundOptions.DEFAULTS["lr_scaling"] == "outer"   # rate x K, warmed up
DEFAULT_CHOICES = os.path.join(_HERE, "train_compare_choices.json")
now = time.perf_counter


class Unavailable(Exception):
    """The column's framework is not installed here."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# -- in the column process: TensorFlow, the model, evaluation ------------------------------------


def configure_tf(threads: int):
    """Import TensorFlow with ``threads`` intra-op threads and 1 inter-op thread."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # a reused Spark worker already ran ops: the env vars held then
        pass
    return tf


def make_optimizer(spec: dict, keras_module, scale: float = 1.0):
    """The optimizer a candidate names, from ``keras_module`` (Keras 3, or tf_keras for
    Ray Train), its rate times ``scale``."""
    if spec["optimizer"] == "sgd":
        return keras_module.optimizers.SGD(learning_rate=spec["lr"] * scale,
                                           momentum=spec.get("momentum", 0.0))
    if spec["optimizer"] == "adam":
        return keras_module.optimizers.Adam(learning_rate=spec["lr"] * scale)
    raise ValueError(f"no optimizer for candidate {spec!r}")


def describe_optimizer(opt) -> str:
    """``SGD lr 0.01``, ``SGD m0.9 nesterov lr 0.03``, ``Adam lr 0.001``: what a model's
    compiled optimizer is."""
    cfg = opt.get_config()
    text = type(opt).__name__
    if cfg.get("momentum"):
        text += f" m{cfg['momentum']:g}"
    if cfg.get("nesterov"):
        text += " nesterov"
    lr = cfg.get("learning_rate")
    return f"{text} lr {float(lr):.3g}" if isinstance(lr, (int, float)) else f"{text} (schedule)"


def build_model(seed: int, spec: dict):
    """``models.paper_cnn()`` after ``keras.utils.set_random_seed(seed)``, recompiled
    with the candidate's optimizer unless it is the model's own (``"default"``): the
    loss and metrics stay what ``paper_cnn`` compiled."""
    import keras

    from ddlf_actors.apps.models import paper_cnn

    keras.utils.set_random_seed(seed)
    model = paper_cnn()
    if spec["optimizer"] != "default":
        cfg = model.get_compile_config()
        cfg["optimizer"] = keras.optimizers.serialize(make_optimizer(spec, keras))
        model.compile_from_config(cfg)
    return model


class SeededModel:
    """A picklable model_fn: :func:`build_model` for one seed and optimizer candidate, so
    DDLF's trainers (and Ray's actors) all start from the same weights."""

    def __init__(self, seed: int, spec: dict):
        self.seed, self.spec = seed, dict(spec)

    def __call__(self):
        return build_model(self.seed, self.spec)


def evaluate_arrays(model, x, y, forward=None) -> tuple[float, float]:
    """``(loss, accuracy)`` by forward passes only (no metric state touched, so it is safe
    inside ``fit``'s callbacks); the loss is the sparse categorical cross-entropy.
    ``forward(batch) -> probabilities``: ``model.predict_on_batch`` unless given."""
    forward = forward or model.predict_on_batch
    loss, hits = 0.0, 0
    for i in range(0, len(x), EVAL_BATCH):
        p = np.asarray(forward(x[i:i + EVAL_BATCH]), np.float64)
        yb = np.asarray(y[i:i + EVAL_BATCH])
        loss -= float(np.log(np.clip(p[np.arange(len(yb)), yb], 1e-12, None)).sum())
        hits += int((p.argmax(axis=1) == yb).sum())
    return loss / max(1, len(x)), hits / max(1, len(x))


class EvalClock:
    """Training time with the evaluation pauses taken out, and the evaluation points."""

    def __init__(self, column: str, eval_name: str):
        self.column, self.eval_name = column, eval_name
        self.t0 = 0.0
        self.eval_s = 0.0
        self.points: list = []

    def start(self) -> None:
        self.t0 = now()

    def train_s(self) -> float:
        return now() - self.t0 - self.eval_s

    def evaluate(self, epoch: float, fn) -> float:
        """Record ``fn() -> (loss, accuracy)`` at ``epoch``, its time not counted as
        training; return the accuracy."""
        t = now()
        train_s = t - self.t0 - self.eval_s
        loss, acc = fn()
        self.eval_s += now() - t
        self.points.append({"epoch": round(epoch, 6), "train_s": train_s,
                            "accuracy": float(acc), "loss": float(loss)})
        log(f"[{self.column}] epoch {epoch:.2f}: {train_s:.1f} s of training, "
            f"{self.eval_name} accuracy {acc:.4f}")
        return acc


def eval_steps(steps_per_epoch: int, evals: int) -> set:
    """The 1-based steps of an epoch after which to evaluate: k*S/E for k = 1..E."""
    return {max(1, round(k * steps_per_epoch / evals)) for k in range(1, evals + 1)}


def split_for(job: Job, args) -> SplitDataset:
    return SplitDataset(job.stage, DATASET, limit=args.limit, eval_limit=args.eval_limit)


def eval_name(job: Job) -> str:
    return "validation" if job.stage == "select" else "test"


def result(job: Job, args, *, startup_s: float, train_s: float, eval_s: float, points: list,
           settings: str, label: str, **extra) -> dict:
    return {"column": job.column, "status": "ok", "stage": job.stage, "seed": job.seed,
            "candidate": job.candidate, "label": label, "settings": settings,
            "startup_s": startup_s, "train_s": train_s, "eval_s": eval_s,
            "epochs_done": args.epochs, "evals": points, "eval_on": eval_name(job),
            "granularity": COLUMNS[job.column].granularity, **extra}


# -- keras: one process, fit's compiled loop -----------------------------------------------------


def run_keras(job: Job, args) -> dict:
    t0 = now()
    configure_tf(args.workers)
    import keras

    (x, y), (xe, ye) = split_for(job, args)()
    model = build_model(job.seed, job.candidate)
    label = protocol.candidate_label(job.candidate, describe_optimizer(model.optimizer))
    clock = EvalClock(job.column, eval_name(job))
    steps = math.ceil(len(x) / BATCH_SIZE)
    at = eval_steps(steps, args.evals_per_epoch)
    losses: list = []

    class EvalBetweenSteps(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in at:
                losses.append(float(logs["loss"]) if logs and "loss" in logs else None)
                clock.evaluate(self.epoch + (batch + 1) / steps,
                               lambda: evaluate_arrays(model, xe, ye))

    t_ready = now()
    clock.start()
    # One fit for every epoch: Keras's compiled loop with its own shuffle (seeded above).
    model.fit(x, y, epochs=args.epochs, batch_size=BATCH_SIZE, shuffle=True, verbose=0,
              callbacks=[EvalBetweenSteps()])
    train_s = clock.train_s()
    return result(job, args, startup_s=t_ready - t0, train_s=train_s, eval_s=clock.eval_s,
                  points=clock.points, train_losses=losses, label=label,
                  settings=f"one process, {args.workers} TF threads, fit; {label}")


# -- spark: the paper's Example 3.1, Algorithm 6 ------------------------------------------------

_LOG4J2 = """\
rootLogger.level = error
# pyspark's gateway counts as a shell: unless its logger has a level of its own, Spark
# lowers the console to WARN and says so on start-up.
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def apply_mean_delta(w: list, deltas: list) -> list:
    """``w - (1/K) sum_j delta_j``, layer by layer."""
    return [wi - sum(d[i] for d in deltas) / len(deltas) for i, wi in enumerate(w)]


def spark_worker_train(bc_model, bc_weights, batch_size: int):
    """Example 3.1's ``worker_train``: runs in a Spark Python worker, once per partition."""

    def train(rows):
        t = now()
        pairs = list(rows)  # the partition arrives as pickled (image, label) rows
        x = np.stack([p[0] for p in pairs])
        y = np.array([p[1] for p in pairs])
        configure_tf(1)
        import keras

        model_json, compile_config = bc_model.value
        model = keras.models.model_from_json(model_json)
        model.compile_from_config(compile_config)
        weights = bc_weights.value
        model.set_weights(weights)
        t_fit = now()
        model.fit(x, y, epochs=1, batch_size=batch_size, verbose=0)
        fit_s = now() - t_fit
        delta = [w - n for w, n in zip(weights, model.get_weights())]
        yield delta, {"fit_s": fit_s, "task_s": now() - t}

    return train


def _spark_context(workers: int, tmpdir: str):
    from pyspark import SparkConf, SparkContext

    # Spark puts SPARK_CONF_DIR on the JVM's classpath, where log4j2 finds this file;
    # without it Spark logs at WARN until setLogLevel, after start-up has spoken.
    with open(os.path.join(tmpdir, "log4j2.properties"), "w") as f:
        f.write(_LOG4J2)
    os.environ["SPARK_CONF_DIR"] = tmpdir
    # The executors' Python workers must use this interpreter, single-threaded TF.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    conf = (SparkConf().setMaster(f"local[{workers}]").setAppName("train_compare")
            .set("spark.driver.memory", "4g")
            .set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.local.dir", tmpdir))
    for var, value in (("OMP_NUM_THREADS", "1"), ("TF_NUM_INTRAOP_THREADS", "1"),
                       ("TF_NUM_INTEROP_THREADS", "1"), ("TF_CPP_MIN_LOG_LEVEL", "2")):
        conf.set(f"spark.executorEnv.{var}", value)
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return sc


def run_spark(job: Job, args) -> dict:
    t0 = now()
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise Unavailable(f"pyspark is not importable ({e}); pip install -e '.[bench]'")
    with tempfile.TemporaryDirectory(prefix="train_compare_spark_") as tmpdir:
        sc = _spark_context(args.workers, tmpdir)
        try:
            # The driver's TF only evaluates, between rounds, when the executors are idle.
            configure_tf(args.workers)
            (x, y), (xe, ye) = split_for(job, args)()
            model = build_model(job.seed, job.candidate)
            label = protocol.candidate_label(job.candidate)
            rng = np.random.default_rng(job.seed)
            w = model.get_weights()
            # Broadcast once, as the paper does with the model's YAML (Keras 3: JSON).
            bc_model = sc.broadcast((model.to_json(), model.get_compile_config()))
            clock = EvalClock(job.column, eval_name(job))
            fit_s = []
            t_ready = now()
            clock.start()
            for e in range(1, args.epochs + 1):
                perm = rng.permutation(len(x))
                rdd = sc.parallelize(list(zip(x[perm], y[perm])), args.workers)
                bc_w = sc.broadcast(w)
                out = rdd.mapPartitions(spark_worker_train(bc_model, bc_w, BATCH_SIZE)).collect()
                bc_w.unpersist()
                w = apply_mean_delta(w, [d for d, _ in out])
                fit_s.append(max(s["fit_s"] for _, s in out))

                def evaluate(w=w):
                    model.set_weights(w)
                    return evaluate_arrays(model, xe, ye)

                clock.evaluate(e, evaluate)
            train_s = clock.train_s()
        finally:
            sc.stop()
    return result(job, args, startup_s=t_ready - t0, train_s=train_s, eval_s=clock.eval_s,
                  points=clock.points, label=label, compute_s=sum(fit_s),
                  settings=f"Example 3.1 on local[{args.workers}]: 1 round/epoch, plain "
                           f"average; {label}")


# -- ray: Algorithm 6 by hand on K actors -------------------------------------------------------


class RayTrainer:
    """A Ray actor (``num_cpus=1``) holding the model and the whole split, loaded once."""

    def __init__(self, seed: int, spec: dict, split: SplitDataset):
        configure_tf(1)
        (self.x, self.y), (self.xe, self.ye) = split()
        self.model = build_model(seed, spec)

    def sizes(self) -> tuple[int, int]:
        return len(self.x), len(self.xe)

    def weights(self) -> list:
        return self.model.get_weights()

    def fit(self, weights, indices):
        """Algorithm 6's worker: one ``fit`` over the shuffled partition; the delta."""
        t = now()
        self.model.set_weights(weights)
        self.model.fit(self.x[indices], self.y[indices], epochs=1, batch_size=BATCH_SIZE,
                       shuffle=False, verbose=0)
        return [w - n for w, n in zip(weights, self.model.get_weights())], now() - t

    def steps(self, weights, indices):
        """ray-rounds' worker: one ``train_on_batch`` per batch (``fit`` costs ~0.2 s of
        set-up per call, which rounds of 32 steps would pay every round); the delta.
        The optimizer's state (momentum, Adam's moments) stays on the actor across
        rounds, as on DDLF's trainers."""
        t = now()
        self.model.set_weights(weights)
        for i in range(0, len(indices), BATCH_SIZE):
            b = indices[i:i + BATCH_SIZE]
            self.model.train_on_batch(self.x[b], self.y[b])
        return [w - n for w, n in zip(weights, self.model.get_weights())], now() - t

    def evaluate(self, weights, lo: int, hi: int) -> tuple[float, float]:
        self.model.set_weights(weights)
        return evaluate_arrays(self.model, self.xe[lo:hi], self.ye[lo:hi])


def _start_ray(job: Job, args):
    try:
        import ray
    except ImportError as e:
        raise Unavailable(f"ray is not importable ({e}); pip install -e '.[bench]'")
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    actor_cls = ray.remote(num_cpus=1)(RayTrainer)
    actors = [actor_cls.remote(job.seed, job.candidate, split_for(job, args))
              for _ in range(args.workers)]
    n_train, n_eval = ray.get([a.sizes.remote() for a in actors])[0]  # all built and loaded
    return ray, actors, n_train, n_eval


def _ray_evaluate(ray, actors, w, n_eval):
    """The weights' loss and accuracy, the evaluation set sharded over the actors."""
    w_ref = ray.put(w)
    bounds = np.linspace(0, n_eval, len(actors) + 1).astype(int)
    out = ray.get([a.evaluate.remote(w_ref, int(lo), int(hi))
                   for a, lo, hi in zip(actors, bounds[:-1], bounds[1:])])
    sizes = np.diff(bounds)
    return (float(np.dot(sizes, [o[0] for o in out]) / n_eval),
            float(np.dot(sizes, [o[1] for o in out]) / n_eval))


def run_ray(job: Job, args) -> dict:
    t0 = now()
    ray, actors, n, n_eval = _start_ray(job, args)
    try:
        w = ray.get(actors[0].weights.remote())
        rng = np.random.default_rng(job.seed)
        clock = EvalClock(job.column, eval_name(job))
        compute = []
        t_ready = now()
        clock.start()
        for e in range(1, args.epochs + 1):
            w_ref = ray.put(w)
            parts = np.array_split(rng.permutation(n), args.workers)
            out = ray.get([a.fit.remote(w_ref, p) for a, p in zip(actors, parts)])
            w = apply_mean_delta(w, [d for d, _ in out])
            compute.append(max(c for _, c in out))
            clock.evaluate(e, lambda w=w: _ray_evaluate(ray, actors, w, n_eval))
        train_s = clock.train_s()
    finally:
        ray.shutdown()
    label = protocol.candidate_label(job.candidate)
    return result(job, args, startup_s=t_ready - t0, train_s=train_s, eval_s=clock.eval_s,
                  points=clock.points, label=label, compute_s=sum(compute),
                  settings=f"by hand on {args.workers} Ray actors: 1 round/epoch, plain "
                           f"average; {label}")


# -- ray-rounds: DDLF's default scheme, written by hand on Ray ----------------------------------


def run_ray_rounds(job: Job, args) -> dict:
    """Rounds of ~STEPS_PER_ROUND local steps per trainer; the driver treats the mean delta
    g as a gradient: v <- mu v + g, w <- w - lr (g + mu v) (Nesterov), with DDLF's default
    mu and lr (and, when its default applies the K rule to the outer rate, lr x K after a
    linear warm-up over half an epoch's rounds), as apps/schemes/rounds.py, outer.py and
    rates.py do."""
    t0 = now()
    ray, actors, n, n_eval = _start_ray(job, args)
    K = len(actors)
    try:
        w = ray.get(actors[0].weights.remote())
        R = max(1, round(n / K / (BATCH_SIZE * STEPS_PER_ROUND)))   # rounds per epoch
        warmup, every = max(1, R // 2), max(1, R // args.evals_per_epoch)
        velocity = [np.zeros_like(a) for a in w]
        clock = EvalClock(job.column, eval_name(job))
        compute, step = [], 0
        t_ready = now()
        clock.start()
        for e in range(1, args.epochs + 1):
            perm = np.random.default_rng([job.seed, e]).permutation(n)
            for r in range(R):
                parts = np.array_split(perm[n * r // R:n * (r + 1) // R], K)
                w_ref = ray.put(w)
                out = ray.get([a.steps.remote(w_ref, p) for a, p in zip(actors, parts)])
                sizes = [len(p) for p in parts]
                g = [sum(s * d[i] for s, (d, _) in zip(sizes, out)) / sum(sizes)
                     for i in range(len(w))]
                rate = OUTER_LR * ((K if step >= warmup else 1 + (K - 1) * step / warmup)
                                   if OUTER_K_RULE else 1.0)
                velocity = [OUTER_MOMENTUM * v + gi for v, gi in zip(velocity, g)]
                w = [wi - rate * (gi + OUTER_MOMENTUM * v) for wi, gi, v in zip(w, g, velocity)]
                compute.append(max(c for _, c in out))
                step += 1
                if step % every == 0 or step == args.epochs * R:
                    clock.evaluate(e - 1 + (r + 1) / R,
                                   lambda w=w: _ray_evaluate(ray, actors, w, n_eval))
        train_s = clock.train_s()
    finally:
        ray.shutdown()
    label = protocol.candidate_label(job.candidate)
    return result(job, args, startup_s=t_ready - t0, train_s=train_s, eval_s=clock.eval_s,
                  points=clock.points, label=label, compute_s=sum(compute), rounds_per_epoch=R,
                  settings=f"by hand on {K} Ray actors: {R} rounds/epoch, outer Nesterov "
                           f"{OUTER_MOMENTUM:g} at {OUTER_LR:g}"
                           + (f" x K (warm-up {warmup} rounds)" if OUTER_K_RULE else "")
                           + f"; {label}")


# -- raytrain: Ray Train's TensorflowTrainer, gradients all-reduced every step ------------------


def tf_keras_cnn(keras2):
    """The paper CNN in tf_keras (Ray Train's TF path cannot take a Keras 3 model); its
    weights come from the Keras 3 model, so every column starts alike."""
    layers = keras2.layers
    return keras2.Sequential([
        layers.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, (3, 3), activation="relu"), layers.MaxPooling2D((2, 2)),
        layers.Conv2D(64, (3, 3), activation="relu"), layers.Flatten(),
        layers.Dense(64, activation="relu"), layers.Dense(10, activation="softmax")])


def raytrain_loop(config: dict) -> None:
    """Runs on each Ray Train worker: ``fit`` one epoch at a time under
    MultiWorkerMirroredStrategy; rank 0 evaluates a local copy of the weights after
    steps k*S/E of each epoch (the other worker waits at the next all-reduce), times it
    apart, and writes every point to ``config["out"]``."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from ray import train as ray_train

    ctx = ray_train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    (x, y), (xe, ye) = config["split"]()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras2 = tf.keras   # tf_keras, with TF_USE_LEGACY_KERAS=1
    spec = config["candidate"]
    scale = world if spec.get("scale_lr") else 1
    with strategy.scope():
        model = tf_keras_cnn(keras2)
        model.compile(optimizer=make_optimizer(spec, keras2, scale),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.set_weights(config["weights"])
    local = tf_keras_cnn(keras2)   # rank 0 evaluates on this, outside the strategy
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    rng = np.random.default_rng(config["seed"])
    steps = math.ceil(len(x) / (BATCH_SIZE * world))
    at = eval_steps(steps, config["evals"])
    clock = {"t0": 0.0, "eval_s": 0.0, "epoch": 0}

    class EvalBetweenSteps(keras2.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if rank != 0 or batch + 1 not in at:
                return
            t = now()
            train_s = t - clock["t0"] - clock["eval_s"]
            local.set_weights(self.model.get_weights())
            # A direct call, not predict: tf_keras's predict under this strategy gathers
            # across workers, and the other worker is not evaluating.
            loss, acc = evaluate_arrays(local, xe, ye,
                                        lambda b: local(b, training=False).numpy())
            clock["eval_s"] += now() - t
            with open(config["out"], "a") as f:
                f.write(json.dumps({"epoch": clock["epoch"] + (batch + 1) / steps,
                                    "train_s": train_s, "accuracy": acc, "loss": loss,
                                    "train_loss": float(logs.get("loss", float("nan")))
                                    if logs else None}) + "\n")

    clock["t0"] = now()
    for e in range(config["epochs"]):
        clock["epoch"] = e
        # The same shuffle on every worker; DATA sharding gives each 1/world of each
        # global batch (32 per worker), so gradients are all-reduced over 32 * world.
        perm = rng.permutation(len(x))
        data = tf.data.Dataset.from_tensor_slices((x[perm], y[perm])).batch(BATCH_SIZE * world)
        model.fit(data.with_options(options), epochs=1, verbose=0,
                  callbacks=[EvalBetweenSteps()])
        ray_train.report({"epoch": e + 1})
    if rank == 0:
        with open(config["out"], "a") as f:
            f.write(json.dumps({"done": True, "train_s": now() - clock["t0"] - clock["eval_s"],
                                "eval_s": clock["eval_s"]}) + "\n")


def run_raytrain(job: Job, args) -> dict:
    t0 = now()
    try:
        import ray
        import tf_keras  # noqa: F401 - Ray Train's TF path needs Keras 2 (ray-project/ray#47464)
        from ray.train import RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer
    except ImportError as e:
        raise Unavailable(f"Ray Train with tf_keras is not importable ({e}); pip install "
                          "'ray[train]' and, without its dependencies (it names tensorflow, "
                          "not tensorflow-cpu), tf_keras matching TensorFlow's version")
    configure_tf(1)
    weights = build_model(job.seed, protocol.ALG6_SGD).get_weights()  # Keras 3: the start
    env = {"TF_USE_LEGACY_KERAS": "1", "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.environ["PYTHONPATH"]}
    if os.environ.get("DDLF_DATA_DIR"):
        env["DDLF_DATA_DIR"] = os.environ["DDLF_DATA_DIR"]
    with tempfile.TemporaryDirectory(prefix="train_compare_raytrain_") as tmpdir:
        out = os.path.join(tmpdir, "points.jsonl")
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", runtime_env={"env_vars": env})
        try:
            trainer = TensorflowTrainer(
                raytrain_loop,
                train_loop_config={"weights": weights, "epochs": args.epochs, "out": out,
                                   "seed": job.seed, "candidate": job.candidate,
                                   "split": split_for(job, args),
                                   "evals": args.evals_per_epoch},
                scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False,
                                             resources_per_worker={"CPU": 1}),
                run_config=RunConfig(storage_path=tmpdir, name="raytrain"))
            trainer.fit()
            t_end = now()
        finally:
            ray.shutdown()
        with open(out) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    done = [r for r in rows if r.get("done")]
    points = [{k: r[k] for k in ("epoch", "train_s", "accuracy", "loss")}
              for r in rows if not r.get("done")]
    for p in points:
        log(f"[raytrain] epoch {p['epoch']:.2f}: {p['train_s']:.1f} s of training, "
            f"{eval_name(job)} accuracy {p['accuracy']:.4f}")
    if not done:
        raise RuntimeError("Ray Train's rank 0 wrote no final line: training did not finish")
    train_s, eval_s = done[0]["train_s"], done[0]["eval_s"]
    label = protocol.candidate_label(job.candidate)
    # Start-up: everything before the first step (ray.init, the workers, TF, the data, the
    # strategy's collectives), measured from outside the workers.
    return result(job, args, startup_s=(t_end - t0) - train_s - eval_s, train_s=train_s,
                  eval_s=eval_s, points=points, label=label,
                  train_losses=[r.get("train_loss") for r in rows if not r.get("done")],
                  settings=f"TensorflowTrainer, {args.workers} workers, all-reduce every "
                           f"step (global batch {BATCH_SIZE} x {args.workers}); {label}")


# -- DDLF -----------------------------------------------------------------------------------------

# Scheme-level options of DDLF's columns (train_sync's keywords; the rest are the defaults).
DDLF_OPTIONS = {
    "ddlf-default": {},
    "ddlf-default@ray": {},
    # The paper's Algorithm 6: one round per epoch, a plain average.
    "ddlf-alg6": {"rounds_per_epoch": 1, "outer_momentum": 0.0, "lr_scaling": "none"},
}


def sync_default_rounds(n_train: int, workers: int) -> int:
    """Rounds per epoch as sync sizes them when left out (``rounds.default_rounds``);
    checked against the run's own options after it."""
    from ddlf_actors.apps.schemes.rounds import default_rounds

    return default_rounds(n_train / workers, BATCH_SIZE)


def describe_settings(cfg) -> str:
    """A sync run's scheme-level settings, as the run resolved them."""
    text = f"{cfg.rounds_per_epoch} round{'' if cfg.rounds_per_epoch == 1 else 's'}/epoch"
    lr = cfg.outer_lr if isinstance(cfg.outer_lr, (int, float)) else "schedule"
    if cfg.lr_scaling == "outer":
        text += f", outer lr {lr} x K (warm-up {cfg.warmup_rounds} rounds)"
    elif lr != 1.0:
        text += f", outer lr {lr}"
    if cfg.outer_momentum:
        text += f", {'Nesterov' if cfg.nesterov else 'momentum'} {cfg.outer_momentum:g}"
    if cfg.lr_scaling == "inner":
        text += f", trainers' lr x K (warm-up {cfg.warmup_rounds} rounds)"
    if cfg.lr_scaling == "none" and not cfg.outer_momentum and lr == 1.0:
        text += ", plain average"
    return text


def run_ddlf(job: Job, args) -> dict:
    t0 = now()
    try:
        import ddlf_actors as ddlf
        from ddlf_actors.apps import train_sync
    except ImportError as e:
        raise Unavailable(f"ddlf_actors.apps is not importable ({e})")
    backend = "ray" if job.column.endswith("@ray") else "ddlf"
    if backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"ray is not importable ({e}); pip install -e '.[ray]'")
    options = dict(DDLF_OPTIONS[job.column])
    n_train = len(protocol.split_indices(job.stage, *FASHION_SIZES, limit=args.limit).train)
    R = options.get("rounds_per_epoch") or sync_default_rounds(n_train, args.workers)
    if R > 1:
        options["eval_every"] = max(1, R // args.evals_per_epoch)
    # backend="ray": a local Ray instance with K CPUs; the scheme places its trainers there.
    ddlf.init(num_cpus=args.workers, backend=backend)
    try:
        t_call = now()
        r = train_sync(SeededModel(job.seed, job.candidate), split_for(job, args),
                       workers=args.workers, master_epochs=args.epochs, batch_size=BATCH_SIZE,
                       progress=False, seed=job.seed, **options)
    finally:
        ddlf.shutdown()
    points, train_s, eval_s = protocol.ddlf_points(r.history, r.startup_s)
    notes = []
    if r.options.rounds_per_epoch != R:
        notes.append(f"the run used {r.options.rounds_per_epoch} rounds/epoch, not the {R} "
                     "this script computed: sync's default changed; evaluations per epoch "
                     "are as measured")
    default = None
    if job.candidate.get("optimizer") == "default":
        # After training (not timed): the model's own optimizer, as paper_cnn compiles it now.
        configure_tf(1)
        default = describe_optimizer(build_model(job.seed, job.candidate).optimizer)
    label = protocol.candidate_label(job.candidate, default)
    settings = describe_settings(r.options) + ("" if backend == "ddlf" else ", on Ray") \
        + f"; {label}"
    for p in points:
        log(f"[{job.column}] epoch {p['epoch']:.2f}: {p['train_s']:.1f} s of training, "
            f"{eval_name(job)} accuracy {p['accuracy']:.4f}")
    for n in notes:
        log(f"[{job.column}] note: {n}")
    return result(job, args, startup_s=t_call - t0 + r.startup_s, train_s=train_s,
                  eval_s=eval_s, points=points, label=label, settings=settings,
                  train_losses=[row.get("train_loss") for row in r.history],
                  compute_s=sum(row.get("compute_s", 0.0) for row in r.history),
                  overhead_s=sum(row.get("overhead_s", 0.0) for row in r.history),
                  rounds_per_epoch=r.options.rounds_per_epoch, notes=notes,
                  model_default=default)


RUNNERS = {
    "keras": run_keras,
    "raytrain": run_raytrain,
    "ray": run_ray,
    "spark": run_spark,
    "ray-rounds": run_ray_rounds,
    "ddlf-default": run_ddlf,
    "ddlf-alg6": run_ddlf,
    "ddlf-default@ray": run_ddlf,
}


def column_main(spec: dict) -> None:
    """In the column-run's own process: run it, print one result line."""
    job = Job.from_json(spec["job"])
    args = argparse.Namespace(**spec["settings"])
    try:
        out = RUNNERS[job.column](job, args)
    except Unavailable as e:
        out = {"status": "unavailable", "reason": str(e)}
    except Exception as e:
        traceback.print_exc()
        out = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    out = {"column": job.column, "stage": job.stage, "seed": job.seed,
           "candidate": job.candidate, **out}
    print(RESULT_PREFIX + json.dumps(out), flush=True)


# -- the parent: one process tree per column-run ------------------------------------------------

def _become_subreaper() -> bool:
    """Make orphaned descendants (Ray's daemons, Spark's JVM) our children, so that
    nothing a column started can outlive this script unseen. Linux only."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


class ProcessTree:
    """Every process this script started: the column, its descendants, and orphans that
    Linux re-parents to us (see ``_become_subreaper``), each with the CPU time it had
    used when last sampled.

    Sampling, not ``RUSAGE_CHILDREN``: Ray's raylet ignores SIGCHLD, so its workers are
    reaped by the kernel and their CPU time is never added to any parent's total.
    A process that ends between two samples loses at most one interval of CPU time.
    """

    def __init__(self):
        self.procs: dict = {}  # (pid, create_time) -> psutil.Process
        self.cpu: dict = {}  # (pid, create_time) -> user + system CPU s when last seen

    def sample(self) -> None:
        import psutil

        for p in psutil.Process().children(recursive=True):
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()  # a zombie still reports its final figures
            except psutil.Error:
                continue
            self.procs[key] = p
            self.cpu[key] = t.user + t.system

    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    def running(self) -> list:
        """Processes not yet reaped (zombies included: they wait for us to reap them)."""
        return [p for p in self.procs.values() if p.is_running()]

    def wait(self, timeout: float) -> list:
        """Reap what exits within ``timeout`` s, sampling meanwhile; return the rest."""
        import psutil

        deadline = now() + timeout
        while True:
            self.sample()
            _, alive = psutil.wait_procs(self.running(), timeout=0)
            if not alive or now() >= deadline:
                return alive
            time.sleep(0.2)

    def end_leftovers(self, grace: float = 10.0) -> list[str]:
        """Give the column's processes ``grace`` s to exit, then SIGTERM and SIGKILL the
        rest; return the names of those we had to end."""
        ended = []
        for i, alive in enumerate((self.wait(grace), self.wait(5))):
            for p in alive:
                try:
                    if i == 0:
                        ended.append(f"{p.name()} ({p.pid})")
                        p.terminate()
                    else:
                        p.kill()
                except Exception:  # gone meanwhile
                    pass
        self.wait(5)
        return ended


def _kill_group(proc) -> None:
    """SIGTERM, then SIGKILL, the process group we started the column in."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores, all processes)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _wait_column(proc, tree: ProcessTree, timeout: float):
    """Wait for the column process, sampling its tree; return an error status or None."""
    import psutil

    started = now()
    column = psutil.Process(proc.pid)
    # Sample before reaping: the column's own final CPU time is readable while it is a
    # zombie, and gone once ``poll`` reaps it.
    while column.status() != psutil.STATUS_ZOMBIE:
        if now() - started > timeout:
            tree.sample()
            _kill_group(proc)
            return f"timed out after {timeout:g} s"
        tree.sample()
        time.sleep(0.5)
    tree.sample()
    proc.wait()
    return None




def run_job(job: Job, settings: dict, timeout: float) -> dict:
    """Run one column-run in a fresh process group; return its result with the 1-minute
    load average at its start, its wall time, and ``other_cpu_s``: the CPU other
    processes took from the machine meanwhile."""
    spec = json.dumps({"job": job.to_json(), "settings": settings})
    cmd = [sys.executable, os.path.abspath(__file__), "--job", spec]
    load = load_average()
    log(f"== seed {job.seed} {job.column} {protocol.candidate_label(job.candidate)} "
        f"({job.stage}, load {load if load is None else round(load, 2)})")
    tree = ProcessTree()
    busy0 = _busy_cpu_s()
    started = now()
    with tempfile.TemporaryFile("w+") as out:
        # stdout to a file, not a pipe: a daemon holding the pipe open would block us.
        proc = subprocess.Popen(cmd, stdout=out, stderr=None, start_new_session=True)
        try:
            error = _wait_column(proc, tree, timeout)
        except BaseException:  # Ctrl-C: the column is in its own session, end it here
            _kill_group(proc)
            tree.end_leftovers(grace=0)
            raise
        ended = tree.end_leftovers()
        out.seek(0)
        res = _parse_result(out.read(), job, proc.returncode)
    if error:
        res = {"column": job.column, "stage": job.stage, "seed": job.seed,
               "candidate": job.candidate, "status": "error", "reason": error}
    res["load_1min"] = load
    res["process_s"] = now() - started
    res["other_cpu_s"] = max(0.0, _busy_cpu_s() - busy0 - tree.cpu_s())
    if ended:
        res["ended_leftovers"] = ended
        log(f"== {job.column}: ended processes left behind: {', '.join(ended)}")
    return res


def _parse_result(stdout: str, job: Job, returncode) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"column": job.column, "stage": job.stage, "seed": job.seed,
            "candidate": job.candidate, "status": "error",
            "reason": f"no result line (exit code {returncode}; see stderr above)"}


def one_line(r: dict, target: float) -> str:
    """A column-run as the log shows it when it ends, load average beside it."""
    head = (f"seed {r['seed']:>4} {r['column']:<17} {protocol.candidate_label(r['candidate']):<22} "
            f"load {r.get('load_1min') or 0:5.2f}")
    if r.get("status") != "ok":
        return f"{head}  {r.get('status')}: {r.get('reason', '')}"
    m = protocol.metrics(r, target)
    hit = "never" if m["time_to_target"] is None else \
        f"epoch {m['epochs_to_target']:.2f} / {m['time_to_target']:.1f} s"
    acc = "-" if m["final_accuracy"] is None else f"{m['final_accuracy']:.4f}"
    return (f"{head}  {m['s_per_epoch']:6.1f} s/epoch, {target} at {hit}, "
            f"{r['eval_on']} acc {acc}, start-up {r['startup_s']:.1f} s")


# -- the two stages -------------------------------------------------------------------------------


def plan(args) -> list[Job]:
    """The interleaved column-runs of this invocation. Raises ``ChoicesMissing`` (final
    run) when a column with a grid has no choice."""
    if args.select:
        candidates = {c: COLUMNS[c].grid for c in args.columns if COLUMNS[c].chooses}
        seeds = [SELECT_SEED_BASE + i for i in range(1, args.select_seeds + 1)]
        return protocol.interleave("select", args.columns, seeds, candidates)
    needs = list(dict.fromkeys(COLUMNS[c].choice_from or c for c in args.columns
                               if COLUMNS[c].chooses or COLUMNS[c].choice_from))
    chosen = protocol.read_choices(args.choices, needs)
    candidates = {c: [chosen[COLUMNS[c].choice_from or c]] if c in chosen or
                  COLUMNS[c].choice_from else [COLUMNS[c].fixed] for c in args.columns}
    return protocol.interleave("final", args.columns, range(1, args.seeds + 1), candidates)


def run_select(args, jobs: list, settings: dict) -> dict:
    results = []
    for job in jobs:
        results.append(run_job(job, settings, args.timeout))
        log("== " + one_line(results[-1], args.target))
    tables: dict = {}
    for c in args.columns:
        if not COLUMNS[c].chooses:
            why = COLUMNS[c].no_grid
            print(f"{c}: no selection ({why})")
            continue
        rows = []
        for cand in COLUMNS[c].grid:
            runs = [r for r in results if r["column"] == c and r["candidate"] == cand]
            row = protocol.candidate_row(cand, runs, args.target)
            ok = [r for r in runs if r.get("status") == "ok"]
            row["label"] = ok[0]["label"] if ok else protocol.candidate_label(cand)
            rows.append(row)
        tables[c] = rows
    meta = {"target": args.target, "select_epochs": args.select_epochs,
            "select_seeds": [SELECT_SEED_BASE + i for i in range(1, args.select_seeds + 1)],
            "evals_per_epoch": args.evals_per_epoch, "limit": args.limit,
            "eval_limit": args.eval_limit, "workers": args.workers,
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    doc = protocol.write_choices(args.choices, tables, meta)
    for c, rows in tables.items():
        print()
        print(protocol.selection_table(c, rows, args.target, args.select_epochs))
    print(f"\nwrote {args.choices}")
    return {"stage": "select", "meta": meta, "choices": doc, "runs": results}


def run_final(args, jobs: list, settings: dict) -> dict:
    chosen_labels = {}
    if args.choices and os.path.exists(args.choices):
        with open(args.choices) as f:
            doc = json.load(f)
        for c, entry in doc.get("columns", {}).items():
            chosen_labels[c] = next((r.get("label") for r in entry.get("selection", ())
                                     if r.get("chosen")), None)
            if c in args.columns and entry.get("limit"):
                print(f"note: {c}'s choice was selected with --limit {entry['limit']} "
                      "(a smoke run), not on the full split")
    results = []
    for job in jobs:
        results.append(run_job(job, settings, args.timeout))
        log("== " + one_line(results[-1], args.target))
        # "model default" is read when the run starts: say so if the model changed since.
        r, src = results[-1], COLUMNS[job.column].choice_from or job.column
        if (job.candidate == protocol.MODEL_DEFAULT and r.get("status") == "ok"
                and chosen_labels.get(src) and r.get("label") != chosen_labels[src]):
            print(f"note: {job.column} seed {job.seed} ran {r['label']}, but selection chose "
                  f"{chosen_labels[src]}: models.paper_cnn's optimizer changed since --select")
    rows = protocol.headline_rows(results, args.target)
    eval_on = "validation" if args.select else "test"
    print(f"\nTime to {eval_on} accuracy {args.target}: Fashion-MNIST, paper CNN, batch "
          f"{BATCH_SIZE}/trainer, K = {args.workers}, {args.epochs} epochs, seeds "
          f"1-{args.seeds} interleaved; {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}"
          + (f"; --limit {args.limit} training images" if args.limit else "")
          + (f", {args.eval_limit} evaluated" if args.eval_limit else ""))
    print(protocol.headline_table(rows, args.target, args.epochs, eval_on))
    ratios = protocol.ratio_lines(rows, args.target)
    if ratios:
        print()
        print(ratios)
    summary = {c: {k: (v.to_json() if hasattr(v, "to_json") else v) for k, v in col.items()
                   if k != "runs"} for c, col in rows.items()}
    return {"stage": "final", "runs": results, "summary": summary}


def write_png(results: list, path: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    colors: dict = {}
    for r in results:
        if r.get("status") != "ok" or not r["evals"]:
            continue
        color = colors.setdefault(r["column"], f"C{len(colors)}")
        ax.plot([p["train_s"] for p in r["evals"]], [p["accuracy"] for p in r["evals"]],
                marker=".", color=color, alpha=0.8,
                label=r["column"] if r["column"] not in ax.get_legend_handles_labels()[1]
                else None)
    ax.axhline(target, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training time, s (start-up and evaluation excluded)")
    ax.set_ylabel(f"{results[0].get('eval_on', 'test') if results else 'test'} accuracy")
    accs = [p["accuracy"] for r in results if r.get("status") == "ok" for p in r["evals"]]
    ax.set_ylim(max(0.0, min([target - 0.25, *(a - 0.02 for a in accs)])), 1.0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Fashion-MNIST, paper CNN: every seed of every column")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line -------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    stage = p.add_mutually_exclusive_group()
    stage.add_argument("--select", action="store_true",
                       help="run each column's grid on the validation split and write the "
                            "choices file")
    stage.add_argument("--final", action="store_true",
                       help="(the default) every column with its chosen settings, on test")
    p.add_argument("--columns", default=",".join(protocol.COLUMN_NAMES),
                   help=f"comma-separated, in this order (default all: "
                        f"{','.join(protocol.COLUMN_NAMES)})")
    p.add_argument("--choices", default=DEFAULT_CHOICES,
                   help="the choices file --select writes and the final run reads")
    p.add_argument("--target", type=float, default=0.85, help="accuracy target (0.85)")
    p.add_argument("--epochs", type=int, default=10, help="final run's epochs (10)")
    p.add_argument("--seeds", type=int, default=3, help="final run's seeds, 1..N (3)")
    p.add_argument("--select-epochs", type=int, default=2, help="selection epochs (2)")
    p.add_argument("--select-seeds", type=int, default=1,
                   help="selection seeds (1, to keep the budget sane: 31 candidate runs)")
    p.add_argument("--evals-per-epoch", type=int, default=4,
                   help="evaluations per epoch where a global model exists (4)")
    p.add_argument("--workers", type=int, default=2, help="trainers K (2)")
    p.add_argument("--limit", type=int, help="smoke runs: train on the first N images only")
    p.add_argument("--eval-limit", type=int,
                   help="smoke runs: evaluate on the first M images only (default: all, or "
                        "1000 with --limit)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per column-run")
    p.add_argument("--data-dir", help="sets DDLF_DATA_DIR for the columns")
    p.add_argument("--png", default=os.path.join(_HERE, "train_compare.png"),
                   help="final run: accuracy against training time ('' to skip)")
    p.add_argument("--json", help="also write every column-run's result here")
    p.add_argument("--job", help=argparse.SUPPRESS)  # internal: one column-run
    args = p.parse_args(argv)
    if args.job:
        return args
    args.columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = protocol.unknown_columns(args.columns)
    if unknown:
        p.error(f"unknown column(s) {unknown}; choose from {','.join(protocol.COLUMN_NAMES)}")
    for name in ("epochs", "seeds", "select_epochs", "select_seeds", "evals_per_epoch",
                 "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.target <= 1:
        p.error("--target must be in (0, 1]")
    if args.limit is not None and args.eval_limit is None:
        args.eval_limit = 1000
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.data_dir:
        os.environ["DDLF_DATA_DIR"] = os.path.abspath(args.data_dir)
    if args.job:
        column_main(json.loads(args.job))
        return
    try:
        jobs = plan(args)
    except protocol.ChoicesMissing as e:
        sys.exit(f"train_compare: {e}")
    settings = {"epochs": args.select_epochs if args.select else args.epochs,
                "workers": args.workers, "evals_per_epoch": args.evals_per_epoch,
                "limit": args.limit, "eval_limit": args.eval_limit}
    _become_subreaper()
    t, load_before = now(), os.getloadavg()
    log(f"== {len(jobs)} column-runs ({'select' if args.select else 'final'}), load average "
        f"{load_before[0]:.2f}")
    out = run_select(args, jobs, settings) if args.select else run_final(args, jobs, settings)
    load_after = os.getloadavg()
    print(f"(total {now() - t:.0f} s; load average before {load_before[0]:.2f}, after "
          f"{load_after[0]:.2f})")
    if args.png and not args.select:
        write_png(out["runs"], args.png, args.target)
        log(f"wrote {args.png}")
    if args.json:
        out.update({"settings": settings, "target": args.target, "cpus": os.cpu_count(),
                    "python": platform.python_version(), "load_before": load_before,
                    "load_after": load_after})
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
