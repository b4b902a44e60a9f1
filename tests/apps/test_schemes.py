"""train_sync and train_async on a numpy trainer (no TensorFlow): seconds per test."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_modules.numpy_trainer import (
    ConstantDeltaTrainer,
    DiesInRoundTwo,
    NumpyTrainer,
    SlowFirstTrainer,
    blobs,
    failing_model_fn,
    hard_blobs_dataset,
    softmax_model_fn,
)

import ddlf_actors as ddlf
from ddlf_actors.apps import ConfigError, TrainerStartError, datasets, train_async, train_sync
from ddlf_actors.apps.callbacks import Callback

ROW_KEYS = {"round", "epoch", "time_s", "test_accuracy", "test_loss", "train_loss",
            "bytes_sent", "bytes_received", "compute_s", "idle_s", "eval_s", "overhead_s"}
MODEL = softmax_model_fn(64, 4)


def _initial_weights():
    return MODEL().get_weights()


@pytest.mark.parametrize("scheme", [train_sync, train_async])
def test_training_learns(train_cluster, scheme):
    w0 = _initial_weights()
    result = scheme(MODEL, hard_blobs_dataset, workers=2, master_epochs=4, batch_size=16,
                    trainer_cls=NumpyTrainer, progress=False, initial_weights=w0)
    h = result.history
    assert len(h) == 4
    for row in h:
        assert ROW_KEYS <= set(row)
        assert row["test_accuracy"] is not None
    assert any(not np.allclose(a, b) for a, b in zip(w0, result.weights))  # weights changed
    assert h[-1]["train_loss"] < h[0]["train_loss"]                      # loss falls
    assert h[-1]["test_accuracy"] > 0.5                                  # chance is 0.25
    assert [r["epoch"] for r in h] == [1, 2, 3, 4]
    assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in h)
    # Evaluation ran on the trainers, inside the following rounds' calls.
    assert sum(r["eval_s"] for r in h) > 0
    assert all(r["overhead_s"] <= r["wall_s"] for r in h)
    # Work is counted inside its row's window (async updates straddle epochs); the
    # margin covers the reply's transfer time, which the window cannot see.
    assert all(r["compute_s"] <= r["wall_s"] * 1.05 + 0.01 for r in h)
    # result.model holds the final weights, built by the trainer class on the driver
    for a, b in zip(result.model.get_weights(), result.weights):
        np.testing.assert_array_equal(a, b)


def test_sync_reported_accuracy_matches_the_final_weights(train_cluster):
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                        trainer_cls=NumpyTrainer, progress=False)
    (_x, _y), (xt, yt) = hard_blobs_dataset()
    model = result.model
    accuracy = float(np.mean(model.probs(xt).argmax(axis=1) == yt))
    assert result.history[-1]["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)


def test_rounds_per_epoch_averages_more_often(train_cluster):
    one = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                     trainer_cls=NumpyTrainer, progress=False)
    three = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
                       rounds_per_epoch=3, trainer_cls=NumpyTrainer, progress=False)
    assert len(one.history) == 2 and len(three.history) == 6
    assert [r["epoch"] for r in three.history] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 2])
    # Each round covers 1/3 of every partition: all samples are used once per epoch.
    assert sum(r["samples"] for r in three.history) == sum(r["samples"] for r in one.history)
    # ... and the weights travel 3 times as often.
    assert sum(r["bytes_received"] for r in three.history) > 2.5 * sum(
        r["bytes_received"] for r in one.history[1:])


@pytest.mark.parametrize("scaling", [False, True])
def test_async_applies_delta_over_k_with_optional_staleness_scaling(train_cluster, scaling):
    w0 = [np.zeros((64, 4), np.float32), np.zeros(4, np.float32)]
    result = train_async(MODEL, hard_blobs_dataset, workers=2, master_epochs=3,
                         rounds_per_epoch=2, trainer_cls=ConstantDeltaTrainer, progress=False,
                         staleness_scaling=scaling, initial_weights=w0)
    ups = result.updates
    assert len(ups) == 3 * 2 * 2
    assert any(u["staleness"] > 0 for u in ups)  # uneven trainers made stale deltas
    scales = [1 / 2 / ((u["staleness"] + 1) if scaling else 1) for u in ups]
    # Every delta is all ones, so each weight moved by exactly -sum(scales).
    for w in result.weights:
        np.testing.assert_allclose(w, -sum(scales), rtol=1e-5)


def test_ssp_bound_holds(train_cluster):
    common = dict(workers=2, master_epochs=3, rounds_per_epoch=4, trainer_cls=SlowFirstTrainer,
                  progress=False)
    free = train_async(MODEL, hard_blobs_dataset, **common)
    bounded = train_async(MODEL, hard_blobs_dataset, staleness_bound=1, **common)
    # Without a bound the fast trainer runs well ahead: the check below can fail.
    assert max(u["lead"] for u in free.updates) > 1
    assert max(u["lead"] for u in bounded.updates) <= 1
    # Replay the recorded order: at each update's start, no trainer was > 1 ahead.
    done = [0, 0]
    for u in bounded.updates:
        done[u["trainer"]] += 1
        assert max(done) - min(done) <= 2  # <= bound + the update just completed
    assert len(bounded.history) == 3


class _Recorder(Callback):
    def __init__(self):
        self.rows = []

    def on_row(self, row, run):
        self.rows.append(row)
        if len(self.rows) == 2:
            run.stop = True


def test_callback_can_stop_and_target_accuracy_stops(train_cluster):
    rec = _Recorder()
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=6,
                        trainer_cls=NumpyTrainer, progress=False, callbacks=[rec])
    assert len(result.history) == 2 and len(rec.rows) == 2
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=20,
                        trainer_cls=NumpyTrainer, progress=False, target_accuracy=0.4)
    assert result.history[-1]["test_accuracy"] >= 0.4
    assert len(result.history) < 20 and "target" in result.stopped_early


def test_progress_bar_goes_to_stderr(train_cluster, capfd):
    train_sync(MODEL, hard_blobs_dataset, workers=2, master_epochs=2,
               trainer_cls=NumpyTrainer, progress=True)
    err = capfd.readouterr().err
    assert "ddlf sync" in err and "samples/s" in err and "acc" in err


def test_partitioned_dataset_each_trainer_loads_its_own(train_cluster, tmp_path):
    (x, y), (xt, yt) = blobs(n_train=400, n_test=100)
    # Uneven partitions: 300 and 100 samples.
    datasets.write_partitions(str(tmp_path), x, y, 2, xt, yt)
    ds = datasets.partitioned(str(tmp_path))
    sizes = [len(ds.load_partition(k)[0]) for k in range(2)]
    cls = ddlf.remote(num_cpus=1)(NumpyTrainer)
    trainers = [cls.remote(MODEL, ds, j) for j in range(2)]
    infos = ddlf.get([t.describe.remote() for t in trainers])
    assert [i["num_train"] for i in infos] == sizes
    result = train_sync(MODEL, ds, trainers=trainers, master_epochs=2, progress=False,
                        trainer_cls=NumpyTrainer)
    assert [r["samples"] for r in result.history] == [sum(sizes)] * 2
    for t in trainers:
        ddlf.kill(t)


# -- bad input: clear errors, no hang, nothing left behind (the fixture checks processes) --

def test_unknown_dataset_name_fails_before_any_trainer_starts(train_cluster):
    # A ConfigError, as train_sync's docstring says (a ValueError too), naming the option,
    # the known names and the other kinds of dataset.
    with pytest.raises(ConfigError, match="dataset='no-such-set' is not a registered "
                                          "dataset: use one of .*fashion-mnist.*partitioned"):
        train_sync(MODEL, "no-such-set", workers=2, trainer_cls=NumpyTrainer, progress=False)


def test_missing_partition_directory(train_cluster, tmp_path):
    with pytest.raises(FileNotFoundError):
        train_sync(MODEL, datasets.partitioned(str(tmp_path / "nope")), workers=2,
                   trainer_cls=NumpyTrainer, progress=False)


def test_more_workers_than_cpus_says_so(train_cluster):
    with pytest.raises(ddlf.errors.UnschedulableError, match="workers=3.*need 3 CPUs.*2 free"):
        train_sync(MODEL, hard_blobs_dataset, workers=3, trainer_cls=NumpyTrainer,
                   progress=False)


def test_model_fn_that_raises_names_the_cause(train_cluster):
    with pytest.raises(TrainerStartError, match="ZeroDivisionError: model_fn failed on purpose"):
        train_async(failing_model_fn, hard_blobs_dataset, workers=2,
                    trainer_cls=NumpyTrainer, progress=False)
    # The failed run released its CPUs: the next one places.
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, trainer_cls=NumpyTrainer,
                        progress=False)
    assert len(result.history) == 1


def test_bad_config_values():
    # Checked before any cluster or trainer starts.
    for bad in (dict(workers=0), dict(master_epochs=-1), dict(batch_size=1.5),
                dict(staleness_bound=-1), dict(target_accuracy=2), dict(patience=0)):
        with pytest.raises(ValueError):
            train_async(MODEL, hard_blobs_dataset, trainer_cls=NumpyTrainer, **bad)


@pytest.mark.parametrize("scheme", [train_sync, train_async])
def test_a_trainer_that_keeps_dying_does_not_end_the_run(train_cluster, scheme):
    # Trainer 1's process exits in its second train call, and so does each replacement:
    # the run still finishes every epoch, with the losses in its events.
    result = scheme(MODEL, hard_blobs_dataset, workers=2, master_epochs=4,
                    trainer_cls=DiesInRoundTwo, progress=False)
    assert [r["epoch"] for r in result.history] == [1, 2, 3, 4]
    lost = [e for e in result.events if e["kind"] == "trainer_lost"]
    assert lost and all(e["trainer"] == 1 and "DiesInRoundTwo" in e["detail"] for e in lost)
    # Its CPUs came back: the next run places and trains.
    assert len(train_sync(MODEL, hard_blobs_dataset, workers=2, trainer_cls=NumpyTrainer,
                          progress=False).history) == 1
