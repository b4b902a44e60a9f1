"""A second framework for the trainers: softmax regression in numpy.

Tests train with it in seconds, without TensorFlow. :class:`NumpyAdapter` is a framework
adapter like the Keras one (``apps/frameworks/``); :class:`NumpyTrainer` is the
``TrainerActor`` that uses it, and the test trainers below subclass it and override the
documented hooks (``fit``, ``train`` ...) to inject faults and timings.
"""

from __future__ import annotations

import numpy as np

from ddlf_actors.apps import TrainerActor, ring
from ddlf_actors.apps.frameworks import FrameworkAdapter


class SoftmaxModel:
    def __init__(self, num_features: int, num_classes: int, lr: float = 0.5, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w = [rng.normal(0, 0.01, (num_features, num_classes)).astype(np.float32),
                  np.zeros(num_classes, np.float32)]
        self.lr = lr

    def probs(self, x):
        z = x.reshape(len(x), -1) @ self.w[0] + self.w[1]
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def loss(self, x, y):
        p = self.probs(x)
        return float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-9)))

    def step(self, x, y):
        self.apply(self.gradients(x, y))

    def gradients(self, x, y):
        """The gradient of the mean cross-entropy on ``x, y``."""
        p = self.probs(x)
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        xf = x.reshape(len(x), -1)
        return [xf.T @ p, p.sum(axis=0)]

    def apply(self, grads):
        self.w[0] -= self.lr * grads[0]
        self.w[1] -= self.lr * grads[1]

    def get_weights(self):
        return [a.copy() for a in self.w]

    def set_weights(self, weights):
        self.w = [np.array(a, dtype=np.float32, copy=True) for a in weights]


def softmax_model_fn(num_features: int = 64, num_classes: int = 4):
    return lambda: SoftmaxModel(num_features, num_classes)


class NumpyAdapter(FrameworkAdapter):
    """The framework adapter for :class:`SoftmaxModel` (and :class:`MomentumModel`)."""

    name = "numpy"
    model_file = "model.npz"

    @classmethod
    def owns(cls, model) -> bool:
        return isinstance(model, SoftmaxModel)

    @classmethod
    def configure_threads(cls, n: int) -> None:
        pass   # numpy's BLAS reads OMP_NUM_THREADS, which the trainer sets

    def get_weights(self):
        return self.model.get_weights()

    def set_weights(self, weights):
        self.model.set_weights(weights)

    def fit(self, x, y, epochs, batch_size):
        x = np.asarray(x, np.float32)
        y = np.asarray(y)
        losses = []
        for _ in range(epochs):
            losses = []
            for i in range(0, len(x), batch_size):
                xb, yb = x[i:i + batch_size], y[i:i + batch_size]
                losses.append(self.model.loss(xb, yb) * len(xb))
                self.model.step(xb, yb)
        return float(sum(losses) / max(1, len(x)))

    def compute_gradients(self, x, y):
        x = np.asarray(x, np.float32)
        y = np.asarray(y)
        return self.model.gradients(x, y), self.model.loss(x, y)

    def apply_gradients(self, grads):
        self.model.apply([np.asarray(g, np.float32) for g in grads])

    def evaluate(self, x, y, batch_size=512):
        x = np.asarray(x, np.float32)
        y = np.asarray(y)
        p = self.model.probs(x)
        return (float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-9))),
                float(np.mean(p.argmax(axis=1) == y)))

    def get_optimizer_state(self):
        if not isinstance(self.model, MomentumModel):
            return None
        return [a.copy() for a in self.model.velocity] + [np.array(self.model.steps)]

    def set_optimizer_state(self, state):
        *velocity, steps = state
        self.model.velocity = [np.array(v, copy=True) for v in velocity]
        self.model.steps = np.array(steps)

    def get_learning_rate(self):
        return float(self.model.lr)

    def set_learning_rate(self, rate):
        self.model.lr = float(rate)

    @classmethod
    def local_model(cls, model_fn, weights, options=None):
        model = model_fn()
        model.set_weights(weights)
        return model

    @classmethod
    def save(cls, model, path):
        np.savez(path, *model.get_weights())


