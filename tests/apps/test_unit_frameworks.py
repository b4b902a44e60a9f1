"""The framework adapter contract (apps/frameworks), run against every adapter: Keras and
PyTorch, with tiny models in this process, no cluster.

Each framework is a ``Kit``: how to build a small model with a given optimizer and how
to read a saved model back. The tests are written once against the adapter interface
and parametrized over the kits; a framework whose package is missing is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from ddlf_actors.apps import frameworks

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPE = (4, 4, 1)      # NHWC images, as the datasets give them
CLASSES = 3
BATCH = 8


def _task(seed: int = 0, n: int = 48):
    """A linearly learnable task: the class is the argmax of three fixed projections."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n,) + SHAPE).astype(np.float32)
    proj = np.random.default_rng(1234).normal(size=(int(np.prod(SHAPE)), CLASSES))
    y = np.argmax(x.reshape(n, -1) @ proj, axis=1).astype(np.int64)
    return x, y


class KerasKit:
    name = "keras"
    model_file = "model.keras"

    def __init__(self):
        from ddlf_actors.apps import tf_startup
        from ddlf_actors.apps.frameworks.keras import KerasAdapter

        with tf_startup.quiet_startup():   # on the TF backend, keras imports TF
            pytest.importorskip("keras")
        self.adapter_cls = KerasAdapter

    def model(self, seed: int, optimizer: str = "sgd", batchnorm: bool = False, lr=0.1):
        import keras
        from keras import layers

        from ddlf_actors.apps import tf_startup

        with tf_startup.quiet_startup():   # it imports TF, whatever the backend
            keras.utils.set_random_seed(seed)
        opt = {"sgd": lambda: keras.optimizers.SGD(learning_rate=lr),
               "momentum": lambda: keras.optimizers.SGD(learning_rate=lr, momentum=0.9,
                                                        nesterov=True),
               "adam": lambda: keras.optimizers.Adam(learning_rate=lr / 10)}[optimizer]()
        model = keras.Sequential(
            [keras.Input(shape=SHAPE), layers.Flatten()]
            + ([layers.BatchNormalization()] if batchnorm else [])
            + [layers.Dense(CLASSES, activation="softmax")])
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    def make(self, seed: int, optimizer: str = "sgd", batchnorm: bool = False, lr=0.1):
        return self.adapter_cls(self.model(seed, optimizer, batchnorm, lr))

    def model_fn(self, seed: int):
        return lambda: self.model(seed)

    def load_weights(self, path: str, model_fn):
        import keras

        return [np.asarray(w) for w in keras.saving.load_model(path).get_weights()]


class TorchKit:
    name = "torch"
    model_file = "model.pt"

    def __init__(self):
        pytest.importorskip("torch")
        from ddlf_actors.apps.frameworks.torch import TorchAdapter

        TorchAdapter.configure_threads(1)
        self.adapter_cls = TorchAdapter

    def model(self, seed: int, batchnorm: bool = False):
        import torch
        from torch import nn

        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(),
                             *([nn.BatchNorm1d(int(np.prod(SHAPE)))] if batchnorm else []),
                             nn.Linear(int(np.prod(SHAPE)), CLASSES))

    def make(self, seed: int, optimizer: str = "sgd", batchnorm: bool = False, lr=0.1):
        import torch

        opt = {"sgd": lambda p: torch.optim.SGD(p, lr=lr),
               "momentum": lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True),
               "adam": lambda p: torch.optim.Adam(p, lr=lr / 10)}[optimizer]
        return self.adapter_cls(self.model(seed, batchnorm), {"optimizer": opt})

    def model_fn(self, seed: int):
        return lambda: self.model(seed)

    def load_weights(self, path: str, model_fn):
        import torch

        model = model_fn()
        model.load_state_dict(torch.load(path))   # weights_only: no pickled code
        return [t.detach().numpy().copy() for t in model.state_dict().values()]


@pytest.fixture(params=[KerasKit, TorchKit], ids=["keras", "torch"], scope="module")
def kit(request):
    return request.param()


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b))


# -- weights --------------------------------------------------------------------------------


def test_weights_round_trip(kit):
    a, b = kit.make(0), kit.make(1)
    wa = a.get_weights()
    assert all(isinstance(w, np.ndarray) for w in wa)
    assert not _same(wa, b.get_weights())
    for w in wa:
        w.flags.writeable = False   # as weights arrive from the object store
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nothing to say about them on the terminal
        b.set_weights(wa)
    assert _same(b.get_weights(), wa)
    wa = [w.copy() for w in wa]
    # What get_weights returned is a copy: the trainer subtracts weights taken before
    # and after training.
    wa[0] += 1.0
    assert not _same(a.get_weights(), wa)


