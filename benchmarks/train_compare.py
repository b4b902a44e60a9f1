"""The DDLF paper's headline experiment (its Table 4.3), every column in one run.

    python benchmarks/train_compare.py [--epochs 2] [--columns keras,spark,ray,ddlf-sync,ddlf-async,
                                                      ddlf-sync@ray,ddlf-async@ray]
                                       [--timeout 900] [--png benchmarks/train_compare.png]
                                       [--json out.json] [--data-dir DIR] [--seed 0]
    python benchmarks/train_compare.py --epochs 10 --target 0.85     # time to accuracy

The paper's CNN (``ddlf_actors.apps.models.paper_cnn``: SGD 0.01, batch 32) on
Fashion-MNIST (60k/10k), K = 2 trainers with one TensorFlow thread each (intra-op 1,
inter-op 1, ``OMP_NUM_THREADS=1``), one worker epoch per round, M master epochs:

keras       one process, ``model.fit`` one epoch at a time, TF intra-op K threads.
spark       the paper's Example 3.1 on pyspark ``local[K]``: every round the driver shuffles
            the data, ``parallelize``s it into K partitions and broadcasts the weights;
            each partition rebuilds the model from JSON, trains one epoch and returns
            its delta; the driver applies ``w -= mean(delta)``.
ray         the same synchronous scheme by hand on K Ray actors (``num_cpus=1``) that
            build the model and load the data once; each round the driver ``ray.put``s
            the weights and sends each actor its shuffled index partition.
raytrain    Ray Train's ``TensorflowTrainer`` (what a Ray user would pick instead of writing
            the loop): ``MultiWorkerMirroredStrategy`` over K workers, gradients
            all-reduced every step (per-worker batch 32). It needs ``tf_keras`` and
            ``TF_USE_LEGACY_KERAS=1``: with Keras 3 it fails at once (ray-project/ray#47464).
ddlf-sync   ``ddlf_actors.apps.train_sync`` as the paper's Algorithm 6: one round per
            epoch, plain average (``rounds_per_epoch=1``, no outer momentum).
ddlf-rounds the same averaging rounds as the default, plain average: the rounds alone.
ddlf-default ``train_sync`` with no scheme options (``ddlf-train run``'s defaults).
ddlf-async  ``train_async`` (Algorithm 3); ddlf-easgd, ddlf-downpour: those schemes with
            their defaults (``train(..., scheme=...)``).
ddlf-sync@ray, ddlf-async@ray
            ddlf-sync and ddlf-async with ``backend="ray"``: DDLF's schemes and trainers on
            Ray actors (``ddlf.init(backend="ray", num_cpus=K)``: a local Ray instance),
            what a team with a Ray cluster would run. Against ``ray`` it is DDLF's scheme
            against the hand-written one on the same runtime; against ``ddlf-sync`` the
            same scheme on the two runtimes.

Every column starts from the same initial weights (the paper CNN built after
``keras.utils.set_random_seed(seed)``; Ray Train's tf_keras model is given them) and
trains with the same optimizer (SGD 0.01) and batch (32 per trainer): only the scheme
differs.

``--target A`` adds the time-to-accuracy table: for each column, the first epoch whose
test accuracy is at least A, the training time to the end of it (evaluation excluded, as
in the table above; every column evaluates once per epoch), the same with the
evaluations' time included, and the accuracy after the last epoch. Its default columns
are the time-to-accuracy set (all of the above).

Each column runs in its own process (this script with ``--column NAME``), one after
another, so no two share the cores; the parent collects one JSON line from each, prints
a table and ratios, and draws accuracy against time.

What is timed (seconds, ``time.perf_counter``):

- ``startup_s``: from the column's start (before the framework or TensorFlow is
  imported) until the trainers (or the model) are built and have the data.
- ``train_s``: training time, the sum of the round times (shuffle, shipping weights and
  data, fitting, averaging). For keras, spark and ray the test-set evaluation after
  each epoch runs *between* rounds and is reported apart as ``eval_s``: keras in its
  process, spark on the driver (the driver holds the model, as in Example 3.1), ray
  sharded over its actors (half the test set each, in parallel, as DDLF does).
  DDLF evaluates each epoch's weights sharded on its trainers, queued right before the
  next round's training; each history row reports that time (``eval_s``, the slower
  trainer's), and it is taken out of DDLF's ``train_s`` the same way. DDLF's rows also
  give ``overhead_s``: round time beyond the busier trainer's training and evaluation.
- ``epochs[i].time_s``: ``train_s`` up to the end of epoch i.
- ``total_s``: wall clock from the column's start to the end of the last round:
  start-up, training and the evaluations between epochs (not the last one, nor shutdown).
- ``compute_s``: per round, the slowest trainer's time inside its training call, summed
  (spark: the slowest task's ``fit``; keras: ``train_s``). ``train_s - compute_s`` is
  what the framework costs on top of the work.

A column that cannot run here (package not installed) is reported as
``unavailable: <reason>``; one that fails or runs past ``--timeout`` as ``error``.
Every process a column starts is ended with it: Spark's JVM and Ray's daemons by their
own shutdown, and anything left over (or the whole process group on timeout) by the
parent, which makes itself the reaper of orphaned descendants where Linux allows.
"""

