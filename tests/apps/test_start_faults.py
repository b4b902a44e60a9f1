"""A trainer that dies while it starts is a fault; a ``model_fn`` that raises is an error.

A trainer's process killed in ``__init__`` (SIGKILL, the OOM killer, a preempted node)
raised nothing: the pool starts another in its slot, up to ``START_TRIES`` in a row, and
once ``min_workers`` are live the run goes on and the slot joins later. An exception from
``model_fn`` or the dataset is the user's bug: the run fails at once with the remote
traceback. ``result.events`` says which (``trainer_died_starting``,
``trainer_start_failed``).

The in-process fake backend pins down each path (its ``fail_when`` kills an actor before
its constructor runs); a real cluster then kills real processes: a numpy and a PyTorch
trainer SIGKILLed in ``__init__``, a ``model_fn`` that raises, and one that kills its own
process every time.
"""

from __future__ import annotations

import os
import threading

import pytest
from helpers_modules.fake_faults import dies_starting, hangs_starting
from helpers_modules.numpy_trainer import (
    KillsItself,
    NumpyTrainer,
    RaisesInModelFn,
    SigkillInInit,
    failing_model_fn,
    hard_blobs_dataset,
    softmax_model_fn,
)

from ddlf_actors.apps import Callback, TrainerStartError, train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.config import TrainConfig
from ddlf_actors.apps.schemes.pool import START_TRIES, error_brief, start_trainers, stop_trainers
from ddlf_actors.errors import ActorDiedError

RUN = dict(workers=2, master_epochs=3, rounds_per_epoch=3, seed=7, progress=False)
MODEL = softmax_model_fn()


def _train(backend, model_fn=MODEL, trainer_cls=NumpyTrainer, **options):
    return train(model_fn, hard_blobs_dataset, "sync", trainer_cls=trainer_cls,
                 backend=backend, **{**RUN, **options})


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


# -- in process --------------------------------------------------------------------------------
def test_a_trainer_dying_while_starting_is_replaced_before_the_first_round():
    dying = dies_starting(1, 1)
    result = _train(FakeBackend(fail_when=dying), min_workers=2)
    assert dying.tries == 2                        # it, and the one that took its place
    died = _kinds(result, "trainer_died_starting")
    assert [e["trainer"] for e in died] == [1] and "try 1 of" in died[0]["detail"]
    assert [e["trainer"] for e in _kinds(result, "trainer_joined")] == [1]
    assert not _kinds(result, "trainer_lost") and not _kinds(result, "trainer_start_failed")
    # min_workers=2: training waited for it, so every round had both.
    assert all(r["workers"] == 2 for r in result.history)


class _Release(Callback):
    """After the first row, lets the held trainer start and waits until it is up."""

    def __init__(self, hold, up):
        self.hold, self.up = hold, up
        self.first_row_workers = None

    def on_row(self, row, run):
        if self.first_row_workers is None:
            self.first_row_workers = row["workers"]
            self.hold.set()
            assert self.up.wait(30), "the held trainer never started"


def test_with_min_workers_live_the_run_goes_on_and_the_slot_joins_later():
    hold, up = threading.Event(), threading.Event()
    dying = dies_starting(1, 1, hold=hold)

    def fail_when(actor, name, n):
        if name == "describe" and actor.args[2] == 1 and dying.tries == 2:
            up.set()                               # the held trainer is built
        return dying(actor, name, n)

    release = _Release(hold, up)
    result = _train(FakeBackend(fail_when=fail_when), callbacks=[release])
    assert release.first_row_workers == 1          # it started without slot 1 ...
    died, joined = _kinds(result, "trainer_died_starting"), _kinds(result, "trainer_joined")
    assert [e["trainer"] for e in died] == [1] and [e["trainer"] for e in joined] == [1]
    assert died[0]["time_s"] <= joined[0]["time_s"]
    assert result.history[-1]["workers"] == 2      # ... and slot 1 joined later
    assert result.history[-1]["test_accuracy"] > 0.6


