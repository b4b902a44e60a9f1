"""The paper's CNN on real Fashion-MNIST (Debian's dataset-fashion-mnist, or DDLF_DATA_DIR)."""

from __future__ import annotations

import pytest

pytest.importorskip("keras")
from helpers_modules.keras_defs import fashion_mnist_2000  # noqa: E402

from ddlf_actors.apps import datasets, models, train_sync  # noqa: E402


def _have_fashion_mnist() -> bool:
    try:
        datasets.load("fashion-mnist", download=False)
    except datasets.DatasetNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _have_fashion_mnist(),
                    reason="Fashion-MNIST not on this machine (apt-get install "
                           "dataset-fashion-mnist, or set DDLF_DATA_DIR)")
def test_paper_cnn_learns_fashion_mnist_in_one_round(train_cluster):
    result = train_sync(models.paper_cnn, fashion_mnist_2000, workers=2, master_epochs=1,
                        worker_epochs=3, batch_size=32, progress=False)
    row = result.history[-1]
    assert row["round"] == 1 and row["samples"] == 2000
    assert row["test_accuracy"] > 0.5, row  # chance is 0.1
