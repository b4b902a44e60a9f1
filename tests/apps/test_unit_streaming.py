"""Streamed rounds (``overlap=True``, ``fragments=F``) on the in-process fake backend: the
arithmetic of corrections and fragments, a machine event by event, and whole runs through
losses, joins, late deltas, balance, codecs with error feedback and bit-equal resumes."""

from __future__ import annotations

import shutil
import threading

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

from ddlf_actors.apps import Callback, checkpoint, train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.options import ConfigError
from ddlf_actors.apps.schemes.fragments import Fragments, LocalStream

RUN = dict(workers=2, master_epochs=3, seed=7, progress=False)
PLAIN = dict(outer_lr=1.0, outer_momentum=0.0, lr_scaling="none")
STREAMED = [dict(overlap=True), dict(fragments=3), dict(overlap=True, fragments=2)]


def _train(backend=None, trainer_cls=NumpyTrainer, model_fn=None, scheme="sync", **options):
    return train(model_fn or softmax_model_fn(), hard_blobs_dataset, scheme,
                 trainer_cls=trainer_cls, backend=backend or FakeBackend(),
                 **{**RUN, **options})


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]




# -- the arithmetic ----------------------------------------------------------------------------
def test_fragments_are_equal_slices_across_tensors():
    like = [np.zeros((3, 4), np.float32), np.zeros(2, np.float32), np.zeros(7, np.float32)]
    frags = Fragments(like, 3)
    assert [sum(hi - lo for _i, lo, hi in p) for p in frags.pieces] == [7, 7, 7]
    w = [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(12, 14, dtype=np.float32),
         np.arange(14, 21, dtype=np.float32)]
    flat = np.concatenate([a.ravel() for a in frags.take(w, 0) + frags.take(w, 1)
                           + frags.take(w, 2)])
    np.testing.assert_array_equal(flat, np.arange(21))
    out = frags.put(w, 1, [-v for v in frags.take(w, 1)])
    assert out[0] is not w[0] and w[0][1, 3] == 7          # the input is never written
    np.testing.assert_array_equal(np.concatenate([a.ravel() for a in out]),
                                  np.r_[np.arange(7), -np.arange(7, 14), np.arange(14, 21)])
    with pytest.raises(ValueError, match="cannot cut 2 parameter values into 3"):
        Fragments([np.zeros(2)], 3)


def test_a_correction_keeps_the_progress_the_global_does_not_hold():
    st = LocalStream("run", Fragments([np.zeros(2, np.float32)], 1))
    st.receive(0, 0, [np.array([1.0, 1.0], np.float32)])
    x = st.correct([np.zeros(2, np.float32)])
    np.testing.assert_array_equal(x[0], [1, 1])            # a start: the global itself
    x = [x[0] - 0.5]                                       # round 1's steps
    np.testing.assert_array_equal(st.send(x, 0, 1)[0], [0.5, 0.5])
    x = [x[0] - 0.25]                                      # round 2 (overlapped), sent
    st.send(x, 0, 2)
    # Round 1's outer step arrives: the global moved by 0.4 where this trainer moved 0.5.
    st.receive(0, 1, [np.array([0.6, 0.6], np.float32)])
    x = st.correct(x)
    # Its own round-2 progress is kept on top of the global: 0.6 - 0.25.
    np.testing.assert_allclose(x[0], [0.35, 0.35])
    assert [k for k, _g in st.pending[0]] == [2]
    assert st.correct(x) is x                              # applied once only


# -- a machine alone ---------------------------------------------------------------------------
def _machine(**options):
    from ddlf_actors.apps.config import TrainConfig
    from ddlf_actors.apps.schemes.machine import RunContext
    from ddlf_actors.apps.schemes.plan import Plan
    from ddlf_actors.apps.schemes.slots import Slot, SlotState
    from ddlf_actors.apps.schemes.sync import SyncMachine, SyncOptions
    from ddlf_actors.apps.schemes.wire import Wire

    config = TrainConfig(workers=2, master_epochs=1, batch_size=2, progress=False)
    opts = SyncOptions(**{"rounds_per_epoch": 4, "eval_every": 4, **PLAIN, **options})
    info = {"num_train": 16, "num_test": 0, "learning_rate": None}
    opts = opts.resolve(config).for_data(config, [info])
    ctx = RunContext(config, opts, Plan(0, opts.plan_rounds(), 16),
                     Wire(None, "sync", SyncMachine.wire_modes, put=lambda v: v), 0, info,
                     t0=0.0)
    slots = [Slot(j, handle=f"trainer-{j}", state=SlotState.LIVE, info=info)
             for j in range(2)]
    return SyncMachine(ctx), slots