class NumpyTrainer(TrainerActor):
    adapter_cls = NumpyAdapter


def blobs(n_train: int = 400, n_test: int = 200, num_classes: int = 4, side: int = 8,
          seed: int = 1):
    """A learnable task in NHWC image form: each class is a noisy fixed prototype."""
    rng = np.random.default_rng(seed)
    protos = rng.normal(0, 1, (num_classes, side, side, 1)).astype(np.float32)

    def make(n):
        y = rng.integers(0, num_classes, n)
        x = protos[y] + rng.normal(0, 1.5, (n, side, side, 1)).astype(np.float32)
        return x.astype(np.float32), y.astype(np.int64)

    return make(n_train), make(n_test)


def blobs_dataset():
    return blobs()


def hard_blobs_dataset():
    """Noisier blobs: accuracy starts near chance (0.25) and rises over a few epochs."""
    rng = np.random.default_rng(7)
    protos = rng.normal(0, 1, (4, 8, 8, 1)).astype(np.float32)

    def make(n):
        y = rng.integers(0, 4, n)
        x = protos[y] + rng.normal(0, 4.0, (n, 8, 8, 1)).astype(np.float32)
        return x.astype(np.float32), y.astype(np.int64)

    return make(600), make(400)


class ConstantDeltaTrainer(NumpyTrainer):
    """Returns delta = 1 for every weight: the driver's arithmetic becomes checkable."""

    def fit(self, x, y, epochs, batch_size):
        import time

        time.sleep(0.01 * (1 + self._ddlf_index))  # uneven speeds: staleness happens
        self.model.set_weights([w - 1.0 for w in self.model.get_weights()])
        return 0.0


class SlowFirstTrainer(NumpyTrainer):
    """Trainer 0 is 8x slower than the others, so trainers drift apart without SSP."""

    def fit(self, x, y, epochs, batch_size):
        import time

        time.sleep(0.08 if self._ddlf_index == 0 else 0.01)
        return super().fit(x, y, epochs, batch_size)


def failing_model_fn():
    raise ZeroDivisionError("model_fn failed on purpose")


BIG_ROWS = 30000  # 30000 x 32 x 32 x 1 float32 = 123 MB


def big_dataset():
    """A dataset large enough that a private copy per trainer shows in its USS."""
    x = np.full((BIG_ROWS, 32, 32, 1), 0.25, np.float32)
    y = (np.arange(BIG_ROWS) % 4).astype(np.int64)
    return (x, y), (x[:100].copy(), y[:100].copy())


def touch_all_pages(self):
    """Read every byte of the trainer's ``x`` (run on a trainer with run_method); return
    the sum and how much that reading grew this process's USS and RSS."""
    import os

    import psutil

    proc = psutil.Process(os.getpid())
    before = proc.memory_full_info()
    total = float(self.x.sum(dtype=np.float64))  # reads every page, no temporary copy
    after = proc.memory_full_info()
    return {"sum": total, "uss_growth": after.uss - before.uss,
            "rss_growth": after.rss - before.rss, "uss": after.uss, "pid": os.getpid()}


class DiesInRoundTwo(NumpyTrainer):
    """Trainer 1's process exits hard in its second train call."""

    def fit(self, x, y, epochs, batch_size):
        self._calls = getattr(self, "_calls", 0) + 1
        if self._ddlf_index == 1 and self._calls == 2:
            import os

            os._exit(1)
        return super().fit(x, y, epochs, batch_size)


