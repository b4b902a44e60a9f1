"""``compression=`` in every scheme (issue 23 section 3), on the in-process fake backend:
allreduce's codec per hop (float32 sums, error feedback per hop, checkpointed), and the
weights and deltas of easgd and downpour through the wire."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from helpers_modules.fake_faults import dies as _dies
from helpers_modules.numpy_trainer import (
    MomentumTrainer,
    NumpyTrainer,
    hard_blobs_dataset,
    momentum_model_fn,
    softmax_model_fn,
)

from ddlf_actors.apps import checkpoint, train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.options import ConfigError
from ddlf_actors.apps.schemes import CollectiveError

RUN = dict(workers=2, master_epochs=3, seed=7, progress=False)


def _train(scheme, backend=None, trainer_cls=NumpyTrainer, model_fn=None, **options):
    return train(model_fn or softmax_model_fn(), hard_blobs_dataset, scheme,
                 trainer_cls=trainer_cls, backend=backend or FakeBackend(),
                 **{**RUN, **options})




# -- allreduce ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,ratio", [("fp16", 2.0), ("int8", 4.0), ("int8:ef", 4.0),
                                        ("int4", 7.0), ("lz4", 1.0)])
def test_allreduce_encodes_each_hop_and_learns(spec, ratio):
    plain = _train("allreduce", workers=3, rounds_per_epoch=3)
    coded = _train("allreduce", workers=3, rounds_per_epoch=3, compression=spec)
    assert coded.history[-1]["test_accuracy"] > 0.6
    # hard_blobs moves by a few points from one setting to the next (0.64-0.72 by seed).
    assert abs(coded.history[-1]["test_accuracy"] - plain.history[-1]["test_accuracy"]) < 0.05
    sent = [r["ring_bytes"] for r in coded.history]
    assert plain.history[0]["ring_bytes"] / max(sent) >= ratio * 0.999


def test_allreduce_with_a_lossless_codec_is_the_plain_ring_bit_for_bit():
    plain = _train("allreduce", workers=3, rounds_per_epoch=3)
    for spec in ("none", "lz4"):
        coded = _train("allreduce", workers=3, rounds_per_epoch=3, compression=spec)
        for a, b in zip(plain.weights, coded.weights):
            np.testing.assert_array_equal(a, b)


def test_allreduce_refuses_a_pair_and_topk():
    with pytest.raises(ConfigError, match="not a \\(down, up\\) pair"):
        _train("allreduce", compression=("fp16", "int8"))
    with pytest.raises(ConfigError, match="keeps only part of each chunk"):
        _train("allreduce", compression="topk:0.1")


@pytest.mark.parametrize("spec", ["int4", "int8:ef"])
def test_allreduce_resume_with_hop_feedback_is_bit_equal(spec, tmp_path):
    run = dict(model_fn=momentum_model_fn(), trainer_cls=MomentumTrainer, rounds_per_epoch=2,
               workers=3, compression=spec)
    full = _train("allreduce", checkpoint_dir=str(tmp_path / "a"), keep_checkpoints=10, **run)
    names = checkpoint.list_checkpoints(str(tmp_path / "a"))

    def middle(name):   # a resumed run checkpoints into its directory: one each
        (tmp_path / name).mkdir()
        shutil.copy(names[2], tmp_path / name)
        return str(tmp_path / name)

    resumed = _train("allreduce", resume=middle("b"), **run)
    assert any(k.startswith("hop") for k in checkpoint.load(str(tmp_path / "b")).arrays)
    for a, b in zip(full.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)
    # Without the saved feedback the run would differ: the test can fail.
    cut = _train("allreduce", resume=middle("c"),
                 **{**run, "compression": spec.split(":")[0] + ":noef"})
    assert any(not np.array_equal(a, b) for a, b in zip(full.weights, cut.weights))


def test_allreduce_a_member_lost_in_an_encoded_collective_is_redone():
    result = _train("allreduce", workers=3, min_workers=3, rounds_per_epoch=2,
                    compression="int4", chunk_timeout_s=5.0,
                    backend=FakeBackend(fail_when=_dies(1, "allreduce_held", 2)))
    assert len([e for e in result.events if e["kind"] == "trainer_lost"]) == 1
    assert result.history[1]["workers"] == 2 and result.history[-1]["workers"] == 3
    assert result.history[-1]["test_accuracy"] > 0.6


class DivergingTrainer(NumpyTrainer):
    """Trainer 1's second round goes to NaN."""

    def fit(self, x, y, epochs, batch_size):
        loss = super().fit(x, y, epochs, batch_size)
        self._fits = getattr(self, "_fits", 0) + 1
        if self._ddlf_index == 1 and self._fits == 2:
            self.model.w[0][0, 0] = np.nan
        return loss


