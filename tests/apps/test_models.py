"""``models.paper_cnn``: the optimizer it compiles (the trainers' inner optimizer)."""

from __future__ import annotations

import pytest

keras = pytest.importorskip("keras")

from ddlf_actors.apps import models  # noqa: E402


def test_paper_cnn_trains_with_adam_by_default_and_with_what_it_is_told():
    default = models.paper_cnn()
    assert isinstance(default.optimizer, keras.optimizers.Adam)
    assert float(default.optimizer.learning_rate) == pytest.approx(1e-3)
    assert default.count_params() == 515_146
    paper = models.paper_cnn(optimizer="sgd")
    assert type(paper.optimizer) is keras.optimizers.SGD
    assert float(paper.optimizer.learning_rate) == pytest.approx(0.01)
    assert float(paper.optimizer.momentum) == 0.0
    momentum = models.paper_cnn(optimizer="momentum", learning_rate=0.05)
    assert float(momentum.optimizer.momentum) == pytest.approx(0.9)
    assert float(momentum.optimizer.learning_rate) == pytest.approx(0.05)
    mine = keras.optimizers.RMSprop(0.002)
    assert models.paper_cnn(input_shape=(32, 32, 3), optimizer=mine).optimizer is mine


def test_paper_cnn_refuses_what_it_cannot_compile():
    with pytest.raises(ValueError, match="unknown optimizer 'adagrad'.*'adam', 'momentum', 'sgd'"):
        models.paper_cnn(optimizer="adagrad")
    with pytest.raises(ValueError, match="set the rate on the optimizer instance"):
        models.paper_cnn(optimizer=keras.optimizers.SGD(0.1), learning_rate=0.2)
