"""The ``spark`` column of ``benchmarks/training/train_compare.py``: the paper's Example 3.1
(Algorithm 6 on ``local[K]``: one round per epoch, a plain average of the K deltas).
Its worker function is pickled by reference, so Spark's Python workers import this
module (train_compare puts the checkout on their PYTHONPATH)."""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

from benchmarks import protocol
from benchmarks.protocol import Job
from benchmarks.training.column_process import (
    BATCH_SIZE,
    EvalClock,
    Unavailable,
    apply_mean_delta,
    build_model,
    configure_tf,
    eval_name,
    evaluate_arrays,
    now,
    result,
    split_for,
)

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