def test_allreduce_a_diverged_delta_is_a_clear_error_with_a_codec():
    with pytest.raises(CollectiveError, match="holds NaN or inf.*the model diverged"):
        _train("allreduce", rounds_per_epoch=3, compression="int8",
               trainer_cls=DivergingTrainer, chunk_timeout_s=5.0)


# -- easgd and downpour ------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["easgd", "downpour"])
@pytest.mark.parametrize("spec,up,down", [("fp16", 2.0, 2.0), (("fp16", "int4:ef"), 7.0, 2.0),
                                          ("lz4", 1.0, 1.0)])
def test_easgd_and_downpour_send_encoded_weights_and_deltas(scheme, spec, up, down):
    plain = _train(scheme)
    coded = _train(scheme, compression=spec)
    assert coded.history[-1]["test_accuracy"] > 0.6
    # After the first row (which holds the initial weights' fetch): deltas up shrink by
    # the codec's ratio; down, the weights do, not the index arrays that go with them.
    got_up = sum(r["bytes_received"] for r in coded.history[1:])
    got_down = sum(r["bytes_sent"] for r in coded.history[1:])
    assert sum(r["bytes_received"] for r in plain.history[1:]) / got_up >= up * 0.95
    assert sum(r["bytes_sent"] for r in plain.history[1:]) / got_down >= down * 0.6


@pytest.mark.parametrize("scheme", ["easgd", "downpour"])
def test_easgd_and_downpour_refuse_a_replica_of_changes(scheme):
    with pytest.raises(ConfigError, match="cannot keep"):
        _train(scheme, compression="int8:ef")


@pytest.mark.parametrize("scheme", ["easgd", "downpour"])
def test_easgd_and_downpour_resume_with_residuals(scheme, tmp_path):
    spec = ("fp16", "int4:ef")
    full = _train(scheme, compression=spec, checkpoint_dir=str(tmp_path / "a"),
                  keep_checkpoints=20)
    names = checkpoint.list_checkpoints(str(tmp_path / "a"))
    middle = tmp_path / "b"
    middle.mkdir()
    shutil.copy(names[len(names) // 2], middle)
    assert any(k.startswith("residual") for k in checkpoint.load(str(middle)).arrays)
    resumed = _train(scheme, compression=spec, resume=str(middle))
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3]
    assert sum(r["samples"] for r in resumed.history) == sum(r["samples"] for r in full.history)
    assert resumed.history[-1]["test_accuracy"] > 0.6


@pytest.mark.parametrize("scheme", ["easgd", "downpour"])
def test_easgd_and_downpour_plain_runs_are_unchanged_by_the_wire(scheme):
    """``compression=None`` goes through the same calls as before: arrays, one put per
    weights version; a lossless codec gives the same weights bit for bit (one trainer, so
    the order of updates is fixed)."""
    plain = _train(scheme, workers=1)
    lossless = _train(scheme, workers=1, compression="lz4")
    for a, b in zip(plain.weights, lossless.weights):
        np.testing.assert_array_equal(a, b)
