"""Training on a multi-node cluster while nodes die and join (numpy trainers, seconds each).

Each test runs its own head and nodes (``MultiNodeCluster``) with one CPU per node, so
where a trainer can go is known: a lost node's trainer has nowhere to go until a node
joins.
"""

from __future__ import annotations

import contextlib

import psutil
import pytest
from cluster_utils import MultiNodeCluster, joined
from helpers_modules.clusters import no_leaked_processes
from helpers_modules.numpy_trainer import SigkillOnce, hard_blobs_dataset, softmax_model_fn
from helpers_modules.util import wait_for

from ddlf_actors.apps import TooFewTrainersError, train_async, train_sync
from ddlf_actors.apps.callbacks import Callback
from ddlf_actors.runtime.client import current

MODEL = softmax_model_fn(64, 4)
SLOW = {"runtime_env": {"env_vars": {"DDLF_TEST_FIT_SLEEP": "0.25"}}}


def kill_node_tree(cluster: MultiNodeCluster, index: int) -> str:
    """Kill a node daemon and every process under it (its workers); return its node id."""
    node = cluster.nodes[index]
    proc = psutil.Process(node["proc"].pid)
    victims = [proc, *proc.children(recursive=True)]
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(victims, timeout=10)
    return node["node_id"]


class _AtRow(Callback):
    """Runs ``action()`` once, after the row of round ``round_no`` is complete."""

    def __init__(self, round_no, action):
        self.round_no, self.action, self.done = round_no, action, False

    def on_row(self, row, run):
        if not self.done and row["round"] >= self.round_no:
            self.done = True
            self.action()


def add_node_and_wait_for_trainers(cluster: MultiNodeCluster, live: int) -> None:
    """Add a 1-CPU node, then hold the driver until ``live`` trainers are constructed (the
    one the new node takes included), so the next rounds see it join whatever the load."""
    cluster.add_node(1)

    def alive():
        actors = current.get_core().head_call("list_actors")
        return sum(1 for a in actors if a.get("class_name") == "SigkillOnce"
                   and a.get("state") == "ALIVE") >= live
    assert wait_for(alive, timeout=60)


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("train", [train_sync, train_async])
def test_a_lost_node_is_survived_and_its_trainer_returns_when_a_node_joins(private_cache, train):
    with no_leaked_processes(grace_s=20):
        cluster = MultiNodeCluster(node_cpus=(1, 1))
        with joined(cluster):
            lost_node = []
            result = train(
                MODEL, hard_blobs_dataset, workers=2, master_epochs=6, rounds_per_epoch=2,
                trainer_cls=SigkillOnce, progress=False, trainer_options=SLOW,
                callbacks=[_AtRow(2, lambda: lost_node.append(kill_node_tree(cluster, 1))),
                           _AtRow(6, lambda: add_node_and_wait_for_trainers(cluster, 2))])
    lost = _kinds(result, "trainer_lost")
    back = _kinds(result, "trainer_joined")
    assert len(lost) == 1 and lost[0]["node"] == lost_node[0]
    assert len(back) == 1 and back[0]["trainer"] == lost[0]["trainer"]
    assert back[0]["node"] not in (None, lost_node[0])   # on the node that joined
    assert back[0]["time_s"] > lost[0]["time_s"]
    epochs = [r["epoch"] for r in result.history]
    assert epochs[-1] == 6 and len(epochs) == len(set(epochs))
    workers = [r["workers"] for r in result.history]
    assert workers[-1] == 2
    if train is train_sync:
        assert 1 in workers   # rounds ran with the survivor alone
    else:
        # While the slot was empty, only the survivor's updates were applied.
        between = [u["trainer"] for u in result.updates
                   if lost[0]["round"] <= u["applied_version"] < back[0]["round"]]
        assert between and set(between) == {1 - lost[0]["trainer"]}
    assert result.history[-1]["test_accuracy"] > 0.5


@pytest.mark.timeout(120)
def test_an_elastic_run_grows_when_a_node_joins(private_cache):
    with no_leaked_processes(grace_s=20):
        cluster = MultiNodeCluster(node_cpus=(1,))
        with joined(cluster):
            result = train_sync(MODEL, hard_blobs_dataset, workers=(1, 2), master_epochs=4,
                                rounds_per_epoch=2, trainer_cls=SigkillOnce, progress=False,
                                batch_size=25,   # whole batches: rounds of exactly 300 rows
                                trainer_options=SLOW,
                                callbacks=[_AtRow(1, lambda: add_node_and_wait_for_trainers(
                                    cluster, 2))])
    workers = [r["workers"] for r in result.history]
    assert workers[0] == 1 and workers[-1] == 2
    assert [e["trainer"] for e in _kinds(result, "trainer_joined")] == [1]
    # Each round's chunk is split among that round's trainers: no sample lost or doubled.
    assert all(r["samples"] == 300 for r in result.history)


@pytest.mark.timeout(120)
def test_below_min_workers_with_no_capacity_fails_clearly(private_cache, tmp_path):
    with no_leaked_processes(grace_s=20):
        cluster = MultiNodeCluster(node_cpus=(1, 1))
        with joined(cluster):
            with pytest.raises(TooFewTrainersError) as info:
                train_sync(MODEL, hard_blobs_dataset, workers=2, min_workers=2,
                           master_epochs=10, rejoin_timeout_s=3, trainer_cls=SigkillOnce,
                           progress=False, trainer_options=SLOW,
                           checkpoint_dir=str(tmp_path),
                           callbacks=[_AtRow(1, lambda: kill_node_tree(cluster, 1))])
    text = str(info.value)
    assert "min_workers=2" in text and "rejoin_timeout_s=3" in text
    assert "ddlf-node start" in text and "resume=" in text