from __future__ import annotations

import os

# Before numpy loads, so its BLAS and the trainers (which inherit the environment) start
# single-threaded; each column then sets TensorFlow's own pools explicitly.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

# The paper's Table 4.3 (the default set) and the time-to-accuracy set (--target).
TABLE_COLUMNS = ("keras", "spark", "ray", "ddlf-sync", "ddlf-async")
TARGET_COLUMNS = ("keras", "spark", "ray", "raytrain", "ddlf-sync", "ddlf-rounds",
                  "ddlf-default", "ddlf-allreduce", "ddlf-async", "ddlf-easgd", "ddlf-downpour")
# DDLF's schemes on Ray (backend="ray"): a column name with "@ray".
RAY_BACKEND_COLUMNS = ("ddlf-sync@ray", "ddlf-async@ray")
ALL_COLUMNS = tuple(dict.fromkeys(TABLE_COLUMNS + TARGET_COLUMNS + RAY_BACKEND_COLUMNS))
# DDLF's columns: (scheme, scheme-level options). Only scheme-level settings differ: the
# model, its optimizer (SGD 0.01) and the batch (32) are the same in every column.
DDLF_COLUMNS = {
    # The paper's Algorithm 6: one round per epoch, plain average (DDLF's first default).
    "ddlf-sync": ("sync", dict(rounds_per_epoch=1, outer_momentum=0.0, lr_scaling="none")),
    # Averaging as often as the default does, but plainly: what the rounds alone give.
    "ddlf-rounds": ("sync", dict(outer_momentum=0.0, lr_scaling="none")),
    # train_sync / ddlf-train run with no scheme options.
    "ddlf-default": ("sync", {}),
    # The same settings, the trainers averaging among themselves over a ring.
    "ddlf-allreduce": ("allreduce", {}),
    "ddlf-async": ("async", {}),
    "ddlf-easgd": ("easgd", {}),
    "ddlf-downpour": ("downpour", {}),
}
RESULT_PREFIX = "TRAIN_COMPARE_RESULT "  # Spark's JVM shares the column's stdout
DATASET = "fashion-mnist"
BATCH_SIZE = 32
WORKER_EPOCHS = 1
EVAL_BATCH = 512
now = time.perf_counter


class Unavailable(Exception):
    """The column's framework is not installed here."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- data and TensorFlow (run in the column processes, and in Spark and Ray workers) -------------


def load_data():
    """``((x, y), (x_test, y_test))``: float32 NHWC ``x / 255 - 0.5`` and int64 labels."""
    try:
        from ddlf_actors.apps import datasets
    except ImportError:  # ddlf_actors.apps not landed: read the IDX files ourselves
        return _load_idx_dir(os.environ.get("DDLF_DATA_DIR", ""))
    return datasets.load(DATASET)


def _load_idx_dir(directory: str):
    def read(name):
        with gzip.open(os.path.join(directory, name + ".gz"), "rb") as f:
            raw = f.read()
        ndim = raw[3]
        shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
        return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)

    def images(name):
        return (read(name)[..., None].astype(np.float32) / 255.0 - 0.5).astype(np.float32)

    def labels(name):
        return read(name).astype(np.int64)

    return ((images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte")),
            (images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte")))


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


def build_model(seed: int):
    import keras

    from ddlf_actors.apps.models import paper_cnn

    keras.utils.set_random_seed(seed)
    return paper_cnn()


def evaluate(model, x, y) -> tuple[float, float]:
    out = model.evaluate(x, y, batch_size=EVAL_BATCH, verbose=0, return_dict=True)
    return float(out["loss"]), float(out["accuracy"])


def apply_mean_delta(w: list, deltas: list) -> list:
    """``w - (1/K) sum_j delta_j``, layer by layer."""
    return [wi - sum(d[i] for d in deltas) / len(deltas) for i, wi in enumerate(w)]


# -- the epoch loop the baselines share ---------------------------------------------------------


@dataclasses.dataclass
class Timeline:
    """Training and evaluation times of a run, and one row per epoch."""

    rows: list = dataclasses.field(default_factory=list)
    train_s: float = 0.0
    eval_s: float = 0.0
    last_train_end: float = 0.0


def run_epochs(column: str, epochs: int, train_epoch, evaluate_now,
               stop_at: float | None = None) -> Timeline:
    """``train_epoch(e)`` then ``evaluate_now() -> (loss, acc)`` for each epoch; only the
    former counts as training time (see the module docstring). With ``stop_at``, stop
    after the first epoch whose test accuracy reaches it."""
    tl = Timeline()
    for e in range(1, epochs + 1):
        t = now()
        train_epoch(e)
        tl.last_train_end = now()
        tl.train_s += tl.last_train_end - t
        t = now()
        loss, acc = evaluate_now()
        tl.eval_s += now() - t
        tl.rows.append({"epoch": e, "time_s": tl.train_s, "test_accuracy": acc,
                        "test_loss": loss})
        log(f"[{column}] epoch {e}: {tl.train_s:.1f} s of training, test accuracy {acc:.4f}")
        if stop_at is not None and acc >= stop_at:
            break
    return tl


def ok_result(column: str, t0: float, t_ready: float, tl: Timeline, compute_s, **extra) -> dict:
    return {"column": column, "status": "ok", "startup_s": t_ready - t0, "epochs": tl.rows,
            "train_s": tl.train_s, "eval_s": tl.eval_s, "total_s": tl.last_train_end - t0,
            "compute_s": compute_s, **extra}


# -- (a) keras ----------------------------------------------------------------------------------


def run_keras(args) -> dict:
    t0 = now()
    configure_tf(args.workers)
    (x, y), (x_test, y_test) = load_data()
    model = build_model(args.seed)
    t_ready = now()

    def train_epoch(_e):
        model.fit(x, y, epochs=1, batch_size=BATCH_SIZE, shuffle=True, verbose=0)

    tl = run_epochs("keras", args.epochs, train_epoch, lambda: evaluate(model, x_test, y_test),
                    args.stop_at)
    return ok_result("keras", t0, t_ready, tl, tl.train_s, threads=args.workers,
                     settings=f"one process, {args.workers} TF threads")


# -- (b) spark: the paper's Example 3.1 ---------------------------------------------------------

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


def spark_worker_train(bc_model, bc_weights, epochs: int, batch_size: int):
    """Example 3.1's ``worker_train``: runs in a Spark Python worker, once per partition."""

    def train(rows):
        t = now()
        pairs = list(rows)  # the partition arrives as pickled (image, label) rows
        x = np.stack([p[0] for p in pairs])
        y = np.array([p[1] for p in pairs])
        t_rows = now()
        configure_tf(1)
        import keras

        t_tf = now()
        model_json, compile_config = bc_model.value
        model = keras.models.model_from_json(model_json)
        model.compile_from_config(compile_config)
        weights = bc_weights.value
        model.set_weights(weights)
        t_build = now()
        model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0)
        t_fit = now()
        delta = [w - n for w, n in zip(weights, model.get_weights())]
        yield delta, {"rows_s": t_rows - t, "tf_import_s": t_tf - t_rows,
                      "build_s": t_build - t_tf, "fit_s": t_fit - t_build,
                      "task_s": now() - t, "pid": os.getpid()}

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


