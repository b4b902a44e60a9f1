"""Every scheme's state machine, with the real driver loop, on the in-process fake backend:
no cluster, no sockets, no processes. Losses, joins, late deltas and resume positions.

Most run on both the numpy model and a small PyTorch module (the ``framework`` fixture:
the same test, parametrized), so the PyTorch adapter goes through every fault path too.

The cluster tests (test_schemes.py, test_training_faults.py, test_allreduce.py ...) check
the same behaviour end to end with real processes; these pin each transition down in a
fraction of a second, deterministically where the scheme is.
"""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
from helpers_modules.fake_faults import dies as _dies
from helpers_modules.numpy_trainer import (
    NumpyTrainer,
    hard_blobs_dataset,
    softmax_model_fn,
)

from ddlf_actors.apps import Callback, checkpoint, train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.schemes import TooFewTrainersError, WeightsLostError

SCHEMES = ["sync", "async", "allreduce", "easgd", "downpour"]
RUN = dict(workers=2, master_epochs=3, seed=7, progress=False)


def _train(scheme="sync", backend=None, trainer_cls=NumpyTrainer, model_fn=None, kit=None,
           **options):
    """A run on the fake backend; with ``kit`` (a framework fixture), on its model, its
    variant of ``trainer_cls`` and its options."""
    if kit is not None:
        model_fn = model_fn or kit.model_fn()
        trainer_cls = kit.trainer(trainer_cls)
        options = {**kit.options, **options}
    return train(model_fn or softmax_model_fn(), hard_blobs_dataset, scheme,
                 trainer_cls=trainer_cls, backend=backend or FakeBackend(), **{**RUN, **options})


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]




@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_trains_in_process(scheme, framework):
    result = _train(scheme, kit=framework)
    assert [r["epoch"] for r in result.history][-1] == 3
    assert result.history[-1]["test_accuracy"] > 0.6
    # A row of an asynchronous run counts who finished work in it: one or both.
    assert all(r["workers"] == 2 for r in result.history) or scheme in ("async", "easgd",
                                                                         "downpour")


def test_sync_and_allreduce_agree_bit_for_bit_at_two_trainers(framework):
    sync = _train("sync", rounds_per_epoch=3, kit=framework)
    ring = _train("allreduce", rounds_per_epoch=3, kit=framework)
    for a, b in zip(sync.weights, ring.weights):
        np.testing.assert_array_equal(a, b)
    assert ring.history[-1]["ring_bytes"] > 0


def test_a_seeded_sync_run_is_repeatable(framework):
    a, b = _train("sync", kit=framework), _train("sync", kit=framework)
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(x, y)


# -- losses ------------------------------------------------------------------------------------
def test_sync_a_trainer_lost_mid_round_costs_its_share_and_is_replaced(framework):
    # min_workers=2: the round after the loss waits for the replacement (in-process rounds
    # take microseconds; without it the run could end before the replacement is built).
    result = _train("sync", rounds_per_epoch=3, min_workers=2, kit=framework,
                    backend=FakeBackend(fail_when=_dies(1, "train", 2)))
    lost = _kinds(result, "trainer_lost")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and lost[0]["round"] == 2
    h = result.history
    assert [r["round"] for r in h] == list(range(1, 10))
    # Round 2 closed with trainer 0's delta only: its half of the chunk's 200 rows in whole
    # batches of 32 (3 of the 6; the 8 rows short of a batch go to the last piece).
    assert h[1]["workers"] == 1 and h[1]["samples"] == 96
    joined = _kinds(result, "trainer_joined")
    assert joined and joined[0]["trainer"] == 1
    assert h[-1]["workers"] == 2 and h[-1]["test_accuracy"] > 0.6


def test_sync_an_evaluation_shard_of_a_lost_trainer_moves_to_another(framework):
    result = _train("sync", rounds_per_epoch=2, eval_every=1, kit=framework,
                    backend=FakeBackend(fail_when=_dies(1, "evaluate", 2)))
    assert len(_kinds(result, "trainer_lost")) == 1
    # Every row still has its test accuracy: the lost shard was evaluated elsewhere.
    assert all(r["test_accuracy"] is not None for r in result.history)