def _stats(j):
    return {"samples": 2, "loss": 0.5, "compute_s": 0.1, "idle_s": 0.0, "eval_s": 0.0,
            "index": j}


def test_overlap_hands_out_round_t_plus_2_with_round_ts_outer_step():
    from ddlf_actors.apps.schemes.events import CallDone

    m, (a, b) = _machine(overlap=True)
    orders = m.start([np.zeros(2, np.float32)], [a, b])
    calls = [o for o in orders if getattr(o, "kind", None) == "train"]
    # Rounds 1 and 2 at once; round 1 brings the weights, round 2 nothing new.
    assert [c.args[0][1] for c in calls] == [1, 1, 2, 2]
    assert [c.args[1] for c in calls] == [[(0, 0)], [(0, 0)], [], []]
    got = []
    for c in calls[:2]:
        got += m.handle(CallDone(c.id, c.slot, ([np.ones(2, np.float32)], _stats(c.slot.index)),
                                 now=1.0))
    third = [o for o in got if getattr(o, "kind", None) == "train"]
    # Round 1 closed: round 3 goes out carrying its global (base round 1), while round 2
    # is still out.
    assert [c.args[0][1] for c in third] == [3, 3] and m.round_no == 1
    assert [c.args[1] for c in third] == [[(0, 1)], [(0, 1)]]
    np.testing.assert_array_equal(third[0].args[7][0], [-1, -1])
    assert m.open is not None and m.open.number == 2