def test_a_slot_whose_trainer_dies_every_try_is_given_up_and_the_run_goes_on():
    dying = dies_starting(1, 1000)
    result = _train(FakeBackend(fail_when=dying))  # min_workers=1
    assert dying.tries == START_TRIES              # bounded
    assert len(_kinds(result, "trainer_died_starting")) == START_TRIES
    failed = _kinds(result, "trainer_start_failed")
    assert len(failed) == 1 and failed[0]["trainer"] == 1
    assert f"{START_TRIES} times in a row" in failed[0]["detail"]
    assert all(r["workers"] == 1 for r in result.history)


def test_too_few_trainers_able_to_start_is_a_clear_error_naming_the_slot_and_tries():
    dying = dies_starting(1, 1000)
    with pytest.raises(TrainerStartError) as err:
        _train(FakeBackend(fail_when=dying), min_workers=2)
    e = err.value
    assert (e.slot, e.tries, e.died) == (1, START_TRIES, True)
    assert f"trainer 1's process died while starting ({START_TRIES} tries" in str(e)
    assert dying.tries == START_TRIES


def test_a_trainer_that_never_reports_ready_is_killed_and_started_again():
    release = threading.Event()
    stuck = hangs_starting(1, 1, release)
    try:
        result = _train(FakeBackend(fail_when=stuck), min_workers=2, start_timeout_s=0.3)
    finally:
        release.set()
    assert stuck.tries == 2                       # the stuck one, and the one in its place
    died = _kinds(result, "trainer_died_starting")
    assert [e["trainer"] for e in died] == [1]
    assert "did not report ready within start_timeout_s=0.3 s, try 1 of" in died[0]["detail"]
    assert [e["trainer"] for e in _kinds(result, "trainer_joined")] == [1]
    assert all(r["workers"] == 2 for r in result.history)


def test_a_trainer_stuck_at_every_try_fails_the_run_naming_the_timeout():
    release = threading.Event()
    stuck = hangs_starting(1, START_TRIES, release)
    try:
        with pytest.raises(TrainerStartError, match=rf"trainer 1 did not report ready within "
                           rf"start_timeout_s=0.2 s \({START_TRIES} tries in a row\)") as err:
            _train(FakeBackend(fail_when=stuck), min_workers=2, start_timeout_s=0.2)
    finally:
        release.set()
    assert err.value.slot == 1 and err.value.died and err.value.tries == START_TRIES
    assert stuck.tries == START_TRIES


def test_trainers_passed_in_are_timed_from_when_the_run_takes_them():
    # start_timeout_s counts from when a run takes its trainers: ones built before it,
    # however long ago, are not overdue (they were once timed from the clock's zero).
    backend = FakeBackend()
    config = TrainConfig(workers=2, trainer_cls=NumpyTrainer, backend=backend, progress=False)
    trainers = start_trainers(MODEL, hard_blobs_dataset, config)
    try:
        result = train(MODEL, hard_blobs_dataset, "sync", trainers=list(trainers),
                       backend=backend, start_timeout_s=1.0, **RUN)
    finally:
        stop_trainers(trainers)
    assert len(result.history) == RUN["master_epochs"] * RUN["rounds_per_epoch"]
    assert not _kinds(result, "trainer_died_starting")


def test_a_start_failures_event_keeps_the_remote_message_however_long_its_traceback():
    frames = "".join(f'  File "/a/deep/checkout/{"x" * 40}/mod{i}.py", line {i}, in f\n'
                     for i in range(20))
    error = ActorDiedError("actor T is dead: its __init__ raised:\nTraceback (most recent "
                           f"call last):\n{frames}RuntimeError: replacement refuses to start",
                           cause=RuntimeError("replacement refuses to start"))
    brief = error_brief(error)
    assert len(brief) <= 500
    assert brief.startswith("RuntimeError: replacement refuses to start\nactor T is dead")