@pytest.mark.parametrize("scheme", ["async", "easgd", "downpour"])
def test_asynchronous_a_lost_trainers_work_is_done_again(scheme, framework):
    # Its first call: each trainer surely gets one (the queue hands out work as trainers
    # are free, so how many more it gets depends on the threads' timing).
    method = "run_steps" if scheme == "downpour" else "train"
    result = _train(scheme, kit=framework, backend=FakeBackend(fail_when=_dies(1, method, 1)))
    assert len(_kinds(result, "trainer_lost")) == 1
    # Each epoch still counts every sample once: a lost piece (and Downpour's unpushed
    # ones) went back to the queue.
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
    assert sum(r["samples"] for r in result.history) == 3 * 600
    assert result.history[-1]["test_accuracy"] > 0.55


def test_allreduce_a_member_lost_in_the_collective_is_redone_by_the_survivors(framework):
    backend = FakeBackend(fail_when=_dies(1, "allreduce_held", 2))
    result = _train("allreduce", workers=3, min_workers=3, rounds_per_epoch=2, kit=framework,
                    backend=backend, chunk_timeout_s=5.0)
    lost = _kinds(result, "trainer_lost")
    assert len(lost) == 1 and lost[0]["trainer"] == 1
    assert [r["round"] for r in result.history] == list(range(1, 7))
    assert result.history[1]["workers"] == 2                 # the redone round: survivors
    assert result.history[-1]["workers"] == 3                # the replacement took part
    assert result.history[-1]["test_accuracy"] > 0.6


def test_allreduce_every_holder_lost_at_once_is_a_clear_error():
    def everyone(actor, name, n):
        return name == "hold_delta" and n == 2
    with pytest.raises(WeightsLostError, match="every trainer holding the current weights"):
        _train("allreduce", rounds_per_epoch=2, backend=FakeBackend(fail_when=everyone))


def test_too_few_trainers_left_fails_after_the_rejoin_timeout():
    first = _dies(1, "train", 2)
    died = []

    def fail_when(actor, name, n):
        if first(actor, name, n):
            died.append(actor)
            return True
        # Every replacement of slot 1 dies starting (its node is gone for good).
        return bool(died) and actor is not died[0] and name == "describe" \
            and actor.instance is not None and actor.instance._ddlf_index == 1

    with pytest.raises(TooFewTrainersError, match="min_workers=2"):
        _train("sync", rounds_per_epoch=3, min_workers=2, rejoin_timeout_s=0.2,
               backend=FakeBackend(fail_when=fail_when))


# -- joins -------------------------------------------------------------------------------------
class _AddCpuAfter(Callback):
    """A CPU appears after ``rows`` rows; the run goes on once the trainer it lets start
    has answered (in-process rounds take microseconds: the run could end first)."""

    def __init__(self, backend, rows):
        self.backend, self.rows, self.seen = backend, rows, 0

    def on_row(self, row, run):
        self.seen += 1
        if self.seen == self.rows:
            self.backend.add_cpus(1)
            # The waiting trainer starts now; let it finish starting before the run goes
            # on (in-process rounds take microseconds: the run could end first).
            self.backend.quiesce()


@pytest.mark.parametrize("scheme", ["sync", "async", "allreduce"])
def test_elastic_a_trainer_joins_when_a_cpu_appears(scheme, framework):
    backend = FakeBackend(num_cpus=1)
    options = dict(rounds_per_epoch=2) if scheme != "async" else {}
    result = _train(scheme, workers=(1, 2), backend=backend, kit=framework,
                    callbacks=[_AddCpuAfter(backend, 1)], **options)
    workers = [r["workers"] for r in result.history]
    assert workers[0] == 1 and workers[-1] == 2, workers
    assert _kinds(result, "trainer_joined")


