"""The paper's App API end to end, on a tiny Keras model (needs TensorFlow)."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

pytest.importorskip("keras")
from helpers_modules.keras_defs import BlobsApp  # noqa: E402


def _tf_threads(self):
    import tensorflow as tf

    return (tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads())


def test_app_end_to_end(train_cluster, tmp_path):
    async def main():
        app = BlobsApp(workers=2, progress=False)
        await app.connect()
        await app.load_dataset()
        await app.create_model()
        assert app.x_train.shape == (600, 8, 8, 1)  # loaded on the master too, as in the paper
        result = await app.train_sync(master_epochs=3, worker_epochs=1, batch_size=16)
        assert len(result.history) == 3
        assert result.history[-1]["test_accuracy"] > 0.5
        evaluated = await app.evaluate_model()
        assert evaluated["test_accuracy"] == pytest.approx(result.history[-1]["test_accuracy"],
                                                           abs=1e-6)
        # App.cluster: the paper's Cluster API over the same trainers.
        sizes = await app.cluster.run_method(lambda self: len(self.x))
        assert sizes == [600, 600]
        pids = await app.cluster.run_method(lambda self: os.getpid())
        threads = await app.cluster.run_method(_tf_threads)
        assert threads == [(1, 1), (1, 1)]  # intra-op = the trainer's num_cpus, inter-op = 1
        result2 = await app.train_async(master_epochs=1, worker_epochs=1, batch_size=16)
        assert result2.history[-1]["test_accuracy"] is not None
        assert await app.cluster.run_method(lambda self: os.getpid()) == pids  # same workers
        path = str(tmp_path / "model.keras")
        await app.save_model(path)
        x = app.x_test[:50]
        expected = app.model.predict(x, verbose=0)
        other = BlobsApp(workers=2, progress=False)
        loaded = await other.load_model(path)
        np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
        for a, b in zip(loaded.get_weights(), result2.weights):
            np.testing.assert_array_equal(a, b)
        await app.close()

    asyncio.run(main())
