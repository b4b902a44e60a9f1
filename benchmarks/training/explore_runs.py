"""What ``explore_defaults.py`` runs, each in a process of its own: Keras ``fit`` on the
validation split (``run_single``), DDLF's ``train_sync`` with a configuration's options
(``run_ddlf``), and one trainer's round timed piece by piece (``run_profile``).
"""

from __future__ import annotations

import os
import resource
import time

import numpy as np

SPLIT = 50_000            # train on [:SPLIT] of the 60,000 training images, validate on the rest
BATCH = 32
WORKERS = 2
EVAL_BATCH = 512
RESULT = "@@explore@@ "
BASELINE_OPTS = ["sgdm:0.01", "sgdm:0.03", "sgdm:0.1", "adam:3e-4", "adam:1e-3", "adam:3e-3"]


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def validation_split():
    """``((x[:50000], y[:50000]), (x[50000:], y[50000:]))`` of Fashion-MNIST's training set:
    the dataset callable of every DDLF run here (the trainers' "test set" is validation)."""
    from ddlf_actors.apps import datasets

    (x, y), _ = datasets.load("fashion-mnist")
    return (x[:SPLIT], y[:SPLIT]), (x[SPLIT:], y[SPLIT:])


def make_optimizer(spec: str):
    import keras

    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    lr = float(parts[0]) if parts else 0.01
    if kind == "sgd":
        return keras.optimizers.SGD(lr)
    if kind == "sgdm":
        return keras.optimizers.SGD(lr, momentum=0.9)
    if kind == "nag":
        return keras.optimizers.SGD(lr, momentum=0.9, nesterov=True)
    if kind == "adam":
        return keras.optimizers.Adam(lr)
    if kind == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=float(parts[1]) if len(parts) > 1 else 0.004)
    raise SystemExit(f"unknown optimizer {spec!r}: sgd, sgdm, nag, adam or adamw, e.g. sgdm:0.03")