class SparkSync:
    """The driver side of Example 3.1: one ``mapPartitions`` job per round."""

    def __init__(self, sc, model, x, y, workers: int, seed: int):
        self.sc, self.model, self.x, self.y, self.K = sc, model, x, y, workers
        self.rng = np.random.default_rng(seed)
        self.w = model.get_weights()
        # Broadcast once, as the paper does with the model's YAML (Keras 3 has only JSON).
        self.bc_model = sc.broadcast((model.to_json(), model.get_compile_config()))
        self.rounds: list[dict] = []

    def train_epoch(self, _e) -> None:
        t = now()
        perm = self.rng.permutation(len(self.x))
        x, y = self.x[perm], self.y[perm]
        t_shuffle = now()
        rdd = self.sc.parallelize(list(zip(x, y)), self.K)  # pickles every row, every round
        t_par = now()
        bc_w = self.sc.broadcast(self.w)
        t_bc = now()
        out = rdd.mapPartitions(spark_worker_train(self.bc_model, bc_w, WORKER_EPOCHS,
                                                   BATCH_SIZE)).collect()
        t_job = now()
        bc_w.unpersist()
        self.w = apply_mean_delta(self.w, [d for d, _ in out])
        tasks = [s for _, s in out]
        self.rounds.append({
            "shuffle_s": t_shuffle - t, "parallelize_s": t_par - t_shuffle,
            "broadcast_s": t_bc - t_par, "job_s": t_job - t_bc, "average_s": now() - t_job,
            **{k: max(s[k] for s in tasks) for k in ("rows_s", "tf_import_s", "build_s",
                                                     "fit_s", "task_s")},
            "worker_pids": sorted(s["pid"] for s in tasks)})

    def evaluate(self, x_test, y_test):
        self.model.set_weights(self.w)
        return evaluate(self.model, x_test, y_test)


def run_spark(args) -> dict:
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
            (x, y), (x_test, y_test) = load_data()
            driver = SparkSync(sc, build_model(args.seed), x, y, args.workers, args.seed)
            t_ready = now()
            tl = run_epochs("spark", args.epochs, driver.train_epoch,
                            lambda: driver.evaluate(x_test, y_test), args.stop_at)
        finally:
            sc.stop()
    compute = sum(r["fit_s"] for r in driver.rounds)
    return ok_result("spark", t0, t_ready, tl, compute, rounds=driver.rounds,
                     settings="1 round/epoch, plain average (Example 3.1)")


# -- (e) ray: the same synchronous scheme on actors ---------------------------------------------