# -- late deltas -------------------------------------------------------------------------------
class GatedTrainer(NumpyTrainer):
    """Slot 0's first fit waits for the test's gate: a straggler, without timings."""

    gate = threading.Event()

    def fit(self, x, y, epochs, batch_size):
        self._fits = getattr(self, "_fits", 0) + 1
        if self._ddlf_index == 0 and self._fits == 1:
            assert self.gate.wait(10), "the test never opened the gate"
        return super().fit(x, y, epochs, batch_size)


class GatedTorchTrainer(GatedTrainer):
    adapter_cls = None   # the adapter follows the model: PyTorch


class _OpenGate(Callback):
    def on_row(self, row, run):
        GatedTrainer.gate.set()


def test_sync_backup_workers_fold_a_late_delta_into_a_later_round(framework):
    GatedTrainer.gate = threading.Event()
    gated = GatedTrainer if framework.name == "numpy" else GatedTorchTrainer
    result = _train("sync", rounds_per_epoch=3, backup_workers=1, trainer_cls=gated,
                    model_fn=framework.model_fn(), callbacks=[_OpenGate()], **framework.options)
    h = result.history
    assert h[0]["workers"] == 1 and h[0]["late"] == 0   # closed without the straggler
    # Its delta is folded into the round open when it arrives (round 2, or a later one
    # when the machine is busy), weighted down by its staleness.
    first = next(u for u in result.updates if u["trainer"] == 0)
    assert first["start_version"] == 0 and first["applied_version"] >= 2
    assert first["staleness"] == first["applied_version"] - 1
    assert first["weight"] == pytest.approx(first["samples"] / (1 + first["staleness"]))
    assert h[first["applied_version"] - 1]["late"] >= 1
    # Later rounds may leave whichever trainer is slower late too (backup_workers=1);
    # every sample of every epoch is still trained once.
    assert sum(u["samples"] for u in result.updates) == 3 * 600


# -- stopping and resuming ---------------------------------------------------------------------
def test_a_stopped_sync_run_returns_the_weights_of_its_last_row():
    result = _train("sync", rounds_per_epoch=3, eval_every=1, target_accuracy=0.3)
    assert result.stopped_early and len(result.history) == 1


@pytest.mark.parametrize("scheme,compression", [("sync", None), ("allreduce", None),
                                                ("sync", "topk:0.2"), ("sync", "int8:ef")])
def test_resume_from_a_middle_checkpoint_is_bit_equal(scheme, compression, tmp_path, framework):
    model_fn, trainer_cls, options = framework.momentum()   # optimizer state to keep
    extra = dict(compression=compression) if compression else {}
    full = _train(scheme, model_fn=model_fn, trainer_cls=trainer_cls,
                  rounds_per_epoch=2, checkpoint_dir=str(tmp_path / "a"), keep_checkpoints=10,
                  **extra, **options)
    ckpt = checkpoint.load(str(tmp_path / "a"))
    assert ckpt.optimizer_states, "the checkpoints keep the trainers' optimizer state"
    names = checkpoint.list_checkpoints(str(tmp_path / "a"))
    assert len(names) == 6
    middle = tmp_path / "b"
    middle.mkdir()
    shutil.copy(names[2], middle)   # after round 3
    resumed = train(model_fn, hard_blobs_dataset, scheme, resume=str(middle),
                    trainer_cls=trainer_cls, backend=FakeBackend(),
                    **{**RUN, "rounds_per_epoch": 2, **extra, **options})
    for a, b in zip(full.weights, resumed.weights):
        np.testing.assert_array_equal(a, b)
    assert [r["round"] for r in resumed.history] == list(range(1, 7))
    assert _kinds(resumed, "resumed")


