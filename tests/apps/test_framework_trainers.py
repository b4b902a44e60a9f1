"""PyTorch trainers and Keras on JAX in real trainer processes (one 2-CPU cluster).

What the in-process tests cannot see: each trainer's own process, where torch's and
JAX's thread settings and Keras' backend are made before the framework is first imported,
GPUs are hidden, and the App API keeps its trainers between runs.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from helpers_modules.numpy_trainer import blobs
from helpers_modules.torch_trainer import Sgd, TinyTorch

from ddlf_actors.apps import App, train_sync


def _trainer_state(self):
    import os
    import sys

    torch = sys.modules.get("torch")
    keras = sys.modules.get("keras")
    return {"threads": (torch.get_num_threads(), torch.get_num_interop_threads())
            if torch else None,
            "keras": keras.backend.backend() if keras else None,
            "framework": self.adapter.name if self.adapter else None,
            "tensorflow": "tensorflow" in sys.modules,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "xla_flags": os.environ.get("XLA_FLAGS"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


class TorchBlobsApp(App):
    """The paper's App style with a PyTorch module."""

    async def load_dataset(self):
        (self.x_train, self.y_train), (self.x_test, self.y_test) = blobs(600, 200)

    async def create_model(self):
        self.model = TinyTorch()()


def test_app_trains_a_torch_module_and_keeps_its_trainers(train_cluster, tmp_path):
    torch = pytest.importorskip("torch")

    async def main():
        app = TorchBlobsApp(workers=2, progress=False, optimizer=Sgd(0.5, momentum=0.5))
        await app.connect()
        result = await app.train_sync(master_epochs=2, rounds_per_epoch=2, batch_size=16)
        assert result.framework == "torch" and result.history[-1]["test_accuracy"] > 0.8
        states = await app.cluster.run_method(_trainer_state)
        for s in states:
            assert s["framework"] == "torch" and s["threads"] == (1, 1)
            assert not s["tensorflow"]          # a PyTorch trainer never loads TF
            assert s["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES", "")
        evaluated = await app.evaluate_model()
        assert evaluated["test_accuracy"] == pytest.approx(result.history[-1]["test_accuracy"])
        path = await app.save_model(str(tmp_path / "model.pt"))
        other = TorchBlobsApp(workers=2, progress=False)
        loaded = await other.load_model(path)
        for a, b in zip(loaded.state_dict().values(), result.weights):
            np.testing.assert_array_equal(a.numpy(), b)
        assert isinstance(loaded, torch.nn.Module)
        with pytest.raises(ValueError, match="set once for the app's trainers"):
            await app.train_sync(master_epochs=1, optimizer=Sgd(0.1))
        await app.close()

    asyncio.run(main())


def test_a_two_cpu_torch_trainer_runs_two_passive_threads(train_cluster):
    pytest.importorskip("torch")

    async def main():
        app = TorchBlobsApp(workers=1, num_cpus=2, progress=False)
        try:
            await app.start_workers()
            (state,) = await app.cluster.run_method(_trainer_state)
            assert state["threads"] == (2, 1)
            assert state["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
        finally:
            await app.close()

    asyncio.run(main())


def keras_on_jax_model():
    """A tiny Keras model that fails to build unless Keras runs on JAX."""
    import keras
    from helpers_modules.keras_defs import tiny_keras_model

    assert keras.backend.backend() == "jax", keras.backend.backend()
    return tiny_keras_model()


@pytest.mark.timeout(300)
def test_keras_backend_jax_runs_the_keras_model_on_jax_in_the_trainers(train_cluster):
    pytest.importorskip("jax")
    pytest.importorskip("keras")
    result = train_sync(keras_on_jax_model, lambda: blobs(600, 200), workers=2,
                        master_epochs=2, rounds_per_epoch=2, batch_size=16,
                        keras_backend="jax", progress=False)
    assert result.framework == "keras"
    assert result.history[-1]["test_accuracy"] > 0.8
