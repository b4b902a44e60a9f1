"""scheme="dataparallel" on the in-process fake backend: K trainers that all-reduce each
step's gradient train as one trainer stepping on their batches together; a lost trainer,
resume, trainers without the gradient hooks, and the settings it refuses.
(``test_dataparallel.py`` runs it on a real local cluster.)"""

from __future__ import annotations

import numpy as np
import pytest
from helpers_modules.fake_faults import dies as _dies
from helpers_modules.numpy_trainer import (
    MomentumTrainer,
    NoGradients,
    NumpyTrainer,
    hard_blobs_dataset,
    momentum_model_fn,
    softmax_model_fn,
)

from ddlf_actors.apps import Callback, checkpoint, train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.options import ConfigError
from ddlf_actors.apps.schemes.dp_trainer import batch_sizes

RUN = dict(master_epochs=2, rounds_per_epoch=3, batch_size=16, seed=7, progress=False)
HELD: list = []     # (round, trainer, indices) of every dp_hold: the fake backend is in-process


class RecordingTrainer(NumpyTrainer):
    def dp_hold(self, key, indices, *args, **kwargs):
        HELD.append((int(key[1]), self._ddlf_index, np.asarray(indices).copy()))
        return super().dp_hold(key, indices, *args, **kwargs)


class MomentumRecordingTrainer(RecordingTrainer, MomentumTrainer):
    pass


def _train(backend=None, trainer_cls=NumpyTrainer, model_fn=None, **options):
    return train(model_fn or softmax_model_fn(), hard_blobs_dataset, "dataparallel",
                 trainer_cls=trainer_cls, backend=backend or FakeBackend(),
                 **{**RUN, "workers": 2, **options})


