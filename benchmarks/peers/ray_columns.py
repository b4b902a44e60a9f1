"""The Ray columns of ``benchmarks/training/train_compare.py``: ``ray`` (the paper's
Algorithm 6 by hand on K actors), ``ray-rounds`` (DDLF's default scheme written by hand
on Ray) and ``raytrain`` (Ray Train's ``TensorflowTrainer``, gradients all-reduced every
step). Ray's workers import this module by name (train_compare puts the checkout on
their PYTHONPATH)."""

from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np

from benchmarks import protocol
from benchmarks.protocol import Job, SplitDataset
from benchmarks.training.column_process import (
    BATCH_SIZE,
    OUTER_K_RULE,
    OUTER_LR,
    OUTER_MOMENTUM,
    EvalClock,
    Unavailable,
    apply_mean_delta,
    build_model,
    configure_tf,
    eval_name,
    eval_steps,
    evaluate_arrays,
    log,
    make_optimizer,
    now,
    result,
    split_for,
)
from ddlf_actors.apps.schemes.rounds import STEPS_PER_ROUND

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
