"""What every column of ``train_compare.py`` runs in its own process: TensorFlow set to a
thread count, the seeded paper CNN with a candidate's optimizer, evaluation by forward
passes, the clock that takes evaluation pauses out of training time, and the result
record. The columns themselves are in ``train_compare.py`` (keras, DDLF) and in
``benchmarks/peers/`` (``ray_columns.py``: ray, ray-rounds, raytrain; ``spark_column.py``).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from benchmarks.protocol import COLUMNS, Job, SplitDataset

# ray-rounds: DDLF's default scheme, written by hand (apps/schemes/sync.py, rounds.py,
# outer.py, rates.py), with DDLF's own numbers so the two cannot drift apart.
from ddlf_actors.apps.schemes.rounds import RoundOptions

RESULT_PREFIX = "TRAIN_COMPARE_RESULT "  # Spark's JVM shares the column's stdout
DATASET = "fashion-mnist"
FASHION_SIZES = (60_000, 10_000)   # train, test: to size DDLF's rounds before the run
BATCH_SIZE = 32
EVAL_BATCH = 512
SELECT_SEED_BASE = 1000       # selection seeds 1001, 1002, ...: never the final run's
OUTER_LR = RoundOptions.DEFAULTS["outer_lr"]
OUTER_MOMENTUM = RoundOptions.DEFAULTS["outer_momentum"]
OUTER_K_RULE = RoundOptions.DEFAULTS["lr_scaling"] == "outer"   # rate x K, warmed up
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


def build_model(seed: int, spec: dict, model_fn=None):
    """``model_fn()`` (default ``models.paper_cnn``) after
    ``keras.utils.set_random_seed(seed)``, recompiled with the candidate's optimizer unless
    it is the model's own (``"default"``): the loss and metrics stay what the model
    compiled, and the weights depend on the seed alone."""
    import keras

    if model_fn is None:
        from ddlf_actors.apps.models import paper_cnn as model_fn

    keras.utils.set_random_seed(seed)
    model = model_fn()
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


def apply_mean_delta(w: list, deltas: list) -> list:
    """``w - (1/K) sum_j delta_j``, layer by layer."""
    return [wi - sum(d[i] for d in deltas) / len(deltas) for i, wi in enumerate(w)]