class RayTrainer:
    """A Ray actor (``num_cpus=1``) holding the model and the whole dataset."""

    def __init__(self, seed: int):
        configure_tf(1)
        (self.x, self.y), (self.x_test, self.y_test) = load_data()
        self.model = build_model(seed)

    def sizes(self) -> tuple[int, int]:
        return len(self.x), len(self.x_test)

    def weights(self) -> list:
        return self.model.get_weights()

    def train(self, weights, indices, epochs: int, batch_size: int):
        t = now()
        self.model.set_weights(weights)
        # shuffle=False: the driver shuffled the indices, as DDLF's trainers do.
        self.model.fit(self.x[indices], self.y[indices], epochs=epochs,
                       batch_size=batch_size, shuffle=False, verbose=0)
        delta = [w - n for w, n in zip(weights, self.model.get_weights())]
        return delta, now() - t

    def evaluate(self, weights, lo: int, hi: int) -> tuple[float, float]:
        self.model.set_weights(weights)
        return evaluate(self.model, self.x_test[lo:hi], self.y_test[lo:hi])


class RaySync:
    """The driver side: one ``ray.put`` of the weights and K index partitions per round."""

    def __init__(self, ray, actors, seed: int):
        self.ray, self.actors, self.K = ray, actors, len(actors)
        self.rng = np.random.default_rng(seed)
        self.w = ray.get(actors[0].weights.remote())
        self.n_train, self.n_test = ray.get(actors[0].sizes.remote())
        self.compute: list[float] = []

    def train_epoch(self, _e) -> None:
        w_ref = self.ray.put(self.w)
        parts = np.array_split(self.rng.permutation(self.n_train), self.K)
        refs = [a.train.remote(w_ref, p, WORKER_EPOCHS, BATCH_SIZE)
                for a, p in zip(self.actors, parts)]
        out = self.ray.get(refs)
        self.w = apply_mean_delta(self.w, [d for d, _ in out])
        self.compute.append(max(c for _, c in out))

    def evaluate(self) -> tuple[float, float]:
        w_ref = self.ray.put(self.w)
        bounds = np.linspace(0, self.n_test, self.K + 1).astype(int)
        out = self.ray.get([a.evaluate.remote(w_ref, int(lo), int(hi))
                            for a, lo, hi in zip(self.actors, bounds[:-1], bounds[1:])])
        sizes = np.diff(bounds)
        return (float(np.dot(sizes, [o[0] for o in out]) / self.n_test),
                float(np.dot(sizes, [o[1] for o in out]) / self.n_test))


def run_ray(args) -> dict:
    t0 = now()
    try:
        import ray
    except ImportError as e:
        raise Unavailable(f"ray is not importable ({e}); pip install -e '.[bench]'")
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        actor_cls = ray.remote(num_cpus=1)(RayTrainer)
        actors = [actor_cls.remote(args.seed) for _ in range(args.workers)]
        driver = RaySync(ray, actors, args.seed)
        ray.get([a.sizes.remote() for a in actors])  # every actor built and loaded
        t_ready = now()
        tl = run_epochs("ray", args.epochs, driver.train_epoch, driver.evaluate, args.stop_at)
    finally:
        ray.shutdown()
    return ok_result("ray", t0, t_ready, tl, sum(driver.compute), round_compute_s=driver.compute,
                     settings="1 round/epoch, plain average (Algorithm 6)")


# -- (f) Ray Train: TensorflowTrainer, gradients all-reduced every step -------------------------


