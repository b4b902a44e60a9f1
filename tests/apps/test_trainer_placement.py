"""A run reserves its K trainers as one placement group: never half-placed."""

from __future__ import annotations

import pytest
from helpers_modules.numpy_trainer import NumpyTrainer, hard_blobs_dataset, softmax_model_fn
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors.apps import TrainConfig, train_sync
from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers
from ddlf_actors.runtime.client import current
from ddlf_actors.util import placement_group_table

MODEL = softmax_model_fn(64, 4)


@ddlf.remote(num_cpus=1)
class CpuHog:
    def ping(self):
        return True


def _groups(state=None):
    return [g for g in placement_group_table().values() if state is None or g["state"] == state]


def test_trainers_live_in_one_reserved_group(train_cluster):
    config = TrainConfig(workers=2, trainer_cls=NumpyTrainer, progress=False)
    trainers = start_trainers(MODEL, hard_blobs_dataset, config)
    try:
        pg = trainers.placement_group
        view = placement_group_table(pg)
        assert view["state"] == "CREATED" and view["strategy"] == "SPREAD"
        assert view["bundles"] == {0: {"CPU": 1.0}, 1: {"CPU": 1.0}}
        from ddlf_actors.util import get_current_placement_group

        def group_id(self):
            g = get_current_placement_group()
            return g.id if g is not None else None

        assert ddlf.get([t.run_method.remote(group_id, {}) for t in trainers],
                        timeout=60) == [pg.id, pg.id]
    finally:
        stop_trainers(trainers)
    assert placement_group_table(pg)["state"] == "REMOVED"
    assert wait_for(lambda: ddlf.available_resources().get("CPU") == 2.0, timeout=10)


def test_a_run_that_cannot_be_placed_in_time_fails_naming_the_demand(train_cluster):
    hog = CpuHog.remote()
    ddlf.get(hog.ping.remote(), timeout=30)
    try:
        with pytest.raises(ddlf.errors.UnschedulableError,
                           match=r"workers=2 .*need 2 CPUs \(2 bundles of \{'CPU': 1.0\}.*"
                                 r"1 free .*within 0.5 s"):
            train_sync(MODEL, hard_blobs_dataset, workers=2, trainer_cls=NumpyTrainer,
                       progress=False, placement_timeout_s=0.5)
        # Nothing was started half-way, and the group is gone.
        assert not _groups("PENDING") and not _groups("CREATED")
        assert not [a for a in current.get_core().head_call("list_actors")
                    if a["class_name"] == "NumpyTrainer" and a["state"] != "DEAD"]
    finally:
        ddlf.kill(hog)
    # Once the CPU is free the same run places and trains.
    result = train_sync(MODEL, hard_blobs_dataset, workers=2, trainer_cls=NumpyTrainer,
                        progress=False, placement_timeout_s=30)
    assert len(result.history) == 1
    assert not _groups("CREATED")   # the run freed its group


def test_placement_options_are_checked():
    with pytest.raises(ValueError, match="placement_strategy must be"):
        TrainConfig(placement_strategy="EVERYWHERE")
    with pytest.raises(ValueError, match="placement_timeout_s must be"):
        TrainConfig(placement_timeout_s=-1)