def test_set_weights_refuses_arrays_that_do_not_fit(kit):
    a = kit.make(0)
    w = a.get_weights()
    with pytest.raises(ValueError):
        a.set_weights(w[:-1])
    with pytest.raises(ValueError):
        a.set_weights([np.zeros((7, 7), np.float32)] + w[1:])


# -- training and evaluation ----------------------------------------------------------------


def test_fit_lowers_the_loss_on_a_learnable_task(kit):
    x, y = _task()
    a = kit.make(0)
    before, _ = a.evaluate(x, y)
    last = None
    for _ in range(6):
        last = a.fit(x, y, epochs=1, batch_size=BATCH)
    after, acc = a.evaluate(x, y)
    assert np.isfinite(last) and after < before * 0.8
    assert acc > 0.6


def test_fit_returns_the_mean_loss_of_the_last_pass(kit):
    x, y = _task()
    a = kit.make(0, lr=0.0)   # nothing moves, so every batch sees the same weights
    loss, _ = a.evaluate(x, y, batch_size=BATCH)
    assert a.fit(x, y, epochs=2, batch_size=BATCH) == pytest.approx(loss, rel=1e-5)


def test_evaluate_changes_nothing(kit):
    x, y = _task()
    a = kit.make(0, batchnorm=True)
    a.fit(x, y, epochs=1, batch_size=BATCH)
    w = a.get_weights()
    first = a.evaluate(x, y)
    assert _same(a.get_weights(), w)
    assert a.evaluate(x, y) == first
    # ... and training afterwards goes on as if no evaluation had run.
    b = kit.make(0, batchnorm=True)
    b.fit(x, y, epochs=1, batch_size=BATCH)
    a.fit(x, y, epochs=1, batch_size=BATCH)
    b.fit(x, y, epochs=1, batch_size=BATCH)
    assert _same(a.get_weights(), b.get_weights())


def test_accuracy_is_the_argmax_of_the_outputs(kit):
    x, y = _task()
    a = kit.make(0)
    _, acc = a.evaluate(x, y)
    _, acc_wrong = a.evaluate(x, (y + 1) % CLASSES)
    _, acc_other = a.evaluate(x, (y + 2) % CLASSES)
    # Every sample's argmax is one of the three labels: the three accuracies add up to 1.
    assert acc + acc_wrong + acc_other == pytest.approx(1.0)


# -- batch normalisation: float statistics and integer counters -----------------------------


def test_batchnorm_statistics_are_weights_and_keep_their_dtypes(kit):
    x, y = _task()
    a = kit.make(0, batchnorm=True)
    before = a.get_weights()
    a.fit(x, y, epochs=1, batch_size=BATCH)
    after = a.get_weights()
    assert [w.dtype for w in after] == [w.dtype for w in before]
    changed = [not np.array_equal(p, q) for p, q in zip(before, after)]
    assert all(changed), "every weight, statistic and counter moves in training"
    counters = [(p, q) for p, q in zip(before, after) if p.dtype.kind in "iu"]
    if kit.name == "torch":
        # BatchNorm's num_batches_tracked: an int64 counter of the batches trained.
        assert len(counters) == 1 and counters[0][1].dtype == np.int64
        assert int(counters[0][1]) - int(counters[0][0]) == len(x) // BATCH
    b = kit.make(1, batchnorm=True)
    b.set_weights(after)
    assert _same(b.get_weights(), after)


# -- optimizer state ------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_resumed_run_is_bit_equal(kit, optimizer):
    """Train k steps, keep weights and optimizer state, train k more; against: a fresh
    model (other initial weights) loaded with both, trained on the same k steps."""
    x, y = _task()
    first, second = slice(0, 24), slice(24, 48)
    a = kit.make(0, optimizer)
    a.fit(x[first], y[first], epochs=1, batch_size=BATCH)
    w, state = a.get_weights(), a.get_optimizer_state()
    assert state and all(isinstance(s, np.ndarray) for s in state)
    a.fit(x[second], y[second], epochs=1, batch_size=BATCH)

    b = kit.make(1, optimizer)
    b.set_weights(w)
    b.set_optimizer_state(state)
    assert _same(b.get_optimizer_state(), state)
    b.fit(x[second], y[second], epochs=1, batch_size=BATCH)
    assert _same(b.get_weights(), a.get_weights())

    # Without the state the same steps end elsewhere: the state is what made it equal.
    c = kit.make(1, optimizer)
    c.set_weights(w)
    c.fit(x[second], y[second], epochs=1, batch_size=BATCH)
    assert not _same(c.get_weights(), a.get_weights())


