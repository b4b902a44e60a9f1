"""The framework settings of a run (``optimizer=``, ``loss=``, ``keras_backend=``): checked
by name, handed to the trainers, refused for the other framework; the driver builds no
optimizer; the GPU note. In-process, on the fake backend."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_modules.numpy_trainer import hard_blobs_dataset
from helpers_modules.torch_trainer import Sgd, TinyTorch, TorchTrainer

from ddlf_actors.apps import checkpoint, train_sync
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.config import ConfigError, TrainConfig

RUN = dict(workers=2, master_epochs=1, rounds_per_epoch=2, seed=1, progress=False)


def test_bad_values_are_refused_by_name_before_anything_starts():
    torch = pytest.importorskip("torch")
    with pytest.raises(ConfigError, match="^optimizer .*callable"):
        TrainConfig(optimizer="sgd")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="^optimizer .*not an optimizer"):
        TrainConfig(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="^loss .*callable"):
        TrainConfig(loss="cross_entropy")
    with pytest.raises(ConfigError, match="^keras_backend .*'jax'"):
        TrainConfig(keras_backend="mxnet")
    config = TrainConfig(optimizer=Sgd(0.1), keras_backend="jax",
                         trainer_options={"num_gpus": 1})
    assert config.framework_options() == {"optimizer": config.optimizer,
                                          "keras_backend": "jax", "num_gpus": 1}
    assert TrainConfig().framework_options() == {}
    # A checkpoint records them by name: a lambda's repr would change every run.
    assert TrainConfig(loss=lambda o, t: o).to_json()["loss"].endswith("<lambda>")


def test_optimizer_and_loss_reach_the_trainers(tmp_path):
    pytest.importorskip("torch")
    # Momentum: the optimizer the trainers built has state; plain SGD has none.
    result = train_sync(TinyTorch(), hard_blobs_dataset, trainer_cls=TorchTrainer,
                        backend=FakeBackend(), optimizer=Sgd(0.5, momentum=0.9),
                        checkpoint_dir=str(tmp_path), **RUN)
    assert checkpoint.load(str(tmp_path)).optimizer_states
    plain = train_sync(TinyTorch(), hard_blobs_dataset, trainer_cls=TorchTrainer,
                       backend=FakeBackend(), optimizer=Sgd(0.5),
                       checkpoint_dir=str(tmp_path / "p"), **RUN)
    assert not checkpoint.load(str(tmp_path / "p")).optimizer_states
    assert result.framework == plain.framework == "torch"

    calls = []

    def loss(output, target):
        import torch.nn.functional as F

        calls.append(len(target))
        return F.cross_entropy(output, target)

    train_sync(TinyTorch(), hard_blobs_dataset, trainer_cls=TorchTrainer,
               backend=FakeBackend(), loss=loss, **RUN)
    assert calls and sum(calls) >= 600   # every training batch (and the evaluations)


def test_result_model_is_the_module_and_no_optimizer_is_built_on_the_driver(monkeypatch):
    torch = pytest.importorskip("torch")
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    result = train_sync(TinyTorch(batchnorm=True), hard_blobs_dataset, trainer_cls=TorchTrainer,
                        backend=FakeBackend(), optimizer=Sgd(0.5), **RUN)

    def no_optimizer_here(*args, **kwargs):
        raise AssertionError("an optimizer was built on the driver")

    monkeypatch.setattr(TorchAdapter, "__init__", no_optimizer_here)
    model = result.model
    assert isinstance(model, torch.nn.Module)
    state = model.state_dict()
    assert list(state) == ["2.weight", "2.bias", "2.running_mean", "2.running_var",
                           "2.num_batches_tracked", "4.weight", "4.bias"]
    assert len(result.weights) == len(state)
    for w, t in zip(result.weights, state.values()):
        assert w.dtype == t.numpy().dtype and w.tobytes() == t.numpy().tobytes()


def test_a_keras_model_refuses_optimizer_and_loss_by_name():
    pytest.importorskip("keras")
    from helpers_modules.keras_defs import tiny_keras_model

    for name in ("optimizer", "loss"):
        with pytest.raises(ConfigError, match=f"^{name}= applies to PyTorch models"):
            train_sync(tiny_keras_model, hard_blobs_dataset, backend=FakeBackend(),
                       **{name: Sgd(0.1)}, **RUN)


def test_a_torch_module_refuses_keras_backend_by_name(monkeypatch):
    import sys

    pytest.importorskip("torch")
    # In-process trainers share this process's Keras, if imported: ask for its backend.
    keras = sys.modules.get("keras")
    backend = keras.backend.backend() if keras is not None else "tensorflow"
    monkeypatch.setenv("KERAS_BACKEND", backend)   # restored afterwards
    with pytest.raises(ConfigError, match=f"^keras_backend='{backend}' applies to Keras"):
        train_sync(TinyTorch(), hard_blobs_dataset, trainer_cls=TorchTrainer,
                   backend=FakeBackend(), keras_backend=backend, **RUN)


def test_adapters_report_their_buffers():
    torch = pytest.importorskip("torch")
    from ddlf_actors.apps.frameworks.torch import TorchAdapter

    model = TinyTorch(batchnorm=True)()
    assert TorchAdapter(model).buffer_mask() == [False, False, True, True, True, False, False]
    shared = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    shared[1].weight = shared[0].weight     # a parameter under two names
    assert TorchAdapter(shared).buffer_mask() == [False] * 4
    pytest.importorskip("keras")
    from helpers_modules.keras_defs import bn_model_fn

    from ddlf_actors.apps.frameworks.keras import KerasAdapter

    keras_bn = KerasAdapter(bn_model_fn())
    assert keras_bn.buffer_mask() == [False, False, True, True, False, False]
    assert len(keras_bn.buffer_mask()) == len(keras_bn.get_weights())


def test_the_driver_says_once_that_trainers_run_on_the_cpu(capsys, caplog):
    from ddlf_actors.apps.schemes.driver import _say_gpu_note

    reason = "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
    _say_gpu_note(TrainConfig(progress=True), [{"cuda_failure": reason}] * 2)
    err = capsys.readouterr().err
    assert err.count("trainers run on the CPU") == 1 and "num_gpus=0" in err
    _say_gpu_note(TrainConfig(progress=True), [{"cuda_failure": None}, {}])
    assert capsys.readouterr().err == ""
    with caplog.at_level("WARNING", logger="ddlf_actors.train"):
        _say_gpu_note(TrainConfig(trainer_options={"num_gpus": 1}), [{"cuda_failure": reason}])
    assert "could not start CUDA" in caplog.text and "303" in caplog.text


def test_threads_follow_num_cpus_when_torch_is_imported(monkeypatch):
    """In a fresh process: ``limit_threads`` before torch is imported (as a trainer calls
    it before model_fn), then the import sets torch's threads; with 2, OpenMP sleeps."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    code = ("import os\nos.environ.pop('OMP_WAIT_POLICY', None)\n"
            "from ddlf_actors.apps.frameworks.threads import limit_threads\n"
            "limit_threads({n})\nimport torch\n"
            "print(torch.get_num_threads(), torch.get_num_interop_threads(), "
            "os.environ.get('OMP_WAIT_POLICY'))\n")
    for n, policy in ((1, "None"), (2, "PASSIVE")):
        out = subprocess.run([sys.executable, "-c", code.format(n=n)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == [str(n), "1", policy]


def test_jax_gets_one_thread_when_imported_by_a_one_thread_trainer():
    import subprocess
    import sys

    pytest.importorskip("jax")
    code = ("import os\nos.environ.pop('XLA_FLAGS', None)\n"
            "from ddlf_actors.apps.frameworks.threads import limit_threads\n"
            "limit_threads(1)\nassert 'XLA_FLAGS' not in os.environ\n"
            "import jax, jax.numpy as jnp\nprint(os.environ['XLA_FLAGS'])\n"
            "print(float(jnp.ones(3).sum()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    flags, total = out.stdout.splitlines()
    assert flags == "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    assert np.isclose(float(total), 3.0)