class SigkillOnce(NumpyTrainer):
    """SIGKILLs its own process mid-``fit`` once per run, like ``kill -9`` from outside.

    Set in the trainers' environment (``runtime_env={"env_vars": ...}``):
    ``DDLF_TEST_KILL_DIR``, a directory for the once-only marker; ``DDLF_TEST_KILL_SLOT``
    (default 1), the slot whose trainer dies; ``DDLF_TEST_KILL_CALL`` (default 2), in
    which of its ``fit`` calls. The marker file makes it once per run: the replacement,
    and every later run with the same directory, train normally.
    """

    def fit(self, x, y, epochs, batch_size):
        import os
        import signal
        import time

        self._fits = getattr(self, "_fits", 0) + 1
        where = os.environ.get("DDLF_TEST_KILL_DIR")
        if (where and self._ddlf_index == int(os.environ.get("DDLF_TEST_KILL_SLOT", "1"))
                and self._fits == int(os.environ.get("DDLF_TEST_KILL_CALL", "2"))):
            try:
                fd = os.open(os.path.join(where, "killed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                time.sleep(0.05)   # mid-round: the other trainers are busy too
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(os.environ.get("DDLF_TEST_FIT_SLEEP", "0")))
        return super().fit(x, y, epochs, batch_size)


class MomentumModel(SoftmaxModel):
    """Softmax regression trained with momentum SGD: it has optimizer state to keep."""

    def __init__(self, *args, momentum: float = 0.9, **kw):
        super().__init__(*args, **kw)
        self.momentum = momentum
        self.velocity = [np.zeros_like(w) for w in self.w]
        self.steps = np.zeros((), np.int64)

    def apply(self, grads):
        before = [w.copy() for w in self.w]
        super().apply(grads)
        for i, (b, w) in enumerate(zip(before, self.w)):
            self.velocity[i] = self.momentum * self.velocity[i] + (w - b)
            self.w[i] = b + self.velocity[i]
        self.steps = self.steps + 1


def momentum_model_fn(num_features: int = 64, num_classes: int = 4):
    return lambda: MomentumModel(num_features, num_classes)


class MomentumTrainer(NumpyTrainer):
    """A numpy trainer whose model has optimizer state (velocities and a step count)."""

    def describe(self):
        out = super().describe()
        out["steps"] = int(self.model.steps)
        return out


class FailsWhenReplaced(SigkillOnce):
    """Slot 1's first trainer SIGKILLs itself in its second fit; its replacement's
    ``__init__`` raises, so the slot cannot be refilled."""

    def __init__(self, model_fn, dataset, index=0, num_cpus=1):
        import os

        where = os.environ.get("DDLF_TEST_KILL_DIR", "")
        if index == 1 and where and os.path.exists(os.path.join(where, "killed")):
            raise RuntimeError("replacement refuses to start")
        super().__init__(model_fn, dataset, index, num_cpus)


class VirtualSpeedTrainer(NumpyTrainer):
    """Reports ``compute_s`` as samples × a fixed cost per sample, slot 0 ``factor`` times
    the others, without sleeping: ``balance=True`` then sees exactly known rates, so its
    partitions (and a resumed run's) are deterministic.

    Env: ``DDLF_TEST_COST_S`` (0.001 s per sample), ``DDLF_TEST_SLOW_FACTOR`` (4).
    """

    def _train_from_start(self, *args, **kwargs):
        # Under train() and allreduce's hold_delta alike.
        import os

        old, delta, stats = super()._train_from_start(*args, **kwargs)
        cost = float(os.environ.get("DDLF_TEST_COST_S", "0.001"))
        if self._ddlf_index == 0:
            cost *= float(os.environ.get("DDLF_TEST_SLOW_FACTOR", "4"))
        stats["compute_s"] = stats["samples"] * cost
        return old, delta, stats


class SlowOneTrainer(NumpyTrainer):
    """Sleeps a fixed time per sample in ``fit``, slot 0 ``factor`` times longer: a real
    slow node (its ``compute_s`` shows it).

    Env: ``DDLF_TEST_COST_S`` (0.0005 s per sample), ``DDLF_TEST_SLOW_FACTOR`` (4).
    """

    def fit(self, x, y, epochs, batch_size):
        import os
        import time

        cost = float(os.environ.get("DDLF_TEST_COST_S", "0.0005"))
        if self._ddlf_index == 0:
            cost *= float(os.environ.get("DDLF_TEST_SLOW_FACTOR", "4"))
        time.sleep(cost * len(x) * epochs)
        return super().fit(x, y, epochs, batch_size)


class GatedTrainer(NumpyTrainer):
    """Slot 0's first ``fit`` waits until the file ``$DDLF_TEST_GATE_DIR/open`` exists: the
    test decides when that trainer's delta can come back (a straggler without timings).

    With ``DDLF_TEST_KILL_DIR`` set, once the gate opens slot 0 SIGKILLs itself instead of
    returning (once per run: a marker file there), so it is lost while late. Every delta
    is ``slot + 1`` in every weight (``set_weights`` math is then checkable), whatever the
    data.
    """

    def fit(self, x, y, epochs, batch_size):
        import os
        import signal
        import time

        self._fits = getattr(self, "_fits", 0) + 1
        gate = os.environ.get("DDLF_TEST_GATE_DIR")
        if gate and self._ddlf_index == 0 and self._fits == 1:
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(gate, "open")):
                if time.monotonic() > deadline:
                    raise TimeoutError("the test never opened the gate")
                time.sleep(0.01)
            where = os.environ.get("DDLF_TEST_KILL_DIR")
            if where:
                try:
                    fd = os.open(os.path.join(where, "killed"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass
                else:
                    os.close(fd)
                    os.kill(os.getpid(), signal.SIGKILL)
        self.model.set_weights([w - float(self._ddlf_index + 1)
                                for w in self.model.get_weights()])
        return 0.0


class SlowEvalTrainer(NumpyTrainer):
    """Evaluating its test shard takes 0.2 s: long next to a round of training."""

    def evaluate_arrays(self, x, y, batch_size=512):
        import time

        time.sleep(0.2)
        return super().evaluate_arrays(x, y, batch_size)


class RateEchoTrainer(NumpyTrainer):
    """Trains as NumpyTrainer but reports the learning rate it trained at as its loss, so
    a history row's train_loss shows the rate the trainers really used."""

    def fit(self, x, y, epochs, batch_size):
        super().fit(x, y, epochs, batch_size)
        return float(self.model.lr)


class ConstantDeltaSigkillOnce(SigkillOnce, ConstantDeltaTrainer):
    """ConstantDeltaTrainer's arithmetic, and SigkillOnce's fault (see both)."""


class SigkillInCollective(NumpyTrainer):
    """SIGKILLs its own process inside an allreduce, once per run, right after sending a
    chunk to its ring neighbour.

    Environment as for :class:`SigkillOnce`: ``DDLF_TEST_KILL_DIR`` (the once-only
    marker), ``DDLF_TEST_KILL_SLOT`` (default 1), ``DDLF_TEST_KILL_ROUND`` (default 2) and
    ``DDLF_TEST_KILL_SENDS`` (default 3: in a ring of 3, after the first all-gather chunk,
    so one member completes the collective and another cannot). Each ``fit`` sleeps
    ``DDLF_TEST_FIT_SLEEP`` seconds, so a replacement has rounds left to join.
    """

    def fit(self, x, y, epochs, batch_size):
        import os
        import time

        time.sleep(float(os.environ.get("DDLF_TEST_FIT_SLEEP", "0")))
        return super().fit(x, y, epochs, batch_size)

    def ring_send(self, right, tag, phase, step, chunk):
        import os
        import signal
        import time

        ref = super().ring_send(right, tag, phase, step, chunk)
        where = os.environ.get("DDLF_TEST_KILL_DIR")
        if not where or self._ddlf_index != int(os.environ.get("DDLF_TEST_KILL_SLOT", "1")) \
                or tag[1] != int(os.environ.get("DDLF_TEST_KILL_ROUND", "2")):
            return ref
        self._sends = getattr(self, "_sends", 0) + 1
        if self._sends == int(os.environ.get("DDLF_TEST_KILL_SENDS", "3")):
            try:
                fd = os.open(os.path.join(where, "killed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return ref
            os.write(fd, f"{os.getpid()} {tag} {phase} {step}".encode())
            os.close(fd)
            time.sleep(0.2)   # the chunk reaches the neighbour: the ring is half way
            os.kill(os.getpid(), signal.SIGKILL)
        return ref


class SigkillEveryTrainerOnce(NumpyTrainer):
    """Every trainer SIGKILLs itself in its ``DDLF_TEST_KILL_CALL``-th fit (default 2),
    once per slot and run (markers ``killed-<slot>`` in ``DDLF_TEST_KILL_DIR``)."""

    def fit(self, x, y, epochs, batch_size):
        import os
        import signal

        self._fits = getattr(self, "_fits", 0) + 1
        where = os.environ.get("DDLF_TEST_KILL_DIR")
        if where and self._fits == int(os.environ.get("DDLF_TEST_KILL_CALL", "2")):
            try:
                fd = os.open(os.path.join(where, f"killed-{self._ddlf_index}"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return super().fit(x, y, epochs, batch_size)


class DriftingTrainer(NumpyTrainer):
    """Trainer 1 nudges its weights by one ulp after each allreduce from round 2 on, as a
    buggy collective would: the trainers then disagree, which the driver must notice."""

    def allreduce_held(self, tag, *args, **kwargs):
        reply = super().allreduce_held(tag, *args, **kwargs)
        if self._ddlf_index == 1 and tag[1] >= 2 and reply["status"] == "done":
            w = self.get_weights()
            w[1] = np.nextafter(w[1], np.float32(np.inf))
            self.set_weights(w)
            reply["digest"] = ring.weights_digest(w)
        return reply


class HangsInCollective(NumpyTrainer):
    """Trainer 1 stops for ``DDLF_TEST_HANG_S`` seconds before its first send of round 2,
    once per run (marker ``hung`` in ``DDLF_TEST_KILL_DIR``): alive, but silent, as a
    process stuck in swap or a stalled link would be."""

    def ring_send(self, right, tag, phase, step, chunk):
        import os
        import time

        where = os.environ.get("DDLF_TEST_KILL_DIR")
        if where and self._ddlf_index == 1 and tag[1] == 2 and phase == "rs" and step == 0:
            try:
                os.close(os.open(os.path.join(where, "hung"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                time.sleep(float(os.environ.get("DDLF_TEST_HANG_S", "2")))
        return super().ring_send(right, tag, phase, step, chunk)


class SigkillInInit(NumpyTrainer):
    """SIGKILLs its own process in ``__init__``, right after building its model (as the
    OOM killer or a preempted machine would while a trainer starts), once per run: the
    marker ``init-killed`` in ``DDLF_TEST_KILL_DIR`` makes its replacement start normally.
    ``DDLF_TEST_KILL_SLOT`` (default 1) is the slot whose first trainer dies; each
    ``fit`` sleeps ``DDLF_TEST_FIT_SLEEP`` seconds."""

    def build_model(self, model_fn):
        import os
        import signal

        model = super().build_model(model_fn)
        where = os.environ.get("DDLF_TEST_KILL_DIR")
        if where and self._ddlf_index == int(os.environ.get("DDLF_TEST_KILL_SLOT", "1")):
            try:
                fd = os.open(os.path.join(where, "init-killed"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return model

    def fit(self, x, y, epochs, batch_size):
        import os
        import time

        time.sleep(float(os.environ.get("DDLF_TEST_FIT_SLEEP", "0")))
        return super().fit(x, y, epochs, batch_size)


class KillsItself:
    """A ``model_fn`` whose process SIGKILLs itself every time it runs, after writing
    ``try-<pid>`` into ``directory`` (the test counts the tries): a model that never fits
    in memory, as the OOM killer sees it."""

    def __init__(self, directory: str):
        self.directory = directory

    def __call__(self):
        import os
        import signal

        with open(os.path.join(self.directory, f"try-{os.getpid()}"), "w") as f:
            f.write("")
        os.kill(os.getpid(), signal.SIGKILL)


class RaisesInModelFn:
    """A ``model_fn`` that raises ``ZeroDivisionError`` every time, after writing
    ``try-<pid>`` into ``directory``."""

    def __init__(self, directory: str):
        self.directory = directory

    def __call__(self):
        import os

        with open(os.path.join(self.directory, f"try-{os.getpid()}"), "w") as f:
            f.write("")
        return 1 / 0


class NoGradients(NumpyTrainer):
    """A trainer of its own framework: fit and weights, but no gradient hooks."""

    adapter_cls = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.adapter = None

    def get_weights(self):
        return self.model.get_weights()

    def set_weights(self, weights):
        self.model.set_weights(weights)

    def fit(self, x, y, epochs, batch_size):
        return 0.0

    def evaluate_arrays(self, x, y, batch_size=512):
        return 0.0, 0.0