class SeededCNN:
    """The paper CNN after ``keras.utils.set_random_seed(seed)``, compiled with ``opt``
    (None: as ``models.paper_cnn`` compiles it)."""

    def __init__(self, opt: str | None, seed: int):
        self.opt, self.seed = opt, seed

    def __call__(self):
        import keras

        from ddlf_actors.apps.models import paper_cnn

        keras.utils.set_random_seed(self.seed)
        model = paper_cnn()
        if self.opt is not None:
            model.compile(optimizer=make_optimizer(self.opt),
                          loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model


def configure_tf(threads: int):
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from ddlf_actors.apps import tf_startup

    tf = tf_startup.import_tensorflow()
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- one process: Keras fit, evaluated by a callback -------------------------------------------


def run_single(job: dict) -> dict:
    configure_tf(job["threads"])
    import keras

    (x, y), (xv, yv) = validation_split()
    if job.get("half"):           # one trainer's share: what each DDLF trainer trains on
        x, y = x[:SPLIT // WORKERS], y[:SPLIT // WORKERS]
    model = SeededCNN(job["opt"], job["seed"])()
    batch = job.get("batch", BATCH)
    steps_per_epoch = -(-len(x) // batch)
    evals = job["evals"]
    every = max(1, round(steps_per_epoch / evals)) if evals else None
    target = job.get("stop_at")
    points: list = []
    clock = {"train": 0.0, "eval": 0.0, "cpu_eval": 0.0}

    class Evaluate(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step = 0
            self.t = None

        def on_train_begin(self, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            if self.step == 1:   # the first step traces: kept apart for the steady rate
                clock["first_step"] = clock["train"] + time.perf_counter() - self.t
            if every is None or self.step % every:
                return
            self.evaluate()

        def on_train_end(self, logs=None):
            if every is None or self.step % every:
                self.evaluate()    # the last weights

        def evaluate(self):
            now = time.perf_counter()
            clock["train"] += now - self.t
            c = cpu_s()
            out = self.model.evaluate(xv, yv, batch_size=EVAL_BATCH, verbose=0,
                                      return_dict=True)
            clock["cpu_eval"] += cpu_s() - c
            points.append({"epoch": self.step / steps_per_epoch, "train_s": clock["train"],
                           "acc": float(out["accuracy"]), "loss": float(out["loss"])})
            self.t = time.perf_counter()
            clock["eval"] += self.t - now
            if target is not None and out["accuracy"] >= target:
                self.model.stop_training = True

    cb = Evaluate()
    load0, c0, t0 = loadavg(), cpu_s(), time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=job["epochs"], shuffle=True, verbose=0,
              callbacks=[cb])
    wall = time.perf_counter() - t0
    epochs_done = cb.step / steps_per_epoch
    first = clock.get("first_step", 0.0)
    return {"points": points, "train_s": clock["train"], "eval_s": clock["eval"],
            "epochs_done": epochs_done, "s_per_epoch": clock["train"] / epochs_done,
            "first_step_s": first,
            "steady_s_per_epoch": (clock["train"] - first) / (epochs_done - 1 / steps_per_epoch),
            "cpu_s_per_epoch": (cpu_s() - c0 - clock["cpu_eval"]) / epochs_done,
            "wall_s": wall, "load": [load0, loadavg()]}


# -- DDLF: train_sync on the validation split ---------------------------------------------------


def parse_config(text: str) -> dict:
    """CONFIG (see the module docstring) -> the job's settings."""
    items = text.replace(",", " ").split()
    if "defaults" in items:    # train_sync's own defaults and paper_cnn's own optimizer
        given = dict(i.partition("=")[::2] for i in items if "=" in i)
        if set(given) - {"fit", "batch"}:
            raise SystemExit(f"{text!r}: with 'defaults' only fit= and batch= may be given")
        return {"name": " ".join(items), "inner": None, "options": {},
                "fit": given.get("fit"), "batch": int(given.get("batch", BATCH))}
    cfg = {"in": "sgd:0.01", "out": "avg", "steps": "32"}
    for item in items:
        key, _, value = item.partition("=")
        if key not in ("in", "out", "scale", "steps", "warm", "fit", "batch"):
            raise SystemExit(f"unknown CONFIG key {key!r} in {text!r}")
        cfg[key] = value
    opts: dict = {}
    kind, *parts = cfg["out"].split(":")
    scaled = False
    if kind == "avg":
        opts.update(outer_lr=1.0, outer_momentum=0.0, nesterov=False)
    else:
        lr_text = parts[-1]
        scaled = lr_text.endswith("K")
        lr = float(lr_text.rstrip("K"))
        if kind == "lr":
            opts.update(outer_lr=lr, outer_momentum=0.0, nesterov=False)
        elif kind in ("nag", "hb"):
            opts.update(outer_lr=lr, outer_momentum=float(parts[0]), nesterov=kind == "nag")
        else:
            raise SystemExit(f"unknown outer step {cfg['out']!r}: avg, lr:LR, nag:MU:LR, hb:MU:LR")
    if cfg.get("scale") == "inner":
        if scaled:
            raise SystemExit(f"{text!r}: the K rule goes on the outer rate or the inner one, "
                             "not both")
        opts["lr_scaling"] = "inner"
    else:
        opts["lr_scaling"] = "outer" if scaled else "none"
    if "warm" in cfg:
        opts["warmup_rounds"] = int(cfg["warm"])
    steps = int(cfg["steps"])
    batch = int(cfg.get("batch", BATCH))
    opts["rounds_per_epoch"] = max(1, round(SPLIT / WORKERS / (batch * steps)))
    name = " ".join(f"{k}={cfg[k]}" for k in ("in", "out", "scale", "steps", "warm", "batch",
                                               "fit") if k in cfg)
    return {"name": name, "inner": cfg["in"], "options": opts, "fit": cfg.get("fit"),
            "batch": batch}


def trainer_class(old_loop: bool):
    """``TrainerActor`` counting its process's CPU seconds in ``train`` and ``evaluate``
    (``cpu_report()``); with ``old_loop``, its old ``fit``: one ``train_on_batch`` per batch."""
    from ddlf_actors.apps import TrainerActor

    class CountingTrainer(TrainerActor):
        _train_cpu = _eval_cpu = _fit_cpu = 0.0

        def train(self, *args, **kwargs):
            c = time.process_time()
            try:
                return super().train(*args, **kwargs)
            finally:
                self._train_cpu += time.process_time() - c

        def fit(self, x, y, epochs, batch_size):
            c = time.process_time()
            try:
                if not old_loop:
                    return super().fit(x, y, epochs, batch_size)
                model, logs = self.model, None
                for _ in range(int(epochs)):
                    for start in range(0, len(x), batch_size):
                        logs = model.train_on_batch(x[start:start + batch_size],
                                                    y[start:start + batch_size],
                                                    return_dict=True)
                return float(logs["loss"]) if logs is not None else 0.0
            finally:
                self._fit_cpu += time.process_time() - c

        def evaluate(self, *args, **kwargs):
            c = time.process_time()
            try:
                return super().evaluate(*args, **kwargs)
            finally:
                self._eval_cpu += time.process_time() - c

        def cpu_report(self) -> dict:
            return {"train": self._train_cpu, "fit": self._fit_cpu, "eval": self._eval_cpu}

    return CountingTrainer


def run_ddlf(job: dict) -> dict:
    import ddlf_actors as ddlf
    from ddlf_actors.apps import train_sync
    from ddlf_actors.apps.config import TrainConfig
    from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

    cfg = parse_config(job["config"])
    options = dict(cfg["options"])
    model_fn = SeededCNN(cfg["inner"], job["seed"])
    evals = job["evals"]
    if evals:
        if "rounds_per_epoch" in options:
            rounds = options["rounds_per_epoch"]
        else:   # the defaults: the rounds train_sync will pick for 25,000 images a trainer
            from ddlf_actors.apps.schemes.sync import default_rounds
            rounds = default_rounds(SPLIT / WORKERS, cfg["batch"])
        options["eval_every"] = max(1, round(rounds / evals))
    else:
        options["eval_every"] = 10 ** 6       # only the last weights, after the timed rounds
    if cfg["batch"] != BATCH or "defaults" not in job["config"]:
        options["batch_size"] = cfg["batch"]    # "defaults" alone: train_sync's own
    ddlf.init(num_cpus=WORKERS)
    try:
        # Trainers started here and handed to the run, so that their CPU seconds can be
        # asked for afterwards (a run stops the trainers it started itself).
        trainers = start_trainers(model_fn, validation_split, TrainConfig(
            workers=WORKERS, trainer_cls=trainer_class(cfg.get("fit") == "tob")))
        try:
            load0 = loadavg()
            r = train_sync(model_fn, validation_split, trainers=trainers, workers=WORKERS,
                           master_epochs=job["epochs"], seed=job["seed"],
                           target_accuracy=job.get("stop_at"), progress=False, **options)
            load1 = loadavg()
            cpu = ddlf.get([t.cpu_report.remote() for t in trainers], timeout=60)
        finally:
            stop_trainers(trainers)
    finally:
        ddlf.shutdown()
    rows = r.history
    # Training time up to a row: each round's busiest trainer's training (compute_s) plus
    # what the framework added (overhead_s: the round's wall time beyond the busiest
    # trainer's training and evaluation), i.e. the round's time had nothing been evaluated.
    # (Subtracting eval_s from the wall time instead, as train_compare.py does, takes off
    # the slower trainer's evaluation even when the other trainer's training was the
    # longer part of the round: it came out ~10 % short here.)
    points, done, done_eval = [], 0.0, 0.0
    for row in rows:
        done += row["compute_s"] + row["overhead_s"]
        done_eval += row.get("eval_s", 0.0)
        if row["test_accuracy"] is not None:
            points.append({"epoch": row["epoch"], "acc": row["test_accuracy"],
                           "loss": row["test_loss"], "train_s": done,
                           "time_s_less_eval": row["time_s"] - r.startup_s - done_eval})
    train_s = done
    epochs_done = rows[-1]["epoch"]
    first = rows[0]["compute_s"] + rows[0]["overhead_s"]   # its trainers' first trace
    c = r.config
    return {"points": points, "train_s": train_s, "eval_s": done_eval,
            "epochs_done": epochs_done, "s_per_epoch": train_s / epochs_done,
            "first_step_s": first,
            "steady_s_per_epoch": (train_s - first) / (epochs_done - 1 / c.rounds_per_epoch),
            "rounds_per_epoch": c.rounds_per_epoch, "eval_every": c.eval_every,
            "settings": {k: getattr(c, k) for k in ("outer_lr", "outer_momentum", "nesterov",
                                                     "lr_scaling", "warmup_rounds")},
            "trainer_cpu": cpu,
            "cpu_s_per_epoch": max(c["train"] for c in cpu) / epochs_done,
            "compute_s": sum(row["compute_s"] for row in rows),
            "overhead_s": sum(row["overhead_s"] for row in rows),
            "wall_s": sum(row["wall_s"] for row in rows), "rounds": len(rows),
            "load": [load0, load1]}


# -- the profile: one trainer's round, piece by piece ------------------------------------------


def run_profile(job: dict) -> dict:
    """In one process with ``threads`` TF threads: seconds per step of each way to run a
    round of ``steps`` batches, and the per-round costs around it."""
    configure_tf(job["threads"])
    import keras

    from ddlf_actors.apps.keras_steps import fit_steps

    (x, y), (xv, yv) = validation_split()
    steps = job["steps"]
    B = job.get("batch", BATCH)
    n = steps * B
    rng = np.random.default_rng(0)
    opt = job.get("opt")
    model = SeededCNN(opt, 0)()
    out: dict = {"threads": job["threads"], "steps": steps}

    def tob(xs, ys):
        for s in range(0, len(xs), B):
            model.train_on_batch(xs[s:s + B], ys[s:s + B], return_dict=True)

    def fitk(xs, ys):
        model.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)

    ways = {"train_on_batch": tob, "fit_steps": lambda xs, ys: fit_steps(model, xs, ys, 1, B),
            "keras_fit": fitk}
    rounds = job["rounds"]
    chunks = [np.sort(rng.choice(SPLIT, n, replace=False)) for _ in range(rounds)]
    first = {}
    SeededCNN(opt, 0)().predict(x[:BATCH], verbose=0)   # TF's own first-op start-up
    for k, fn in ways.items():      # the first call on a fresh model: it traces
        model = SeededCNN(opt, 0)()
        t = time.perf_counter()
        fn(x[chunks[0]], y[chunks[0]])
        first[k] = time.perf_counter() - t
    out["first_call_s"] = first
    model = SeededCNN(opt, 0)()    # one model for the timed calls, every way traced on it
    for fn in ways.values():
        fn(x[chunks[0]], y[chunks[0]])
    totals = {k: 0.0 for k in ways}
    cpus = {k: 0.0 for k in ways}
    for rep in range(job["reps"]):
        for k, fn in (ways.items() if rep % 2 == 0 else reversed(list(ways.items()))):
            for idx in chunks:
                xs, ys = x[idx], y[idx]
                c, t = cpu_s(), time.perf_counter()
                fn(xs, ys)
                totals[k] += time.perf_counter() - t
                cpus[k] += cpu_s() - c
    total_steps = job["reps"] * rounds * steps
    out["ms_per_step"] = {k: 1000 * v / total_steps for k, v in totals.items()}
    out["batch"] = B
    out["cpu_ms_per_step"] = {k: 1000 * v / total_steps for k, v in cpus.items()}
    # Per-round costs around the fit, as TrainerActor._run and train pay them.
    w = model.get_weights()
    reps = 50
    t = time.perf_counter()
    for _ in range(reps):
        model.set_weights(w)
    out["set_weights_ms"] = 1000 * (time.perf_counter() - t) / reps
    t = time.perf_counter()
    for _ in range(reps):
        w2 = [np.asarray(a) for a in model.get_weights()]
    out["get_weights_ms"] = 1000 * (time.perf_counter() - t) / reps
    t = time.perf_counter()
    for _ in range(reps):
        [a - b for a, b in zip(w, w2)]
    out["delta_ms"] = 1000 * (time.perf_counter() - t) / reps
    t = time.perf_counter()
    for idx in chunks:
        x[idx], y[idx]
    out["gather_ms"] = 1000 * (time.perf_counter() - t) / rounds
    half = len(xv) // WORKERS
    model.evaluate(xv[:half], yv[:half], batch_size=EVAL_BATCH, verbose=0)
    t = time.perf_counter()
    for _ in range(2):
        model.evaluate(xv[:half], yv[:half], batch_size=EVAL_BATCH, verbose=0)
    out["evaluate_5000_s"] = (time.perf_counter() - t) / 2
    out["load"] = loadavg()
    del keras
    return out
