"""Trainers spread over the cluster's nodes; each node keeps its own dataset cache."""

from __future__ import annotations

from cluster_utils import MultiNodeCluster
from helpers_modules.clusters import no_leaked_processes
from helpers_modules.numpy_trainer import NumpyTrainer, hard_blobs_dataset, softmax_model_fn

import ddlf_actors as ddlf
from ddlf_actors.apps import TrainConfig, train_async
from ddlf_actors.apps.schemes.pool import start_trainers


def _node_of(self):
    from ddlf_actors.runtime import context

    return context.current.node_id


def test_trainers_spread_over_nodes_and_train(private_cache):
    with no_leaked_processes():
        multi = MultiNodeCluster(node_cpus=(1, 1))
        try:
            ddlf.init(address=multi.address, token=multi.token)
            model = softmax_model_fn(64, 4)
            config = TrainConfig(workers=2, trainer_cls=NumpyTrainer, progress=False)
            trainers = start_trainers(model, hard_blobs_dataset, config)
            nodes = ddlf.get([t.run_method.remote(_node_of, {}) for t in trainers])
            assert len(set(nodes)) == 2  # one trainer per node
            result = train_async(model, hard_blobs_dataset, trainers=trainers,
                                 master_epochs=3, trainer_cls=NumpyTrainer, progress=False)
            assert result.history[-1]["test_accuracy"] > 0.5
            for t in trainers:
                ddlf.kill(t)
        finally:
            ddlf.shutdown()
            multi.stop()
