"""Training a language model across trainers (issue 32): every scheme, codec, fault path,
checkpoint and elastic setting with a tiny PyTorch GPT on generated text.

One embedded 2-CPU cluster for the module (``train_cluster``). The model is a GPT of one
block, dim 16 (about 13 k parameters), on ~9 KB of generated sentences with windows of
16 tokens: a round takes tens of milliseconds, a trainer's start about a second (torch's
import). Faults are real: a trainer SIGKILLs its own process mid-``fit``.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
from helpers_modules.numpy_trainer import SigkillOnce  # noqa: E402
from helpers_modules.torch_trainer import TorchTrainer, torch_variant  # noqa: E402

import ddlf_actors as ddlf  # noqa: E402
from ddlf_actors.apps import checkpoint, datasets, lm, train, train_sync  # noqa: E402
from ddlf_actors.apps.callbacks import Callback  # noqa: E402

WORDS = ("the a one cat dog bird sat ran flew on under over mat tree roof and then "
         "slept ate sang").split()
TINY = dict(layers=1, heads=2, dim=16, learning_rate=3e-3, warmup_steps=2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Generated sentences in three files: short words from a small vocabulary, so the
    loss falls within a few rounds."""
    directory = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    for i in range(3):
        lines = [" ".join(rng.choice(WORDS, rng.integers(3, 7))) + "." for _ in range(150)]
        (directory / f"part{i}.txt").write_text("\n".join(lines) + "\n")
    return str(directory / "*.txt")


def _dataset(corpus, **kw):
    return datasets.text(corpus, context=16, **kw)


def _model(ds, **kw):
    return lm.GptModelFn(ds, framework="torch", **{**TINY, **kw})


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


def _evaluated(history):
    return [r for r in history if r["test_loss"] is not None]


def test_sync_trains_a_gpt_and_rows_carry_tokens_and_bits_per_byte(train_cluster, corpus):
    ds = _dataset(corpus)
    result = train(_model(ds), ds, workers=2, master_epochs=3, progress=False)
    h = result.history
    rows = _evaluated(h)
    assert len(rows) == 3 and rows[-1]["test_loss"] < rows[0]["test_loss"] - 0.3
    windows = ds.windows("train")
    assert h[-1]["tokens"] == 3 * windows * 16 == sum(r["samples"] for r in h) * 16
    for r in rows:
        assert r["bits_per_byte"] == pytest.approx(r["test_loss"] / np.log(2))  # bytes
        assert r["perplexity"] == pytest.approx(np.exp(r["test_loss"]))
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 16)
    text = result.generate("the cat", 30, seed=1)
    assert text.startswith("the cat") and text == result.generate("the cat", 30, seed=1)
    assert result.dataset is ds and result.framework == "torch"


def test_a_sigkilled_trainer_is_replaced_and_the_run_completes(train_cluster, corpus, tmp_path):
    ds = _dataset(corpus)
    env = {"DDLF_TEST_KILL_DIR": str(tmp_path), "DDLF_TEST_FIT_SLEEP": "0.1",
           "DDLF_TEST_KILL_SLOT": "1", "DDLF_TEST_KILL_CALL": "2"}
    result = train_sync(_model(ds), ds, workers=2, master_epochs=3, rounds_per_epoch=2,
                        min_workers=2, trainer_cls=torch_variant(SigkillOnce), progress=False,
                        trainer_options={"runtime_env": {"env_vars": env}})
    assert (tmp_path / "killed").exists()             # the fault really happened
    assert [r["round"] for r in result.history] == [1, 2, 3, 4, 5, 6]
    lost, joined = _kinds(result, "trainer_lost"), _kinds(result, "trainer_joined")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and "ActorDiedError" in lost[0]["detail"]
    assert len(joined) == 1 and joined[0]["trainer"] == 1
    assert result.history[1]["workers"] == 1 and result.history[-1]["workers"] == 2
    rows = _evaluated(result.history)
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]


class _Abort(Callback):
    """Ends the driver's run abruptly after row ``n`` (as a crash would)."""

    def __init__(self, n):
        self.n = n

    def on_row(self, row, run):
        if row["round"] == self.n:
            raise KeyboardInterrupt("driver stopped")


def test_a_seeded_sync_run_resumed_from_its_checkpoint_is_bit_equal(train_cluster, corpus,
                                                                    tmp_path):
    ds = _dataset(corpus)
    # AdamW's moments and step (the schedule's) travel in the checkpoint; DDLF's outer
    # Nesterov velocity too.
    common = dict(workers=2, master_epochs=3, rounds_per_epoch=2, eval_every=1,
                  trainer_cls=TorchTrainer, progress=False, seed=5)
    whole = train_sync(_model(ds, total_steps=40), ds, **common)
    with pytest.raises(KeyboardInterrupt):
        train_sync(_model(ds, total_steps=40), ds, checkpoint_dir=str(tmp_path),
                   callbacks=[_Abort(3)], **common)
    assert checkpoint.load(str(tmp_path)).round == 3
    resumed = train_sync(_model(ds, total_steps=40), ds, resume=str(tmp_path), **common)
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)
    assert [r["tokens"] for r in whole.history] == [r["tokens"] for r in resumed.history]
    assert whole.history[-1]["test_loss"] == resumed.history[-1]["test_loss"]