# -- whole runs --------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", STREAMED + [dict(fragments=6, rounds_per_epoch=1)])
def test_one_trainer_with_plain_averaging_is_sgd(extra):
    """K = 1, plain averaging: every global is the trainer's own progress, so streamed or
    not, a run is the same SGD, to rounding: an overlapped trainer's weights come back as
    ``w − (w − x)``, which float32 rounds unless the step is small next to ``w`` (so not
    bit for bit: it differed by up to 1.3e-6 on an AVX-512 machine), and the fragments'
    corrections add more of it."""
    one = dict(workers=1, master_epochs=1, batch_size=20, **PLAIN)
    base = _train(rounds_per_epoch=6, **one)
    streamed = _train(**{"rounds_per_epoch": 6 // extra.get("fragments", 1), **extra, **one})
    for a, b in zip(base.weights, streamed.weights):
        np.testing.assert_allclose(a, b, atol=1e-5 if extra.get("fragments", 1) == 1 else 1e-4)


@pytest.mark.parametrize("extra", STREAMED)
def test_streamed_runs_learn_and_fragments_carry_a_fraction(extra):
    result = _train(rounds_per_epoch=3, **extra)
    f = extra.get("fragments", 1)
    assert [r["round"] for r in result.history] == list(range(1, 9 * f + 1))
    assert result.history[-1]["test_accuracy"] > 0.6
    plain = _train(rounds_per_epoch=3)
    up = np.median([r["bytes_received"] for r in result.history[1:]])
    assert up == pytest.approx(np.median([r["bytes_received"] for r in plain.history[1:]]) / f,
                               rel=0.02)
    assert all(r["compute_total_s"] >= r["compute_s"] for r in result.history)


@pytest.mark.parametrize("extra", [dict(overlap=True, compression="int4:ef"),
                                   dict(overlap=True, fragments=2, compression="int8:ef"),
                                   dict(fragments=2, compression=("fp16", "topk:0.2"))])
def test_streamed_runs_with_error_feedback_codecs_learn(extra):
    result = _train(rounds_per_epoch=3, **extra)
    assert result.history[-1]["test_accuracy"] > 0.6


@pytest.mark.parametrize("extra", STREAMED + [dict(overlap=True, compression="int4:ef"),
                                              dict(overlap=True, fragments=2,
                                                   compression="int8:ef"),
                                              dict(fragments=2, compression="fp16"),
                                              dict(overlap=True,
                                                   compression=("fp16", "topk:0.2"))])
def test_resume_from_a_middle_checkpoint_is_bit_equal(extra, tmp_path):
    run = dict(model_fn=momentum_model_fn(), trainer_cls=MomentumTrainer, rounds_per_epoch=2,
               **extra)
    full = _train(checkpoint_dir=str(tmp_path / "a"), keep_checkpoints=100, **run)
    names = checkpoint.list_checkpoints(str(tmp_path / "a"))
    assert len(names) == len(full.history)
    for k in (1, len(names) // 2):
        where = tmp_path / f"b{k}"
        where.mkdir()
        shutil.copy(names[k], where)
        resumed = _train(resume=str(where), **run)
        for a, b in zip(full.weights, resumed.weights):
            np.testing.assert_array_equal(a, b)
        assert [r["round"] for r in resumed.history] == [r["round"] for r in full.history]
        assert _kinds(resumed, "resumed")


@pytest.mark.parametrize("scheme,extra", [
    ("sync", dict(overlap=True)), ("sync", dict(overlap=True, fragments=2)),
    ("sync", dict(overlap=True, compression="int8:ef")), ("sync", dict(fragments=3)),
    ("sync", dict(overlap=True, checkpoint_every=3)),
    ("allreduce", dict(overlap=True)), ("allreduce", dict(overlap=True, checkpoint_every=3))])
def test_a_finished_run_continued_with_more_epochs_is_bit_equal(scheme, extra, tmp_path):
    """Train 2 epochs with checkpoints, then resume with master_epochs=3: the weights of
    a 3-epoch run never stopped (issue 29). The 2-epoch run's last rounds hand out no
    round after them; with overlap, sync still publishes each outer step (as handing out
    the round after next would), so its last checkpoint holds the global that a longer
    run's next round carries. Allreduce does not overlap a round with a checkpoint (the
    weights are fetched at its end), so the uninterrupted run is checkpointed alike."""
    run = dict(model_fn=momentum_model_fn(), trainer_cls=MomentumTrainer, rounds_per_epoch=2,
               scheme=scheme, **extra)
    _train(checkpoint_dir=str(tmp_path / "a"), **{**run, "master_epochs": 2})
    resumed = _train(resume=str(tmp_path / "a"), **run)
    whole = _train(checkpoint_dir=str(tmp_path / "c"), **run)
    for a, b in zip(whole.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)
    assert [r["round"] for r in resumed.history] == [r["round"] for r in whole.history]
    assert [r["test_loss"] for r in resumed.history] == [r["test_loss"] for r in whole.history]


@pytest.mark.parametrize("extra", STREAMED + [dict(overlap=True, fragments=2,
                                                   compression="int4:ef")])
def test_a_trainer_lost_mid_round_is_replaced_and_the_joiner_catches_up(extra):
    result = _train(backend=FakeBackend(fail_when=_dies(1, "train_stream", 2)),
                    rounds_per_epoch=3, min_workers=2, **extra)
    assert len(_kinds(result, "trainer_lost")) == 1
    assert _kinds(result, "trainer_joined")
    h = result.history
    assert [r["round"] for r in h] == list(range(1, len(h) + 1))
    assert min(r["workers"] for r in h) == 1 and h[-1]["workers"] == 2
    assert h[-1]["test_accuracy"] > 0.6


class _AddCpuAfter(Callback):
    """A CPU appears after ``rows`` rows; the run goes on once the trainer it lets start
    has answered (in-process rounds take microseconds: the run could end first)."""

    def __init__(self, backend, rows):
        self.backend, self.rows, self.seen = backend, rows, 0

    def on_row(self, row, run):
        self.seen += 1
        if self.seen == self.rows:
            self.backend.add_cpus(1)
            self.backend.quiesce()


@pytest.mark.parametrize("extra", STREAMED)
def test_elastic_a_trainer_joins_a_streamed_run(extra):
    backend = FakeBackend(num_cpus=1)
    result = _train(workers=(1, 2), backend=backend, rounds_per_epoch=2,
                    callbacks=[_AddCpuAfter(backend, 1)], **extra)
    workers = [r["workers"] for r in result.history]
    assert workers[0] == 1 and workers[-1] == 2, workers
    assert result.history[-1]["test_accuracy"] > 0.6


class GatedTrainer(NumpyTrainer):
    """Slot 0's first fit waits for the test's gate: a straggler, without timings."""

    gate = threading.Event()

    def fit(self, x, y, epochs, batch_size):
        self._fits = getattr(self, "_fits", 0) + 1
        if self._ddlf_index == 0 and self._fits == 1:
            assert self.gate.wait(10), "the test never opened the gate"
        return super().fit(x, y, epochs, batch_size)


class _OpenGate(Callback):
    def on_row(self, row, run):
        GatedTrainer.gate.set()


@pytest.mark.parametrize("extra", STREAMED)
def test_backup_workers_fold_late_deltas_into_their_fragments_round(extra):
    GatedTrainer.gate = threading.Event()
    result = _train(trainer_cls=GatedTrainer, rounds_per_epoch=3, backup_workers=1,
                    callbacks=[_OpenGate()], **extra)
    h = result.history
    assert h[0]["workers"] == 1 and sum(r["late"] for r in h) >= 1
    # Trainer 0's first delta (round 1) was late (folded in whichever later round of its
    # fragment is open when it arrives; with overlap its round 2 may be late or not).
    first = next(u for u in result.updates if u["trainer"] == 0 and u["start_version"] == 0)
    f = extra.get("fragments", 1)
    assert first["staleness"] > 0 and first["applied_version"] >= 2
    # A late delta lands in a round of its own fragment, its weight scaled down by the
    # outer steps of that fragment it missed.
    assert first["staleness"] % f == 0
    assert first["weight"] == pytest.approx(first["samples"] / (1 + first["staleness"] // f))
    assert sum(u["samples"] for u in result.updates) == 3 * 600
    assert h[-1]["test_accuracy"] > 0.6


@pytest.mark.parametrize("extra", STREAMED)
def test_balance_sizes_streamed_rounds(extra):
    result = _train(rounds_per_epoch=3, balance=True, **extra)
    assert sum(r["samples"] for r in result.history) == 3 * 600
    # The shares follow the threads' timing here, which swings (41 to 159 samples of 200
    # from one round to the next): the run is not deterministic. It learns (chance: 0.25).
    assert result.history[-1]["test_accuracy"] > 0.4


def test_too_many_fragments_for_the_data_are_refused():
    with pytest.raises(ConfigError, match="fragments=400 makes"):
        _train(rounds_per_epoch=1, fragments=400)
    with pytest.raises(ConfigError, match="fragments"):
        _train(fragments=0)


def test_the_cli_takes_overlap_and_fragments(capsys):
    from ddlf_actors.apps import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = capsys.readouterr().out
    assert "--overlap" in text and "--fragments" in text


# -- allreduce: the same rounds, the trainers keeping the globals -------------------------------
@pytest.mark.parametrize("extra", STREAMED)
def test_allreduce_streamed_equals_sync_streamed_at_two_trainers(extra):
    ring = _train(scheme="allreduce", rounds_per_epoch=3, **extra)
    sync = _train(rounds_per_epoch=3, **extra)
    for a, b in zip(ring.weights, sync.weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert [r["test_accuracy"] for r in ring.history] == pytest.approx(
        [r["test_accuracy"] for r in sync.history], abs=1e-6)
    f = extra.get("fragments", 1)
    plain = _train(scheme="allreduce", rounds_per_epoch=3)
    assert ring.history[-1]["ring_bytes"] == pytest.approx(plain.history[-1]["ring_bytes"] / f,
                                                           rel=0.02)


class CountingTrainer(MomentumTrainer):
    """Counts the collectives its process ran on a thread of their own (overlap)."""

    background = 0

    def stream_reduce(self, *args, **kwargs):
        if kwargs.get("background"):
            type(self).background += 1
        return super().stream_reduce(*args, **kwargs)


@pytest.mark.parametrize("extra", [dict(overlap=True), dict(overlap=True, fragments=2,
                                                            compression="int4")])
def test_allreduce_overlapped_resume_is_bit_equal(extra, tmp_path):
    # Every other round is a checkpoint round, which ends its collective before the next
    # round starts; the others overlap it with the next round's training.
    run = dict(scheme="allreduce", model_fn=momentum_model_fn(), trainer_cls=CountingTrainer,
               rounds_per_epoch=3, checkpoint_every=2, **extra)
    CountingTrainer.background = 0
    full = _train(checkpoint_dir=str(tmp_path / "a"), keep_checkpoints=100, **run)
    assert CountingTrainer.background > 0
    names = checkpoint.list_checkpoints(str(tmp_path / "a"))
    for k in (0, len(names) // 2):
        where = tmp_path / f"b{k}"
        where.mkdir()
        shutil.copy(names[k], where)
        resumed = _train(resume=str(where), **run)
        for a, b in zip(full.weights, resumed.weights):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("extra", STREAMED + [dict(overlap=True, fragments=2,
                                                   compression="int4")])
@pytest.mark.parametrize("method,call", [("stream_hold", 3), ("stream_reduce", 2)])
def test_allreduce_streamed_losses_are_redone_and_replaced(extra, method, call):
    result = _train(scheme="allreduce", workers=3, min_workers=3, rounds_per_epoch=3,
                    chunk_timeout_s=5.0, backend=FakeBackend(fail_when=_dies(1, method, call)),
                    **extra)
    assert len(_kinds(result, "trainer_lost")) == 1
    h = result.history
    assert [r["round"] for r in h] == list(range(1, len(h) + 1))
    assert min(r["workers"] for r in h) == 2 and h[-1]["workers"] == 3
    assert h[-1]["test_accuracy"] > 0.6


@pytest.mark.parametrize("extra", STREAMED)
def test_allreduce_elastic_a_trainer_joins_a_streamed_run(extra):
    backend = FakeBackend(num_cpus=1)
    result = _train(scheme="allreduce", workers=(1, 2), backend=backend, rounds_per_epoch=2,
                    callbacks=[_AddCpuAfter(backend, 1)], **extra)
    workers = [r["workers"] for r in result.history]
    assert workers[0] == 1 and workers[-1] == 2, workers
    assert result.history[-1]["test_accuracy"] > 0.6


@pytest.mark.parametrize("scheme", ["sync", "allreduce"])
@pytest.mark.parametrize("extra", [dict(overlap=True), dict(overlap=True, fragments=2),
                                   dict(overlap=True, checkpoint_every=2)])
def test_every_row_is_evaluated_with_overlap(scheme, extra, tmp_path):
    """With overlap no round is handed out after the one before the last (and allreduce
    hands none out with a checkpoint round's): rows made then are evaluated all the same."""
    if "checkpoint_every" in extra:
        extra = {**extra, "checkpoint_dir": str(tmp_path)}
    result = _train(scheme=scheme, rounds_per_epoch=3, eval_every=1, **extra)
    h = result.history
    assert [r["round"] for r in h] == list(range(1, len(h) + 1))
    assert all(r["test_accuracy"] is not None for r in h)


@pytest.mark.parametrize("scheme", ["sync", "allreduce"])
def test_a_stopped_overlapped_run_returns_the_weights_of_its_last_row(scheme):
    """Round 1 is the same overlapped or not: a run stopped at its first row returns its
    weights, though round 2 (and with allreduce its collective) ran on meanwhile."""
    blocking = _train(rounds_per_epoch=3, eval_every=1, target_accuracy=0.3)
    overlapped = _train(scheme=scheme, rounds_per_epoch=3, eval_every=1, target_accuracy=0.3,
                        overlap=True)
    assert len(blocking.history) == len(overlapped.history) == 1
    for a, b in zip(blocking.weights, overlapped.weights):
        np.testing.assert_array_equal(a, b)