def raytrain_loop(config: dict) -> None:
    """Runs on each Ray Train worker: the paper CNN in tf_keras under
    MultiWorkerMirroredStrategy, one ``fit`` epoch at a time; rank 0 writes each epoch's
    figures to ``config["out"]`` (a file: this works whatever Ray Train's reporting API)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from ray import train as ray_train

    ctx = ray_train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    (x, y), (x_test, y_test) = load_data()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras2 = tf.keras   # tf_keras, with TF_USE_LEGACY_KERAS=1
    with strategy.scope():
        layers = keras2.layers
        model = keras2.Sequential([
            layers.Input(shape=(28, 28, 1)),
            layers.Conv2D(32, (3, 3), activation="relu"), layers.MaxPooling2D((2, 2)),
            layers.Conv2D(64, (3, 3), activation="relu"), layers.Flatten(),
            layers.Dense(64, activation="relu"), layers.Dense(10, activation="softmax")])
        model.compile(optimizer=keras2.optimizers.SGD(learning_rate=0.01),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.set_weights(config["weights"])   # the same start as every other column
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    rng = np.random.default_rng(config["seed"])
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(EVAL_BATCH * world)
    test = test.with_options(options)
    train_s = 0.0
    for e in range(1, config["epochs"] + 1):
        # The same shuffle on every worker; DATA sharding gives each 1/world of each
        # global batch (32 per worker), so gradients are all-reduced over 32 * world.
        perm = rng.permutation(len(x))
        data = tf.data.Dataset.from_tensor_slices((x[perm], y[perm])).batch(BATCH_SIZE * world)
        data = data.with_options(options)
        t = now()
        model.fit(data, epochs=1, verbose=0)
        fit_s = now() - t
        train_s += fit_s
        t = now()
        out = model.evaluate(test, verbose=0, return_dict=True)
        eval_s = now() - t
        if rank == 0:
            with open(config["out"], "a") as f:
                f.write(json.dumps({"epoch": e, "fit_s": fit_s, "eval_s": eval_s,
                                    "train_s": train_s, "test_accuracy": float(out["accuracy"]),
                                    "test_loss": float(out["loss"])}) + "\n")
        ray_train.report({"epoch": e, "test_accuracy": float(out["accuracy"])})
        # Every worker evaluated the same weights (mirrored): all stop together.
        if config["stop_at"] is not None and out["accuracy"] >= config["stop_at"]:
            break


def run_raytrain(args) -> dict:
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
    weights = build_model(args.seed).get_weights()   # Keras 3 here; tf_keras in the workers
    env = {"TF_USE_LEGACY_KERAS": "1", "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    if os.environ.get("DDLF_DATA_DIR"):
        env["DDLF_DATA_DIR"] = os.environ["DDLF_DATA_DIR"]
    with tempfile.TemporaryDirectory(prefix="train_compare_raytrain_") as tmpdir:
        out = os.path.join(tmpdir, "epochs.jsonl")
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", runtime_env={"env_vars": env})
        try:
            trainer = TensorflowTrainer(
                raytrain_loop,
                train_loop_config={"weights": weights, "epochs": args.epochs, "out": out,
                                   "seed": args.seed, "stop_at": args.stop_at},
                scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False,
                                             resources_per_worker={"CPU": 1}),
                run_config=RunConfig(storage_path=tmpdir, name="raytrain"))
            t_fit = now()
            trainer.fit()
            t_end = now()
        finally:
            ray.shutdown()
        with open(out) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    tl = Timeline()
    for r in rows:
        tl.rows.append({"epoch": r["epoch"], "time_s": r["train_s"],
                        "test_accuracy": r["test_accuracy"], "test_loss": r["test_loss"]})
        tl.eval_s += r["eval_s"]
        log(f"[raytrain] epoch {r['epoch']}: {r['train_s']:.1f} s of training, "
            f"test accuracy {r['test_accuracy']:.4f}")
    tl.train_s = rows[-1]["train_s"] if rows else 0.0
    # Start-up: everything before the first epoch (ray.init, the workers, TF, the data,
    # the strategy's collectives), measured from outside the workers.
    startup = (t_end - t0) - tl.train_s - tl.eval_s
    tl.last_train_end = t_end
    result = ok_result("raytrain", t0, t0 + startup, tl, tl.train_s,
                       settings="all-reduce of gradients every step (global batch 32 x K)")
    result["total_s"] = t_end - t0
    result["fit_call_s"] = t_end - t_fit
    return result


# -- (c, d) DDLF --------------------------------------------------------------------------------


class SeededCNN:
    """``models.paper_cnn`` after ``keras.utils.set_random_seed(seed)``: every column's
    trainers start from the same weights (a DDLF run takes trainer 0's)."""

    def __init__(self, seed: int):
        self.seed = seed

    def __call__(self):
        return build_model(self.seed)


def describe_settings(scheme: str, cfg) -> str:
    """A column's scheme-level settings, as the run resolved them."""
    if scheme in ("sync", "allreduce"):
        text = f"{cfg.rounds_per_epoch} rounds/epoch" + (", ring" if scheme == "allreduce" else "")
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
    if scheme == "async":
        return f"delta/K on arrival, {cfg.rounds_per_epoch} piece(s)/trainer/epoch"
    if scheme == "easgd":
        return f"alpha {cfg.alpha:g}, tau {cfg.tau} steps"
    if scheme == "downpour":
        return f"n_fetch {cfg.n_fetch}, n_push {cfg.n_push} steps"
    return scheme


def run_ddlf(args, column: str) -> dict:
    t0 = now()
    try:
        import ddlf_actors as ddlf
        from ddlf_actors.apps import train
    except ImportError as e:
        raise Unavailable(f"ddlf_actors.apps is not importable ({e})")
    base, _, backend = column.partition("@")
    backend = backend or "ddlf"
    if backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"ray is not importable ({e}); pip install -e '.[ray]'")
    scheme, options = DDLF_COLUMNS[base]
    # backend="ray": a local Ray instance, K CPUs; the schemes then place trainers on it.
    ddlf.init(num_cpus=args.workers, backend=backend)
    try:
        t_call = now()
        r = train(SeededCNN(args.seed), DATASET, scheme, workers=args.workers,
                  master_epochs=args.epochs, worker_epochs=WORKER_EPOCHS,
                  batch_size=BATCH_SIZE, progress=False, seed=args.seed,
                  target_accuracy=args.stop_at, **options)
        t_return = now()
    finally:
        ddlf.shutdown()
    rows = r.history
    # Rows carry eval_s (trainer time evaluating an earlier row's weights, inside a later
    # round): take it out of training time, as the other columns' evaluations are.
    evals = [row.get("eval_s", 0.0) for row in rows]
    eval_s = sum(evals)
    # A row's time_s counts from the run's start, the trainers' start-up (r.startup_s)
    # included: take that out too, as the other columns' training starts once they are
    # ready (start-up is its own column).
    train_s = rows[-1]["time_s"] - r.startup_s - eval_s
    startup = t_call - t0 + r.startup_s
    epochs, done_eval = [], 0.0
    for row, ev in zip(rows, evals):
        done_eval += ev
        if row["test_accuracy"] is None:    # a round between evaluations
            continue
        epochs.append({"epoch": int(row["epoch"]) if float(row["epoch"]).is_integer()
                       else row["epoch"], "time_s": row["time_s"] - r.startup_s - done_eval,
                       "test_accuracy": row["test_accuracy"], "test_loss": row["test_loss"]})
    for e in epochs:
        log(f"[{column}] epoch {e['epoch']}: {e['time_s']:.1f} s of training, "
            f"test accuracy {e['test_accuracy']:.4f}")
    wall = sum(row["wall_s"] for row in rows)
    overhead = sum(row["overhead_s"] for row in rows)
    settings = describe_settings(scheme, r.config)
    log(f"[{column}] {settings}; framework overhead {overhead:.3f} s of {wall:.1f} s of rounds "
        f"({100 * overhead / wall:.2f} %); evaluation on the trainers {eval_s:.1f} s; "
        f"final evaluation and teardown {t_return - t_call - rows[-1]['time_s']:.1f} s")
    log(f"[{column}] start-up {startup:.1f} s (in the call: {r.startup_s:.1f} s)")
    return {"column": column, "status": "ok", "startup_s": startup, "epochs": epochs,
            "train_s": train_s, "eval_s": eval_s, "total_s": startup + train_s + eval_s,
            "compute_s": sum(row.get("compute_s", 0.0) for row in rows),
            "overhead_s": overhead, "round_wall_s": wall, "settings": settings,
            "rounds": len(rows),
            "bytes_sent": sum(row.get("bytes_sent", 0) for row in rows),
            "bytes_received": sum(row.get("bytes_received", 0) for row in rows)}