class _AddCpuLate(Callback):
    """Holds each of the first ``rows`` rows for ``hold_s`` (longer than the run's
    ``start_timeout_s``, so the pool checks a slot that has waited past it), then lets a
    CPU appear and waits until the trainer it lets start is up."""

    def __init__(self, backend, rows, hold_s):
        self.backend, self.rows, self.hold_s, self.seen = backend, rows, hold_s, 0

    def on_row(self, row, run):
        self.seen += 1
        if self.seen < self.rows:
            threading.Event().wait(self.hold_s)
        elif self.seen == self.rows:
            self.backend.add_cpus(1)
            self.backend.quiesce()


def test_a_slot_waiting_for_a_cpu_is_not_timed_out():
    backend = FakeBackend(num_cpus=1)
    result = _train(backend, workers=(1, 2), start_timeout_s=0.1,
                    callbacks=[_AddCpuLate(backend, 4, 0.2)])
    assert not _kinds(result, "trainer_died_starting")
    assert [r["workers"] for r in result.history][-1] == 2


def test_an_init_that_raises_fails_the_run_at_once():
    with pytest.raises(TrainerStartError, match="model_fn failed on purpose") as err:
        _train(FakeBackend(), model_fn=failing_model_fn)
    assert err.value.died is False and isinstance(err.value.cause, ZeroDivisionError)
    assert "raised" in str(err.value)


# -- on a cluster: real processes killed ---------------------------------------------------------
def _env(tmp_path, **extra):
    env = {"DDLF_TEST_KILL_DIR": str(tmp_path), "DDLF_TEST_KILL_SLOT": "1",
           "DDLF_TEST_FIT_SLEEP": "0.05", **extra}
    return {"runtime_env": {"env_vars": env}}


@pytest.mark.timeout(300)
def test_a_trainer_sigkilled_in_init_is_replaced(train_cluster, tmp_path, framework):
    result = train(framework.model_fn(), hard_blobs_dataset, "sync",
                   trainer_cls=framework.trainer(SigkillInInit), min_workers=2,
                   trainer_options=_env(tmp_path), **{**RUN, **framework.options})
    assert (tmp_path / "init-killed").exists()     # the fault really happened
    died = _kinds(result, "trainer_died_starting")
    assert [e["trainer"] for e in died] == [1] and "nothing raised" in died[0]["detail"]
    assert [e["trainer"] for e in _kinds(result, "trainer_joined")] == [1]
    assert not _kinds(result, "trainer_lost") and not _kinds(result, "trainer_start_failed")
    assert [r["round"] for r in result.history] == list(range(1, 10))
    assert all(r["workers"] == 2 for r in result.history)
    assert result.history[-1]["test_accuracy"] > 0.5


@pytest.mark.timeout(300)
def test_a_model_fn_that_raises_fails_fast_with_the_remote_traceback(train_cluster, tmp_path):
    with pytest.raises(TrainerStartError) as err:
        train(RaisesInModelFn(str(tmp_path)), hard_blobs_dataset, "sync",
              trainer_cls=NumpyTrainer, **RUN)
    e = err.value
    assert e.died is False and e.tries == 1 and e.slot in (0, 1)
    text = str(e)
    assert "ZeroDivisionError" in text and "Traceback" in text
    assert "return 1 / 0" in text                  # the line of model_fn that raised
    assert "model_fn" in text and "stops rather than try again" in text
    # Never retried: each slot's trainer ran model_fn once at most.
    assert 1 <= len(os.listdir(tmp_path)) <= 2


@pytest.mark.timeout(300)
def test_a_model_fn_that_kills_its_process_every_time_gives_up_naming_slot_and_tries(
        train_cluster, tmp_path):
    with pytest.raises(TrainerStartError) as err:
        train(KillsItself(str(tmp_path)), hard_blobs_dataset, "sync",
              trainer_cls=NumpyTrainer, **RUN)
    e = err.value
    assert e.died is True and e.tries == START_TRIES and e.slot in (0, 1)
    assert f"trainer {e.slot}'s process died while starting ({START_TRIES} tries" in str(e)
    assert "nothing raised" in str(e)
    tries = len(os.listdir(tmp_path))              # bounded: START_TRIES per slot at most
    assert START_TRIES <= tries <= 2 * START_TRIES
