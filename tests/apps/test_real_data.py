"""The paper's CNN on real Fashion-MNIST (Debian's dataset-fashion-mnist, or DDLF_DATA_DIR)."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("keras")
from helpers_modules.keras_defs import fashion_mnist_2000  # noqa: E402

from ddlf_actors.apps import datasets, models, train_sync  # noqa: E402

# Found with the driver's environment and handed to the trainers explicitly: they run
# with the tests' private DDLF_CACHE_DIR, so they would not look in the user's cache.
DATA_DIR = datasets.locate("fashion-mnist")


@pytest.mark.skipif(DATA_DIR is None,
                    reason="Fashion-MNIST not on this machine (apt-get install "
                           "dataset-fashion-mnist, or set DDLF_DATA_DIR)")
def test_paper_cnn_learns_fashion_mnist_in_one_round(train_cluster):
    # One round by choice: the default rounds of ~16 local steps would make two here.
    result = train_sync(models.paper_cnn, functools.partial(fashion_mnist_2000, DATA_DIR),
                        workers=2, master_epochs=1, rounds_per_epoch=1,
                        worker_epochs=8, batch_size=32, progress=False)
    row = result.history[-1]
    assert row["round"] == 1 and row["samples"] == 2000
    assert row["test_accuracy"] > 0.5, row  # chance is 0.1