COLUMNS = {
    "keras": run_keras,
    "spark": run_spark,
    "ray": run_ray,
    "raytrain": run_raytrain,
    **{name: (lambda args, name=name: run_ddlf(args, name)) for name in DDLF_COLUMNS},
    **{name: (lambda args, name=name: run_ddlf(args, name)) for name in RAY_BACKEND_COLUMNS},
}


def column_main(args) -> None:
    """In the column's own process: run it, print one result line."""
    try:
        result = COLUMNS[args.column](args)
    except Unavailable as e:
        result = {"column": args.column, "status": "unavailable", "reason": str(e)}
    except Exception as e:
        traceback.print_exc()
        result = {"column": args.column, "status": "error", "reason": f"{type(e).__name__}: {e}"}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# -- the parent: one process tree per column ----------------------------------------------------


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


def run_column_process(column: str, args) -> dict:
    """Run one column in a fresh process group; return its result dict, with
    ``other_cpu_s``: CPU time other processes took from the machine meanwhile."""
    cmd = [sys.executable, os.path.abspath(__file__), "--column", column,
           "--epochs", str(args.epochs), "--workers", str(args.workers), "--seed", str(args.seed)]
    if args.stop_at is not None:
        cmd += ["--target", str(args.target), "--stop-at-target"]
    log(f"== {column}: {' '.join(cmd[1:])}")
    tree = ProcessTree()
    busy0 = _busy_cpu_s()
    started = now()
    with tempfile.TemporaryFile("w+") as out:
        # stdout to a file, not a pipe: a daemon holding the pipe open would block us.
        proc = subprocess.Popen(cmd, stdout=out, stderr=None, start_new_session=True)
        try:
            error = _wait_column(proc, tree, args.timeout)
        except BaseException:  # Ctrl-C: the column is in its own session, end it here
            _kill_group(proc)
            tree.end_leftovers(grace=0)
            raise
        ended = tree.end_leftovers()
        out.seek(0)
        result = _parse_result(out.read(), column, proc.returncode)
    if error:
        result = {"column": column, "status": "error", "reason": error}
    result["process_s"] = now() - started
    result["other_cpu_s"] = max(0.0, _busy_cpu_s() - busy0 - tree.cpu_s())
    if ended:
        result["ended_leftovers"] = ended
        log(f"== {column}: ended processes left behind: {', '.join(ended)}")
    return result


def _parse_result(stdout: str, column: str, returncode) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"column": column, "status": "error",
            "reason": f"no result line (exit code {returncode}; see stderr above)"}


# -- the report ---------------------------------------------------------------------------------