def test_int4_with_error_feedback_trains_on_an_eighth_of_the_bytes(train_cluster, corpus):
    ds = _dataset(corpus)
    # The star's bytes (sync): the driver's link is what the codec shrinks there.
    common = dict(workers=2, master_epochs=3, progress=False, seed=1)
    plain = train(_model(ds), ds, "sync", **common)
    int4 = train(_model(ds), ds, "sync", compression="int4:ef", **common)
    sent = sum(r["bytes_sent"] + r["bytes_received"] for r in int4.history[1:])
    plain_sent = sum(r["bytes_sent"] + r["bytes_received"] for r in plain.history[1:])
    assert sent < 0.3 * plain_sent
    first, last = _evaluated(int4.history)[0], _evaluated(int4.history)[-1]
    assert last["test_loss"] < first["test_loss"]
    assert last["test_loss"] < _evaluated(plain.history)[-1]["test_loss"] + 0.3


def test_allreduce_trains_a_gpt_among_the_trainers(train_cluster, corpus):
    ds = _dataset(corpus)
    result = train(_model(ds), ds, "allreduce", workers=2, master_epochs=3, progress=False)
    rows = _evaluated(result.history)
    assert rows[-1]["test_loss"] < rows[0]["test_loss"] - 0.3
    assert all(r["ring_bytes"] > 0 for r in result.history)
    assert result.history[-1]["tokens"] == 3 * ds.windows("train") * 16


@pytest.mark.parametrize("scheme", ["async", "easgd", "downpour"])
def test_the_other_schemes_train_a_gpt(train_cluster, corpus, scheme):
    ds = _dataset(corpus)
    result = train(_model(ds), ds, scheme, workers=2, master_epochs=2, progress=False)
    rows = _evaluated(result.history)
    assert rows and rows[-1]["bits_per_byte"] is not None
    assert rows[-1]["test_loss"] < np.log(256)


@ddlf.remote(num_cpus=1)
class CpuHog:
    def ping(self):
        return True


class _FreeCpuAfterFirstRow(Callback):
    def __init__(self, hog):
        self.hog = hog

    def on_row(self, row, run):
        if row["round"] == 1 and self.hog is not None:
            ddlf.kill(self.hog)
            self.hog = None


def test_an_elastic_text_run_grows_when_a_cpu_frees(train_cluster, corpus):
    hog = CpuHog.remote()
    ddlf.get(hog.ping.remote(), timeout=30)
    ds = _dataset(corpus)
    # Rounds of half a second: a new trainer imports torch before it joins (seconds).
    env = {"runtime_env": {"env_vars": {"DDLF_TEST_FIT_SLEEP": "0.5"}}}
    result = train_sync(_model(ds), ds, workers=(1, 2), master_epochs=4, rounds_per_epoch=4,
                        trainer_cls=torch_variant(SigkillOnce), progress=False,
                        callbacks=[_FreeCpuAfterFirstRow(hog)], trainer_options=env)
    workers = [r["workers"] for r in result.history]
    assert workers[0] == 1 and workers[-1] == 2
    assert [e["trainer"] for e in _kinds(result, "trainer_joined")] == [1]


def test_target_loss_stops_the_run_early(train_cluster, corpus):
    ds = _dataset(corpus)
    result = train(_model(ds), ds, workers=2, master_epochs=5, progress=False,
                   target_loss=4.0)
    assert result.stopped_early and "test loss" in result.stopped_early
    assert len(_evaluated(result.history)) < 5 and result.history[-1]["test_loss"] <= 4.0


def test_a_model_too_small_for_the_vocabulary_fails_before_training(train_cluster, corpus):
    ds = _dataset(corpus)
    small = lm.GptModelFn(vocab_size=100, context=16, framework="torch", **TINY)
    with pytest.raises(ValueError, match="100 rows for the 256 ids"):
        train(small, ds, workers=2, master_epochs=1, progress=False)
    # Nothing of the run is left: the next run gets both CPUs.
    result = train(_model(ds), ds, workers=2, master_epochs=1, progress=False)
    assert result.history[-1]["workers"] == 2


def test_train_refuses_a_corpus_name_given_as_a_string(train_cluster):
    with pytest.raises(ValueError, match=r"datasets.corpus\('fortunes'"):
        train(_model(None, vocab_size=256, context=16), "fortunes", workers=1, progress=False)


def test_the_test_split_can_be_scored_after_the_run(train_cluster, corpus):
    import torch
    import torch.nn.functional as F

    ds = _dataset(corpus, split=(0.1, 0.1))
    result = train(_model(ds), ds, workers=2, master_epochs=2, progress=False)
    x, y = ds.split_windows("test")                  # never seen by the run
    assert len(x) > 0 and x.start > ds.split_windows("validation")[0].start
    model = result.model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x[:].astype(np.int64)))
        loss = float(F.cross_entropy(logits.reshape(-1, 256),
                                     torch.from_numpy(y[:].astype(np.int64)).reshape(-1)))
    assert loss < np.log(256) - 0.5
