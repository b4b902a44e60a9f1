"""What a user sees of a run besides its table: the model's name (dashboard, checkpoints)
and the training plot (``training.png``). No cluster, no TensorFlow."""

from __future__ import annotations

import pytest

from ddlf_actors.apps import models, report
from ddlf_actors.apps.cli import _ModelFn
from ddlf_actors.apps.schemes.driver import describe_callable


def test_the_clis_model_is_named_for_the_model_it_builds():
    assert describe_callable(_ModelFn((28, 28, 1))) == "paper_cnn"
    # Functions, classes and unnamed objects are described as before (checkpoints of
    # runs with them stay comparable).
    assert describe_callable(models.paper_cnn) == "ddlf_actors.apps.models.paper_cnn"
    assert describe_callable("fashion-mnist") == "fashion-mnist"

    class Unnamed:
        def __call__(self):
            return None

    assert describe_callable(Unnamed()).endswith("Unnamed")


def _history(rounds_per_epoch: int, epochs: int) -> list:
    """Rows as a sync run writes them: one per round, evaluated at each epoch's end."""
    rows = []
    for e in range(epochs):
        for r in range(rounds_per_epoch):
            last = r == rounds_per_epoch - 1
            n = e * rounds_per_epoch + r + 1
            rows.append({"round": n, "epoch": n / rounds_per_epoch, "time_s": 2.0 * n,
                         "train_loss": 1.0 / n,
                         "test_accuracy": 0.5 + 0.1 * e if last else None,
                         "test_loss": 0.9 - 0.1 * e if last else None})
    return rows


def test_the_training_plot_draws_train_loss_every_round_and_test_curves_where_evaluated(
        tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    drawn = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (drawn.append(fig), close(fig)))
    history = _history(rounds_per_epoch=29, epochs=2)
    path = report.plot_history(history, str(tmp_path / "training.png"))
    assert (tmp_path / "training.png").stat().st_size > 0 and path.endswith("training.png")
    (fig,) = drawn
    acc_epoch, acc_time, loss_epoch, loss_time = fig.axes
    for ax, x in ((loss_epoch, "epoch"), (loss_time, "time_s")):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        assert list(lines["train"].get_xdata()) == [r[x] for r in history]   # all 58 rounds
        assert list(lines["train"].get_ydata()) == [r["train_loss"] for r in history]
        evaluated = [r for r in history if r["test_loss"] is not None]
        assert list(lines["test"].get_xdata()) == [r[x] for r in evaluated]   # 2 points
        assert list(lines["test"].get_ydata()) == [r["test_loss"] for r in evaluated]
    for ax in (acc_epoch, acc_time):
        (test,) = ax.get_lines()
        assert list(test.get_ydata()) == [0.5, 0.6]
