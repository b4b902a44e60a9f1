"""compression= on train_sync and train_async: codecs on the wire, with the numpy trainer
(and a lost trainer with top-k on a small PyTorch module too).

Every run is seeded and the numpy trainer is deterministic, so the accuracies compared
here are the same on every run of the test.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers_modules.metered_trainer import MeteredTrainer
from helpers_modules.numpy_trainer import (
    MomentumTrainer,
    NumpyTrainer,
    SigkillOnce,
    hard_blobs_dataset,
    momentum_model_fn,
    softmax_model_fn,
)
from helpers_modules.torch_trainer import KITS

from ddlf_actors.apps import TrainConfig, checkpoint, codecs, train_async, train_sync
from ddlf_actors.apps.callbacks import Callback
from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

MODEL = softmax_model_fn(64, 4)
RUN = dict(workers=2, master_epochs=3, rounds_per_epoch=2, trainer_cls=NumpyTrainer,
           progress=False, seed=3)
# For train_sync: plain averaging, every round evaluated (its defaults are Nesterov outer
# momentum and one evaluation per epoch): the tests compare codecs by each row.
SYNC = dict(RUN, outer_momentum=0.0, lr_scaling="none", eval_every=1)
ALL = ["lz4", "zstd", "fp16", "int8", "int8:ef", "topk:0.1", ("fp16", "topk:0.05"),
       ("int8:ef", "topk:0.1"), ("none", "int8")]


def _accuracies(result):
    return [r["test_accuracy"] for r in result.history]


def _sends_changes(spec) -> bool:
    """Whether the weights go down as changes of a replica (schemes/wire.py)."""
    down = codecs.resolve_pair(spec)[0]
    return down.needs_summing or down.error_feedback


@pytest.fixture(scope="module")
def plain(train_cluster):
    """The run without compression that the others are compared with."""
    return train_sync(MODEL, hard_blobs_dataset, **SYNC)


@pytest.mark.parametrize("spec", ALL, ids=str)
def test_each_codec_trains_and_learns(train_cluster, plain, spec):
    result = train_sync(MODEL, hard_blobs_dataset, compression=spec, **SYNC)
    acc = _accuracies(result)
    assert len(acc) == 6 and all(a is not None for a in acc)
    assert acc[-1] > 0.6                                   # chance is 0.25
    assert acc[-1] > plain.history[-1]["test_accuracy"] - 0.05
    # Fewer bytes than the arrays themselves, in the direction that compresses.
    down, up = codecs.resolve_pair(spec)
    for key, codec in (("bytes_sent", down), ("bytes_received", up)):
        if codec.name not in ("none", "lz4", "zstd"):
            assert result.history[-1][key] < plain.history[-1][key]
    # result.weights are the weights the trainers held for the last row, which it reports.
    (_x, _y), (xt, yt) = hard_blobs_dataset()
    probs = result.model.probs(np.asarray(xt, np.float32))
    assert np.mean(probs.argmax(axis=1) == yt) == pytest.approx(acc[-1])


@pytest.mark.parametrize("spec,ratio", [("fp16", 2), ("int8", 4), (("fp16", "int8"), (2, 4))],
                         ids=str)
def test_bytes_per_round_drop_by_the_codecs_ratio(train_cluster, plain, spec, ratio):
    down_ratio, up_ratio = ratio if isinstance(ratio, tuple) else (ratio, ratio)
    result = train_sync(MODEL, hard_blobs_dataset, compression=spec, **SYNC)
    # Round 1 also brings back the initial weights; every later round is alike.
    for mine, theirs in zip(result.history[1:], plain.history[1:]):
        assert mine["samples"] == theirs["samples"]
        indices = mine["samples"] * 4      # each round's index arrays go as they are (int32)
        assert mine["bytes_received"] * up_ratio == theirs["bytes_received"]
        assert (mine["bytes_sent"] - indices) * down_ratio == theirs["bytes_sent"] - indices


def test_sync_with_fp16_stays_close_to_none(train_cluster, plain):
    result = train_sync(MODEL, hard_blobs_dataset, compression="fp16", **SYNC)
    scale = max(float(np.abs(w).max()) for w in plain.weights)
    for a, b in zip(plain.weights, result.weights):
        # Six rounds from float16 weights, returning float16 deltas (11 significant bits
        # each way): the paths part by under 1 % of the largest weight (0.5 % measured).
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-2 * scale)
    for mine, theirs in zip(_accuracies(result), _accuracies(plain)):
        assert abs(mine - theirs) <= 0.02


@pytest.mark.parametrize("spec", ["none", "lz4", "zstd", ("zstd", "lz4"), ("none", "zstd")],
                         ids=str)
def test_lossless_codecs_give_the_same_weights_bit_for_bit(train_cluster, plain, spec):
    result = train_sync(MODEL, hard_blobs_dataset, compression=spec, **SYNC)
    for a, b in zip(plain.weights, result.weights):
        np.testing.assert_array_equal(a, b)
    assert _accuracies(result) == _accuracies(plain)


def test_topk_with_error_feedback_reaches_the_accuracy_of_none(train_cluster):
    run = dict(SYNC, master_epochs=4)
    none = train_sync(MODEL, hard_blobs_dataset, **run)
    ef = train_sync(MODEL, hard_blobs_dataset, compression="topk:0.05", **run)
    noef = train_sync(MODEL, hard_blobs_dataset, compression=("none", "topk:0.05:noef"), **run)
    final = {name: r.history[-1]["test_accuracy"] for name, r in
             (("none", none), ("ef", ef), ("noef", noef))}
    # Error feedback delivers what top-k leaves out later; without it it is lost for good.
    assert final["ef"] >= final["none"] - 0.03, final
    assert final["noef"] < final["ef"], final
    # A twentieth of each delta crosses: values and 1-byte indices of the 256-entry
    # tensor, and one entry of the 4 biases.
    k = round(0.05 * 256)
    assert ef.history[-1]["bytes_received"] == 2 * (k * (1 + 4) + 1 * (1 + 4))


def test_bytes_in_the_history_are_the_payloads_that_crossed(train_cluster):
    config = TrainConfig(workers=2, trainer_cls=MeteredTrainer, progress=False)
    trainers = start_trainers(MODEL, hard_blobs_dataset, config)
    try:
        for spec in [("topk:0.1", "int8"), "fp16", ("zstd", "topk:0.2")]:
            result = train_sync(MODEL, hard_blobs_dataset, trainers=trainers,
                                compression=spec, **dict(SYNC, trainer_cls=MeteredTrainer))
            import ddlf_actors as ddlf

            logs = ddlf.get([t.meter.remote() for t in trainers])
            calls = [c for log in logs for c in log[-6:]]   # this run's 6 rounds
            h = result.history
            # Each trainer got each round's message once (evaluations reuse it).
            assert sum(c["down"] + c["indices"] for c in calls) == sum(r["bytes_sent"] for r in h)
            initial = sum(np.asarray(w).nbytes for w in MODEL().get_weights())
            assert sum(c["up"] for c in calls) == sum(r["bytes_received"] for r in h) - initial
            if _sends_changes(spec):
                # The first round sends the replica whole, later ones its changes.
                assert [c["kind"] for c in logs[0][-6:]] == ["set"] + ["change"] * 5
                assert h[1]["bytes_sent"] < h[0]["bytes_sent"]
                # Every trainer holds the driver's replica, bit for bit.
                replicas = ddlf.get([t.replica.remote() for t in trainers])
                for a, b in zip(replicas[0], replicas[1]):
                    np.testing.assert_array_equal(a, b)
    finally:
        stop_trainers(trainers)


def _kill_env(tmp_path, sleep=0.15, slot=1, call=2):
    env = {"DDLF_TEST_KILL_DIR": str(tmp_path), "DDLF_TEST_FIT_SLEEP": str(sleep),
           "DDLF_TEST_KILL_SLOT": str(slot), "DDLF_TEST_KILL_CALL": str(call)}
    return {"runtime_env": {"env_vars": env}}


@pytest.mark.parametrize("spec,kit", [("topk:0.1", "numpy"), (("int8:ef", "fp16"), "numpy"),
                                      (("fp16", "topk:0.1"), "numpy"), ("topk:0.1", "torch")],
                         ids=str)
def test_sync_trainer_sigkilled_with_compression(train_cluster, tmp_path, spec, kit):
    if kit == "torch":
        pytest.importorskip("torch")
    kit = KITS[kit]
    # min_workers=2: the round after the loss waits for the replacement, so it rejoins at
    # round 3 whatever the machine's load.
    result = train_sync(kit.model_fn(), hard_blobs_dataset, compression=spec, min_workers=2,
                        # batches of 25: whole batches cut 600 rows into rounds of 300
                        **dict(SYNC, batch_size=25, trainer_cls=kit.trainer(SigkillOnce),
                               trainer_options=_kill_env(tmp_path), **kit.options))
    assert (tmp_path / "killed").exists()
    h = result.history
    assert [r["round"] for r in h] == [1, 2, 3, 4, 5, 6]
    lost = [e for e in result.events if e["kind"] == "trainer_lost"]
    assert len(lost) == 1 and lost[0]["round"] == 2
    assert [r["workers"] for r in h] == [2, 1, 2, 2, 2, 2]
    assert h[-1]["test_accuracy"] > 0.6
    if _sends_changes(spec):
        # The replacement held nothing, so it was sent the whole replica (1040 bytes: a
        # 64x4 kernel and 4 biases, in numpy and torch alike)
        # where the other trainer got the round's change; every later round sends two
        # changes. (A change applied to no replica would have failed the run.)
        indices = 300 * 4
        change = (h[-1]["bytes_sent"] - indices) // 2
        assert h[2]["bytes_sent"] == indices + change + 1040
        assert change < 1040


def test_async_trainer_sigkilled_with_compression(train_cluster, tmp_path):
    result = train_async(MODEL, hard_blobs_dataset, compression=("fp16", "topk:0.1"),
                         **dict(RUN, trainer_cls=SigkillOnce,
                                trainer_options=_kill_env(tmp_path)))
    assert (tmp_path / "killed").exists()
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
    assert sum(r["samples"] for r in result.history) == 3 * 600
    assert result.history[-1]["test_accuracy"] > 0.6


class _Abort(Callback):
    def __init__(self, n):
        self.n = n

    def on_row(self, row, run):
        if row["round"] == self.n:
            raise KeyboardInterrupt("driver stopped")


@pytest.mark.parametrize("spec,trainer,model", [
    ("topk:0.1", NumpyTrainer, MODEL),
    (("int8:ef", "topk:0.05"), MomentumTrainer, momentum_model_fn(64, 4)),
    (("fp16", "int8:ef"), NumpyTrainer, MODEL),
], ids=["topk", "int8ef-topk-momentum", "fp16-int8ef"])
def test_sync_resume_with_compression_is_bit_equal(train_cluster, tmp_path, spec, trainer,
                                                   model):
    common = dict(SYNC, trainer_cls=trainer, compression=spec, seed=5)
    whole = train_sync(model, hard_blobs_dataset, **common)
    with pytest.raises(KeyboardInterrupt):
        train_sync(model, hard_blobs_dataset, checkpoint_dir=str(tmp_path),
                   callbacks=[_Abort(3)], **common)
    ckpt = checkpoint.load(str(tmp_path))
    assert ckpt.round == 3
    # The checkpoint holds what the trainers shared and what each still owed the driver.
    assert ("replica" in ckpt.arrays) == _sends_changes(spec)
    assert any(name.startswith("residual") for name in ckpt.arrays)
    resumed = train_sync(model, hard_blobs_dataset, resume=str(tmp_path), **common)
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)
    assert _accuracies(whole) == _accuracies(resumed)
    # Checkpoint rounds also bring back each trainer's residual (1040 bytes, dense here),
    # and the history counts those bytes too.
    assert [r["bytes_received"] - 2 * 1040 for r in resumed.history[3:]] == \
        [r["bytes_received"] for r in whole.history[3:]]


def test_async_refuses_a_down_codec_that_sends_changes(train_cluster):
    with pytest.raises(ValueError, match=r"compression=\('fp16', 'topk:0.01'\)"):
        train_async(MODEL, hard_blobs_dataset, compression="topk:0.01", **RUN)
    with pytest.raises(ValueError, match="int8:ef"):
        train_async(MODEL, hard_blobs_dataset, compression=("int8:ef", "none"), **RUN)


def test_bad_compression_values_name_the_valid_forms():
    with pytest.raises(ValueError, match=r"compression='gzip': unknown codec.*topk:<fraction"):
        TrainConfig(compression="gzip")
    with pytest.raises(ValueError, match=r"\(down, up\), two specs, got 3"):
        TrainConfig(compression=("fp16", "fp16", "fp16"))
    with pytest.raises(ValueError, match="':noef' does not apply"):
        TrainConfig(compression=("topk:0.1:noef", "none"))
    assert TrainConfig(compression=("FP16", "topk:0.01")).to_json()["compression"] == \
        ["fp16", "topk:0.01"]


def test_a_codec_whose_library_is_missing_is_refused_before_any_trainer_starts(monkeypatch):
    # No cluster here: train_sync must fail on the options, before it looks for one.
    monkeypatch.setitem(sys.modules, "zstandard", None)   # import now raises ImportError
    with pytest.raises(codecs.CodecUnavailableError,
                       match=r"compression=\('fp16', 'zstd'\).*pip install zstandard"):
        train_sync(MODEL, hard_blobs_dataset, compression=("fp16", "zstd"), **RUN)


class _OpenGateAfterRow1(Callback):
    def __init__(self, gate):
        self.gate = gate

    def on_row(self, row, run):
        if row["round"] == 1:
            (self.gate / "open").touch()


def test_backup_workers_fold_in_a_late_encoded_delta(train_cluster, tmp_path):
    """A delta that arrives after its round closed was encoded as that round said; it is
    decoded when folded in. GatedTrainer's deltas are -(slot + 1) everywhere and zstd is
    exact, so the weights are known from result.updates."""
    from helpers_modules.numpy_trainer import GatedTrainer

    zeros = [np.zeros_like(w) for w in MODEL().get_weights()]
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, backup_workers=1,
                        master_epochs=2, rounds_per_epoch=2, trainer_cls=GatedTrainer,
                        outer_momentum=0.0, lr_scaling="none", eval_every=1,
                        progress=False, initial_weights=zeros, compression=("lz4", "zstd"),
                        callbacks=[_OpenGateAfterRow1(tmp_path)],
                        trainer_options={"runtime_env": {"env_vars": {
                            "DDLF_TEST_GATE_DIR": str(tmp_path)}}})
    h, ups = result.history, result.updates
    assert [r["round"] for r in h] == [1, 2, 3, 4]
    assert sum(r["late"] for r in h) >= 1
    expected = 0.0
    for v in range(1, len(h) + 1):
        rows = [u for u in ups if u["applied_version"] == v]
        m = [u["samples"] / (1 + u["staleness"]) for u in rows]
        expected += sum(mi * (u["trainer"] + 1) for mi, u in zip(m, rows)) / sum(m)
    for w in result.weights:
        np.testing.assert_allclose(w, -expected, rtol=1e-5)
    # Constant deltas: zstd sends each in far fewer bytes than its 1040.
    assert all(r["bytes_received"] < r["updates"] * 1040 for r in h[1:])