def _fmt(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def _final_acc(r: dict):
    return r["epochs"][-1]["test_accuracy"] if r.get("epochs") else None


def format_table(results: list, args) -> str:
    M = args.epochs
    head = (f"{'column':<14} {'start-up s':>10} {'s/epoch':>8} {'train s':>8} {'compute s':>9} "
            f"{'eval s':>7} " + " ".join(f"{'acc e' + str(e):>7}" for e in range(1, M + 1))
            + f" {'total s':>8} {'others':>6}")
    lines = [f"Fashion-MNIST, paper CNN, K={args.workers} trainers x 1 TF thread, "
             f"worker_epochs {WORKER_EPOCHS}, batch {BATCH_SIZE}, {M} master epochs; "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}", head,
             "-" * len(head)]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"{r['column']:<14} {r['status']}: {r.get('reason', '')}")
            continue
        accs = [e["test_accuracy"] for e in r["epochs"]] + [None] * (M - len(r["epochs"]))
        lines.append(
            f"{r['column']:<14} {r['startup_s']:>10.1f} {r['train_s'] / M:>8.1f} "
            f"{r['train_s']:>8.1f} {_fmt(r.get('compute_s')):>9} {_fmt(r.get('eval_s')):>7} "
            + " ".join(f"{_fmt(a, '.4f'):>7}" for a in accs) + f" {r['total_s']:>8.1f}"
            + f" {_others_pct(r):>6}")
    lines.append("others: CPU other processes used while the column ran, in % of the "
                 "machine (figures from a busy machine are slower)")
    return "\n".join(lines)


def _others_pct(r: dict) -> str:
    if r.get("other_cpu_s") is None or not r.get("process_s"):
        return "-"
    return f"{100 * r['other_cpu_s'] / (r['process_s'] * (os.cpu_count() or 1)):.0f}%"


def format_comparisons(results: list) -> str:
    by = {r["column"]: r for r in results if r["status"] == "ok"}
    lines = []

    def ratio(label, a, b, key):
        if a in by and b in by:
            lines.append(f"{label:<42} {by[a][key] / by[b][key]:.2f}x "
                         f"({by[a][key]:.1f} s / {by[b][key]:.1f} s)")

    ratio("DDLF-sync / Spark, train time", "ddlf-sync", "spark", "train_s")
    ratio("DDLF-sync / Ray, train time", "ddlf-sync", "ray", "train_s")
    ratio("DDLF-sync / Ray, end to end (total)", "ddlf-sync", "ray", "total_s")
    ratio("DDLF-async / Ray, train time", "ddlf-async", "ray", "train_s")
    ratio("DDLF-sync on Ray / DDLF-sync, train time", "ddlf-sync@ray", "ddlf-sync", "train_s")
    ratio("DDLF-sync on Ray / DDLF-sync, total", "ddlf-sync@ray", "ddlf-sync", "total_s")
    ratio("DDLF-sync on Ray / Ray by hand, train time", "ddlf-sync@ray", "ray", "train_s")
    ratio("DDLF-async on Ray / DDLF-async, train time", "ddlf-async@ray", "ddlf-async",
          "train_s")
    if "ray" in by:
        ref = _final_acc(by["ray"])
        diffs = [f"{c} {_final_acc(r) - ref:+.4f}" for c, r in by.items() if c != "ray"]
        if diffs:
            lines.append(f"{'final accuracy minus Ray sync':<42} " + ", ".join(diffs))
    if "spark" in by and by["spark"].get("rounds"):
        lines.append(_spark_breakdown(by["spark"]["rounds"]))
    return "\n".join(lines)


def time_to_target(r: dict, target: float):
    """``(epoch, training s, training + evaluation s)`` at the first evaluation whose test
    accuracy is at least ``target``, or None if none reached it."""
    evals = len(r["epochs"]) or 1
    per_eval = (r.get("eval_s") or 0.0) / evals
    for n, e in enumerate(r["epochs"], 1):
        if e["test_accuracy"] is not None and e["test_accuracy"] >= target:
            return e["epoch"], e["time_s"], e["time_s"] + n * per_eval
    return None


def format_target_table(results: list, args) -> str:
    """Time to ``args.target`` test accuracy, the accuracy after the last epoch, and what
    each column's scheme-level settings are."""
    M, A = args.epochs, args.target
    head = (f"{'column':<13} {'epoch':>5} {'train s':>8} {'+eval s':>8} {'s/epoch':>8} "
            f"{'acc e' + str(M):>8}  settings")
    lines = [f"Time to test accuracy {A} (Fashion-MNIST, paper CNN, SGD 0.01, batch 32, "
             f"K={args.workers}; the first epoch-end evaluation at or above it)", head,
             "-" * 100]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"{r['column']:<13} {r['status']}: {r.get('reason', '')}")
            continue
        hit = time_to_target(r, A)
        per_epoch = r["train_s"] / max(1, len(r["epochs"]))
        last = r["epochs"][-1] if r["epochs"] else {}
        acc = f"{last.get('test_accuracy', 0):.4f}" if last.get("epoch") == M else "-"
        if hit is None:
            reached = f"{'-':>5} {'not in ' + str(len(r['epochs'])):>17}"
        else:
            reached = f"{hit[0]!s:>5} {hit[1]:>8.1f} {hit[2]:>8.1f}"
        lines.append(f"{r['column']:<13} {reached} {per_epoch:>8.1f} {acc:>8}  "
                     f"{r.get('settings', '')}")
    lines.append("train s: training time to the end of that epoch, evaluation excluded; "
                 "+eval s: with the evaluations up to it")
    return "\n".join(lines)