def _replay(model, rounds: dict, batch: int, epochs: int = 1):
    """One model stepping on every trainer's batch s together, round by round: the
    gradient of the mean loss over the concatenated batch (no ring involved)."""
    (x, y), _ = hard_blobs_dataset()
    x = np.asarray(x, np.float32)
    for r in sorted(rounds):
        pieces = [rounds[r][j] for j in sorted(rounds[r])]
        counts = [len(p) for p in pieces]
        steps = max(-(-n // batch) for n in counts)
        for _ in range(epochs):
            for s in range(steps):
                rows = np.concatenate([p[s * batch:s * batch + b] for p, b in
                                       zip(pieces, batch_sizes(counts, batch, s))])
                model.step(x[rows], np.asarray(y)[rows])
    return model.get_weights()


# The tolerance is float32's: the ring sums scaled gradients where the replay takes one
# mean. After these 42 steps each is ~2e-5 from a float64 replay with plain SGD at rate
# 0.5; with momentum 0.9 (weights ~10, an effective rate of 5) ~5e-3.
@pytest.mark.parametrize("trainer,model_fn,tol", [
    (RecordingTrainer, softmax_model_fn(), 1e-4),
    (MomentumRecordingTrainer, momentum_model_fn(), 2e-2)])
def test_two_trainers_step_as_one_on_their_batches_together(trainer, model_fn, tol):
    HELD.clear()
    result = _train(trainer_cls=trainer, model_fn=model_fn)
    rounds: dict = {}
    for r, j, idx in HELD:
        rounds.setdefault(r, {})[j] = idx
    assert sorted(rounds) == list(range(1, 7)) and all(len(v) == 2 for v in rounds.values())
    expected = _replay(model_fn(), rounds, RUN["batch_size"])
    for a, b in zip(result.weights, expected):
        np.testing.assert_allclose(a, b, rtol=0, atol=tol)
    # Not what each trainer's own steps, averaged, would give (local SGD): the check
    # tells the two apart by far more than its tolerance.
    own = []
    for j in (0, 1):
        alone = {r: {0: rounds[r][j]} for r in rounds}
        own.append(_replay(model_fn(), alone, RUN["batch_size"]))
    averaged = [(a + b) / 2 for a, b in zip(*own)]
    far = max(float(np.abs(a - b).max()) for a, b in zip(result.weights, averaged))
    assert far > 20 * tol
    h = result.history
    assert [r["workers"] for r in h] == [2] * 6 and sum(r["samples"] for r in h) == 2 * 600
    assert h[-1]["test_accuracy"] > 0.6
    # Each step each of the 2 trainers sent 2 (K-1)/K = 1 gradient's bytes, and a round
    # has as many steps as its longer piece has batches of 16 (pieces are cut in whole
    # batches: 96 or 112 rows of a 200-row round here).
    grad = (64 * 4 + 4) * 4
    bs = RUN["batch_size"]
    steps = [max(-(-len(idx) // bs) for idx in rounds[r].values()) for r in sorted(rounds)]
    assert sorted(set(steps)) == [6, 7]
    assert [r["ring_bytes"] for r in h] == [2 * s * grad for s in steps]
    assert all(0 < r["collective_s"] < r["wall_s"] for r in h)


def test_uneven_pieces_weigh_each_row_once():
    # Three trainers, 600 rows, one round an epoch: 200 each, batches of 16 end in one of
    # 8; pieces of another size (a lost trainer's) go through the same weights.
    HELD.clear()
    result = _train(trainer_cls=RecordingTrainer, workers=3, rounds_per_epoch=1,
                    master_epochs=1)
    rounds: dict = {}
    for r, j, idx in HELD:
        rounds.setdefault(r, {})[j] = idx
    expected = _replay(softmax_model_fn()(), rounds, RUN["batch_size"])
    for a, b in zip(result.weights, expected):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)


def test_a_trainer_lost_in_the_steps_the_survivors_redo_the_round():
    backend = FakeBackend(fail_when=_dies(1, "dp_steps", 2))
    result = _train(workers=3, min_workers=3, backend=backend, chunk_timeout_s=5.0)
    lost = [e for e in result.events if e["kind"] == "trainer_lost"]
    assert len(lost) == 1 and lost[0]["trainer"] == 1
    h = result.history
    assert [r["round"] for r in h] == list(range(1, 7))
    assert h[1]["workers"] == 2                # redone over the survivors
    assert h[-1]["workers"] == 3               # the replacement copied weights and state
    assert h[-1]["test_accuracy"] > 0.6


class _Abort(Callback):
    def on_row(self, row, run):
        if row["round"] == 3:
            raise KeyboardInterrupt("driver stopped")


def test_resume_continues_bit_equal_with_the_optimizer_state(tmp_path):
    common = dict(trainer_cls=MomentumTrainer, model_fn=momentum_model_fn(), eval_every=1)
    whole = _train(**common)
    with pytest.raises(KeyboardInterrupt):
        _train(checkpoint_dir=str(tmp_path), callbacks=[_Abort()], **common)
    saved = checkpoint.load(str(tmp_path))
    assert saved.round == 3 and saved.meta["scheme"] == "dataparallel"
    assert sorted(saved.optimizer_states) == [0, 1]
    for a, b in zip(*(saved.optimizer_states[j] for j in (0, 1))):
        np.testing.assert_array_equal(a, b)    # every trainer holds the same state
    resumed = _train(resume=str(tmp_path), **common)
    assert [r["round"] for r in resumed.history] == list(range(1, 7))
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)


def test_a_trainer_without_the_gradient_hooks_is_refused_at_the_start():
    with pytest.raises(ConfigError, match="compute_gradients.*apply_gradients"):
        _train(trainer_cls=NoGradients)
    # allreduce, which needs neither, trains it.
    train(softmax_model_fn(), hard_blobs_dataset, "allreduce", trainer_cls=NoGradients,
          backend=FakeBackend(), **{**RUN, "workers": 2})


@pytest.mark.parametrize("setting,match", [
    (dict(outer_lr=0.7), "outer_lr=0.7 does not apply to scheme='dataparallel'"),
    (dict(outer_momentum=0.9), "outer_momentum=0.9 does not apply"),
    (dict(overlap=True), "overlap=True does not apply"),
    (dict(lr_scaling="outer"), "lr_scaling='outer'"),
    (dict(compression="int4"), "compression='int4' needs error feedback"),
])
def test_settings_of_averaging_are_refused(setting, match):
    with pytest.raises(ConfigError, match=match):
        _train(**setting)


def test_a_codec_without_feedback_halves_the_ring_bytes():
    plain = _train(master_epochs=1)
    half = _train(master_epochs=1, compression="fp16")
    assert [r["ring_bytes"] for r in half.history] == [
        r["ring_bytes"] // 2 for r in plain.history]
    # fp16's 1e-3 per gradient, carried through 21 steps at rate 0.5: close, not equal.
    for a, b in zip(plain.weights, half.weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-2)
        assert not np.array_equal(a, b)
    assert half.history[-1]["test_accuracy"] == pytest.approx(
        plain.history[-1]["test_accuracy"], abs=0.02)


def test_trains_on_each_framework_with_its_buffers_kept_equal(framework):
    # The torch model has a BatchNorm: each trainer's running statistics come from its
    # own batches, and the round's end averages them, or the driver's check that every
    # trainer holds the same weights would stop the run.
    model_fn, trainer_cls, options = framework.momentum()
    if framework.name == "torch":   # plain SGD: momentum 0.9 at 0.5 is unstable with BN
        model_fn, trainer_cls, options = (framework.model_fn(batchnorm=True),
                                          framework.trainer(), framework.options)
    result = train(model_fn, hard_blobs_dataset, "dataparallel", trainer_cls=trainer_cls,
                   backend=FakeBackend(), **{**RUN, "workers": 2, "master_epochs": 3,
                                             **options})
    assert result.scheme == "dataparallel" and result.history[-1]["test_accuracy"] > 0.6
    assert all(r["ring_bytes"] > 0 for r in result.history)


def keras_bn_model():
    from helpers_modules.keras_defs import bn_model_fn

    return bn_model_fn()


def test_keras_on_tensorflow_trains_data_parallel():
    # Gradients by GradientTape, steps by the model's optimizer, BatchNorm's moving
    # statistics averaged once a round: the driver checks every round that both
    # trainers hold the same weights and optimizer state.
    from ddlf_actors.apps import tf_startup

    with tf_startup.quiet_startup():
        pytest.importorskip("keras")
    result = train(keras_bn_model, hard_blobs_dataset, "dataparallel", workers=2,
                   master_epochs=2, rounds_per_epoch=2, batch_size=16, progress=False,
                   backend=FakeBackend())
    assert result.framework == "keras" and result.scheme == "dataparallel"
    assert all(r["workers"] == 2 and r["ring_bytes"] > 0 for r in result.history)
    assert result.history[-1]["test_accuracy"] > 0.6