def test_optimizer_state_that_does_not_fit_is_refused(kit):
    x, y = _task()
    a = kit.make(0, "adam")
    a.fit(x, y, epochs=1, batch_size=BATCH)
    state = a.get_optimizer_state()
    b = kit.make(0, "adam", batchnorm=True)   # more parameters, so more state
    with pytest.raises(ValueError):
        b.set_optimizer_state(state[:-1])
    with pytest.raises(ValueError):
        b.set_optimizer_state([np.zeros((9, 9), np.float32) for _ in state])


def test_learning_rate_set_and_get(kit):
    x, y = _task()
    a = kit.make(0, lr=0.1)
    assert a.get_learning_rate() == pytest.approx(0.1, rel=1e-6)
    a.set_learning_rate(0.025)
    assert a.get_learning_rate() == pytest.approx(0.025, rel=1e-6)
    # The rate set is the one training uses: at 0 nothing moves.
    a.set_learning_rate(0.0)
    w = a.get_weights()
    a.fit(x, y, epochs=1, batch_size=BATCH)
    assert _same(a.get_weights(), w)


# -- the driver's side ----------------------------------------------------------------------


def test_local_model_and_save(kit, tmp_path):
    x, y = _task()
    a = kit.make(0)
    a.fit(x, y, epochs=1, batch_size=BATCH)
    w = a.get_weights()
    model = kit.adapter_cls.local_model(kit.model_fn(5), w)
    assert frameworks.for_model(model) is kit.adapter_cls
    assert kit.adapter_cls.model_file == kit.model_file
    path = str(tmp_path / kit.model_file)
    kit.adapter_cls.save(model, path)
    assert _same(kit.load_weights(path, kit.model_fn(6)), w)


def test_for_model_picks_the_adapter(kit):
    a = kit.make(0)
    assert frameworks.for_model(a.model) is kit.adapter_cls
    assert frameworks.get(kit.name) is kit.adapter_cls
    assert kit.name in frameworks.names()


def test_for_model_refuses_an_unknown_object_by_name():
    class MyModel:
        pass

    with pytest.raises(frameworks.UnknownFrameworkError) as info:
        frameworks.for_model(MyModel())
    text = str(info.value)
    assert "MyModel" in text and "keras" in text and "torch" in text
    assert "trainer_cls=" in text and "register" in text


# -- Keras on its JAX and torch backends ------------------------------------------------------


def test_keras_runs_on_the_backend_asked_for():
    from ddlf_actors.apps import tf_startup

    with tf_startup.quiet_startup():
        keras = pytest.importorskip("keras")
    assert keras.backend.backend() == os.environ.get("KERAS_BACKEND", "tensorflow")


_ON_BACKEND = ("keras and not another_backend and (backend_asked or weights_round_trip or "
               "resumed or learning_rate or for_model or evaluate_changes or batchnorm)")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_keras_adapter_works_unchanged_on_another_backend(backend):
    """The Keras contract tests above, in a process whose Keras runs on ``backend``
    (``KERAS_BACKEND`` is read once, when keras is first imported)."""
    pytest.importorskip(backend)
    pytest.importorskip("keras")
    env = dict(os.environ, KERAS_BACKEND=backend)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", os.path.abspath(__file__), "-k", _ON_BACKEND],
                          capture_output=True, text=True, env=env, cwd=_REPO, timeout=880)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"^8 passed", proc.stdout, re.M), proc.stdout[-2000:]


# -- PyTorch specifics ----------------------------------------------------------------------


def test_torch_takes_an_optimizer_factory_not_an_optimizer():
    torch = pytest.importorskip("torch")
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="callable"):
        TorchAdapter(model, {"optimizer": opt})
    with pytest.raises(TypeError, match="loss="):
        TorchAdapter(model, {"loss": "mse"})


def test_torch_defaults_are_paper_cnns_adam_1e_3_and_cross_entropy():
    torch = pytest.importorskip("torch")
    from ddlf_actors.apps import models
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    a = TorchAdapter(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)))
    # What paper_cnn compiles for Keras (models.OPTIMIZERS' default)
    assert type(a.optimizer) is torch.optim.Adam
    assert a.get_learning_rate() == models.OPTIMIZERS["adam"] == 1e-3
    x, y = _task()
    with torch.no_grad():
        expected = float(torch.nn.functional.cross_entropy(a.model(torch.from_numpy(x)),
                                                           torch.from_numpy(y)))
    assert a.evaluate(x, y)[0] == pytest.approx(expected, rel=1e-6)