def format_target_comparisons(results: list, target: float) -> str:
    by = {r["column"]: r for r in results if r["status"] == "ok"}
    lines = []
    for a in ("ddlf-default",):
        for b in ("ray", "spark", "keras", "raytrain", "ddlf-sync"):
            if a in by and b in by:
                ha, hb = time_to_target(by[a], target), time_to_target(by[b], target)
                if ha and hb:
                    lines.append(f"{a} / {b}, time to {target}: {ha[1] / hb[1]:.2f}x "
                                 f"({ha[1]:.1f} s / {hb[1]:.1f} s; with evaluation "
                                 f"{ha[2] / hb[2]:.2f}x)")
    return "\n".join(lines)


def _spark_breakdown(rounds: list) -> str:
    """Where Spark's round time goes, summed over rounds (task figures: slowest task)."""
    total = {k: sum(r[k] for r in rounds) for k in rounds[0] if k.endswith("_s")}
    driver = ", ".join(f"{k[:-2]} {total[k]:.1f}" for k in
                       ("shuffle_s", "parallelize_s", "broadcast_s", "job_s", "average_s"))
    tasks = ", ".join(f"{k[:-2]} {total[k]:.1f}" for k in
                      ("rows_s", "tf_import_s", "build_s", "fit_s", "task_s"))
    overhead = total["job_s"] - total["task_s"]
    return (f"Spark rounds, s summed: driver: {driver}\n"
            f"  in the slowest task: {tasks}; job time outside the task "
            f"(scheduling, shipping the partition, collecting): {overhead:.1f}")


def write_png(results: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r["status"] == "ok" and r["epochs"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for r in ok:
        t = [e["time_s"] for e in r["epochs"]]
        acc = [e["test_accuracy"] for e in r["epochs"]]
        axes[0].plot(t, acc, marker="o", label=r["column"])
        axes[1].plot([r["startup_s"] + s for s in t], acc, marker="o", label=r["column"])
    axes[0].set_xlabel("training time, s (start-up and evaluation excluded)")
    axes[1].set_xlabel("time since the column started, s (start-up included)")
    axes[0].set_ylabel("test accuracy")
    for ax in axes:
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Fashion-MNIST, paper CNN: accuracy after each epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line -------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--columns",
                   help=f"comma-separated, run in this order (default: {','.join(TABLE_COLUMNS)}; "
                        f"with --target: {','.join(TARGET_COLUMNS)}; all: {','.join(ALL_COLUMNS)})")
    p.add_argument("--target", type=float,
                   help="also print the time to this test accuracy (e.g. 0.85) for each column")
    p.add_argument("--stop-at-target", action="store_true",
                   help="with --target: each column stops at its first epoch at or above it "
                        "(DDLF's target_accuracy=; the others' epoch loops)")
    p.add_argument("--epochs", type=int, default=2, help="master epochs M (default 2)")
    p.add_argument("--workers", type=int, default=2, help="trainers K (default 2)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per column (900)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", help="sets DDLF_DATA_DIR for the columns")
    p.add_argument("--png", default=os.path.join(os.path.dirname(__file__), "train_compare.png"),
                   help="accuracy-vs-time plot ('' to skip)")
    p.add_argument("--json", help="also write every column's result here")
    p.add_argument("--column", choices=ALL_COLUMNS, help=argparse.SUPPRESS)  # internal
    args = p.parse_args(argv)
    if args.stop_at_target and not args.target:
        p.error("--stop-at-target needs --target A")
    args.stop_at = args.target if args.stop_at_target else None
    if args.columns is None:
        args.columns = ",".join(TARGET_COLUMNS if args.target else TABLE_COLUMNS)
    args.columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = sorted(set(args.columns) - set(ALL_COLUMNS))
    if unknown:
        p.error(f"unknown column(s) {unknown}; choose from {','.join(ALL_COLUMNS)}")
    if args.epochs < 1 or args.workers < 1:
        p.error("--epochs and --workers must be at least 1")
    return args


def _load_average() -> str:
    """The 1, 5 and 15 minute load averages: figures from a busy machine are slower."""
    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "?"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.data_dir:
        os.environ["DDLF_DATA_DIR"] = os.path.abspath(args.data_dir)
    if args.column:
        column_main(args)
        return
    _become_subreaper()
    load_before = _load_average()
    t = now()
    results = [run_column_process(c, args) for c in args.columns]
    print(format_table(results, args))
    comparisons = format_comparisons(results)
    if comparisons:
        print(comparisons)
    if args.target:
        print()
        print(format_target_table(results, args))
        comparisons = format_target_comparisons(results, args.target)
        if comparisons:
            print(comparisons)
    print(f"(total {now() - t:.0f} s; load average before {load_before}, after "
          f"{_load_average()})")
    if args.png:
        write_png(results, args.png)
        log(f"wrote {args.png}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"epochs": args.epochs, "workers": args.workers, "batch_size": BATCH_SIZE,
                       "target": args.target,
                       "cpus": os.cpu_count(), "python": platform.python_version(),
                       "columns": results}, f, indent=1)


if __name__ == "__main__":
    main()