@pytest.mark.parametrize("scheme", ["async", "easgd", "downpour"])
def test_asynchronous_resume_continues_from_the_position(scheme, tmp_path, framework):
    full = _train(scheme, checkpoint_dir=str(tmp_path / "a"), keep_checkpoints=20,
                  kit=framework)
    names = checkpoint.list_checkpoints(str(tmp_path / "a"))
    assert names
    middle = tmp_path / "b"
    middle.mkdir()
    pick = names[len(names) // 2]
    shutil.copy(pick, middle)
    resumed = train(framework.model_fn(), hard_blobs_dataset, scheme, resume=str(middle),
                    trainer_cls=framework.trainer(), backend=FakeBackend(),
                    **{**RUN, **framework.options})
    assert [r["epoch"] for r in resumed.history] == [1, 2, 3]
    assert sum(r["samples"] for r in resumed.history) == sum(r["samples"] for r in full.history)
    assert resumed.history[-1]["test_accuracy"] > 0.55


def test_checkpoint_events_reach_the_callbacks(tmp_path):
    seen = []

    class Events(Callback):
        def on_event(self, event, run):
            seen.append(event["kind"])

    _train("sync", rounds_per_epoch=2, checkpoint_dir=str(tmp_path), callbacks=[Events()])
    assert seen.count("checkpoint") >= 5


# -- a machine alone: events in, orders out, no backend at all ---------------------------------
def _sync(workers=2, num_train=8, num_test=0, **options):
    """A SyncMachine over slots with no trainers behind them (calls are only orders)."""
    from ddlf_actors.apps.config import TrainConfig
    from ddlf_actors.apps.schemes.machine import RunContext
    from ddlf_actors.apps.schemes.plan import Plan
    from ddlf_actors.apps.schemes.slots import Slot, SlotState
    from ddlf_actors.apps.schemes.sync import SyncMachine, SyncOptions
    from ddlf_actors.apps.schemes.wire import Wire

    config = TrainConfig(workers=workers, master_epochs=1, batch_size=2, progress=False)
    defaults = dict(rounds_per_epoch=2, eval_every=1, outer_momentum=0.0, lr_scaling="none")
    opts = SyncOptions(**{**defaults, **options}).resolve(config)
    info = {"num_train": num_train, "num_test": num_test, "learning_rate": None}
    opts = opts.for_data(config, [info])
    ctx = RunContext(config, opts, Plan(0, opts.rounds_per_epoch, num_train),
                     Wire(None, "sync", SyncMachine.wire_modes, put=lambda v: v),
                     num_test, info, t0=0.0)
    slots = [Slot(j, handle=f"trainer-{j}", state=SlotState.LIVE, info=info)
             for j in range(workers)]
    return SyncMachine(ctx), slots


def _stats(j, samples):
    return {"samples": samples, "loss": 0.5, "compute_s": 0.1, "idle_s": 0.0, "eval_s": 0.0,
            "index": j}


def _calls(orders, kind="train"):
    from ddlf_actors.apps.schemes.orders import Call

    return [o for o in orders if isinstance(o, Call) and o.kind == kind]


def test_sync_machine_a_round_waits_for_every_delta_then_averages():
    from ddlf_actors.apps.schemes.events import CallDone
    from ddlf_actors.apps.schemes.orders import EmitRow

    m, (a, b) = _sync()
    w = [np.zeros(3, np.float32)]
    first = _calls(m.start(w, [a, b]))
    assert [c.slot for c in first] == [a, b] and [len(c.args[1]) for c in first] == [2, 2]
    assert m.handle(CallDone(first[0].id, a, ([np.full(3, 1.0, np.float32)], _stats(0, 2)),
                             now=1.0)) == []                    # still waiting for b
    orders = m.handle(CallDone(first[1].id, b, ([np.full(3, 3.0, np.float32)],
                                                _stats(1, 2)), now=2.0))
    # The mean of the two deltas was applied; round 2 went out with the new weights.
    np.testing.assert_array_equal(m.w[0], np.full(3, -2.0, np.float32))
    second = _calls(orders)
    assert [c.slot for c in second] == [a, b]
    np.testing.assert_array_equal(second[0].args[0][0], m.w[0])
    assert not any(isinstance(o, EmitRow) for o in orders)     # evaluated with round 2
    assert m.round_no == 1


def test_sync_machine_a_lost_trainer_costs_its_share_and_a_joiner_gets_work():
    from ddlf_actors.apps.schemes.events import CallDone, TrainerLost, TrainersJoined
    from ddlf_actors.apps.schemes.slots import Slot, SlotState

    m, (a, b) = _sync()
    first = _calls(m.start([np.zeros(2, np.float32)], [a, b]))
    m.handle(CallDone(first[0].id, a, ([np.ones(2, np.float32)], _stats(0, 2)), now=1.0))
    orders = m.handle(TrainerLost(b, RuntimeError("gone"), (first[1].id,), now=2.0))
    # The round closed with a's delta alone, for its own samples; round 2 is a's only.
    np.testing.assert_array_equal(m.w[0], -np.ones(2, np.float32))
    assert [c.slot for c in _calls(orders)] == [a]
    replacement = Slot(1, handle="trainer-1b", state=SlotState.LIVE, info=b.info, starts=2)
    joined = m.handle(TrainersJoined((replacement,), now=3.0))
    assert _calls(joined) == []                # it takes work from the next round on
    assert 1 in m.live and m.live[1] is replacement


def test_sync_machine_a_late_delta_is_folded_in_with_its_staleness():
    from ddlf_actors.apps.schemes.events import CallDone

    m, (a, b) = _sync(backup_workers=1)
    first = _calls(m.start([np.zeros(1, np.float32)], [a, b]))
    # b's delta is in: the round may leave one call late, so it closes now.
    second = _calls(m.handle(CallDone(first[1].id, b, ([np.full(1, 2.0, np.float32)],
                                                       _stats(1, 2)), now=1.0)))
    assert [c.slot for c in second] == [b]     # a is still busy with round 1
    np.testing.assert_array_equal(m.w[0], [-2.0])
    assert m.handle(CallDone(first[0].id, a, ([np.full(1, 4.0, np.float32)], _stats(0, 2)),
                             now=1.5)) == []   # late: kept for the round open now
    m.handle(CallDone(second[0].id, b, ([np.full(1, 1.0, np.float32)], _stats(1, 4)),
                      now=2.0))
    # Round 2: b's delta (4 samples, weight 4) and a's late one (2 samples, staleness 1:
    # weight 2 / 2 = 1): w = -2 - (4*1 + 1*4) / 5.
    np.testing.assert_allclose(m.w[0], [-2.0 - 8.0 / 5.0])
    assert [u["staleness"] for u in m.updates] == [0, 0, 1]


def test_sync_machine_position_restores_where_it_was():
    import json

    from ddlf_actors.apps.schemes.events import CallDone

    m, (a, b) = _sync(rounds_per_epoch=4, eval_every=2)
    orders = m.start([np.zeros(1, np.float32)], [a, b])
    for c in _calls(orders):
        orders = m.handle(CallDone(c.id, c.slot, ([np.ones(1, np.float32)],
                                                  _stats(c.slot.index, 1)), now=1.0))
    second = _calls(orders)                           # round 2 of the run never stopped
    position = json.loads(json.dumps(m.position()))   # what a checkpoint keeps
    assert position["pending_row"] is None and position["outer_steps"] == 1

    class _Ckpt:
        meta = {"position": position}
        arrays: dict = {}

    again, (a2, b2) = _sync(rounds_per_epoch=4, eval_every=2)
    again.round_no = m.round_no
    again.restore(_Ckpt())
    resumed = _calls(again.start(list(m.w), [a2, b2]))
    assert [c.args[1].tolist() for c in resumed] == [c.args[1].tolist() for c in second]
    assert again.rounds.outer.steps == m.rounds.outer.steps


def test_the_first_rows_time_starts_when_training_does():
    """Trainer start-up is the result's startup_s, not the first round's wall time."""
    import time as _time

    class SlowStart(NumpyTrainer):
        def __init__(self, *args, **kwargs):
            _time.sleep(0.3)
            super().__init__(*args, **kwargs)

    result = _train("sync", rounds_per_epoch=3, trainer_cls=SlowStart)
    assert result.startup_s >= 0.3
    first = result.history[0]
    assert first["wall_s"] < 0.25 and first["overhead_s"] < 0.25, first