def test_torch_evaluate_restores_train_mode_and_takes_read_only_arrays():
    torch = pytest.importorskip("torch")
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 3))
    a = TorchAdapter(model)
    x, y = _task()
    x.flags.writeable = False   # the trainers' datasets are read-only memory maps
    first = a.evaluate(x, y)
    assert a.evaluate(x, y) == first   # dropout off while evaluating
    assert model.training
    model.eval()
    a.evaluate(x, y)
    assert not model.training


def test_torch_threads_can_be_set_after_the_first_op():
    torch = pytest.importorskip("torch")
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    torch.ones(4) @ torch.ones(4)   # an op has run (model_fn builds the model first)
    try:
        TorchAdapter.configure_threads(2)
        assert torch.get_num_threads() == 2
        TorchAdapter.configure_threads(1)   # again: the inter-op pool is set once, no error
        assert torch.get_num_threads() == 1 and torch.get_num_interop_threads() == 1
    finally:
        TorchAdapter.configure_threads(1)


def test_paper_cnn_torch_matches_the_keras_model():
    torch = pytest.importorskip("torch")
    from ddlf_actors.apps import models

    model = models.paper_cnn_torch()
    assert sum(p.numel() for p in model.parameters()) == 515_146
    out = model(torch.zeros(5, 28, 28, 1))     # NHWC in, logits out
    assert tuple(out.shape) == (5, 10)
    cifar = models.paper_cnn_torch(input_shape=(32, 32, 3))
    assert tuple(cifar(torch.zeros(2, 32, 32, 3)).shape) == (2, 10)
    keras = pytest.importorskip("keras")
    assert keras is not None
    from ddlf_actors.apps import tf_startup

    tf_startup.import_tensorflow()
    reference = models.paper_cnn(input_shape=(32, 32, 3))
    assert sum(p.numel() for p in cifar.parameters()) == reference.count_params()


def test_importing_the_adapters_and_models_imports_no_framework():
    code = ("import sys\n"
            "from ddlf_actors.apps import frameworks, models\n"
            "import ddlf_actors.apps.frameworks.torch\n"
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'jax')"
            " if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=_REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_state_taken_before_the_first_step_puts_the_optimizer_back(kit):
    """What auto's start-up probe does (schemes/probe.py): take the weights and optimizer
    state of a fresh model, train a few steps, put both back; the run then trains exactly
    as the untouched model does."""
    x, y = _task()
    a, b = kit.make(0, "adam"), kit.make(0, "adam")
    w, state = a.get_weights(), a.get_optimizer_state()
    a.fit(x[:24], y[:24], epochs=1, batch_size=BATCH)   # the probe's steps
    a.set_weights(w)
    if state is not None:
        a.set_optimizer_state(state)
    else:
        a.reset_optimizer_state()
    a.fit(x[24:48], y[24:48], epochs=1, batch_size=BATCH)
    b.fit(x[24:48], y[24:48], epochs=1, batch_size=BATCH)
    assert _same(a.get_weights(), b.get_weights())


# -- data-parallel's hooks ----------------------------------------------------------------------
@pytest.mark.parametrize("optimizer,batchnorm", [("momentum", False), ("adam", True)])
def test_gradient_steps_are_the_steps_fit_takes(kit, optimizer, batchnorm):
    # compute_gradients then apply_gradients, batch by batch, is what fit does: the same
    # weights, buffers and optimizer state (what scheme='dataparallel' relies on, with
    # the mean over the trainers in between).
    x, y = _task(0)
    fitted, stepped = (kit.make(0, optimizer, batchnorm) for _ in range(2))
    assert stepped.gradients_missing() is None
    fitted.fit(x, y, 2, BATCH)
    for _ in range(2):
        for i in range(0, len(x), BATCH):
            grads, loss = stepped.compute_gradients(x[i:i + BATCH], y[i:i + BATCH])
            assert np.isfinite(loss) and len(grads) == len(list(
                w for w, buffer in zip(stepped.get_weights(), stepped.buffer_mask())
                if not buffer))
            stepped.apply_gradients(grads)
    for a, b in zip(fitted.get_weights(), stepped.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(fitted.get_optimizer_state(), stepped.get_optimizer_state()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compute_gradients_leaves_the_weights_alone(kit):
    x, y = _task(0)
    adapter = kit.make(0, "momentum")
    before = adapter.get_weights()
    adapter.compute_gradients(x[:BATCH], y[:BATCH])
    assert _same(before, adapter.get_weights())


def test_keras_off_tensorflow_says_data_parallel_needs_it(monkeypatch):
    kit = KerasKit()
    adapter = kit.make(0)
    import keras

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    assert "Keras on the 'jax' backend" in adapter.gradients_missing()
    assert "keras_backend='tensorflow'" in adapter.gradients_missing()
