"""Synchronous data parallelism: the paper's Algorithm 6.

Each round the driver ``put``s the weights once, sends every trainer its index
partition, waits for all K deltas and applies ``w ← w − (1/K) Σ delta_j``.
``rounds_per_epoch = r`` averages r times per epoch, each on 1/r of every partition
(local SGD).
"""

from __future__ import annotations

import time

import numpy as np

import ddlf_actors as ddlf

from ..trainer import nbytes
from .base import Scheme, config_from_call, partition_indices

__all__ = ["SyncScheme", "train_sync"]


class SyncScheme(Scheme):
    name = "sync"

    def total_rows(self) -> int:
        return self.config.master_epochs * self.config.rounds_per_epoch

    def loop(self, w: list) -> list:
        cfg, K, trainers = self.config, self.K, self.trainers
        rng = np.random.default_rng(cfg.seed)
        R = cfg.rounds_per_epoch
        w_bytes = nbytes(w)
        round_no = 0
        prev_row = None  # the row whose weights are evaluated during the next round
        for epoch in range(1, cfg.master_epochs + 1):
            parts = partition_indices(rng, self.infos, K, R)
            for r in range(R):
                t_round = time.perf_counter()
                w_ref = self.put_weights(w)
                # Evaluate the previous round's weights on the trainers, queued before their
                # train call so it costs no extra shipping; see base.py.
                evals = [self.submit_eval(j, w_ref) for j in range(K)] if prev_row else []
                refs = [t.train.remote(w_ref, parts[j][r], cfg.worker_epochs, cfg.batch_size)
                        for j, t in enumerate(trainers)]
                self.bytes_sent += K * w_bytes + sum(parts[j][r].nbytes for j in range(K))
                if prev_row is not None:
                    self.finish_row(prev_row, ddlf.get(evals) if evals[0] is not None else [])
                    prev_row = None
                    if self.run_state.stop:
                        ddlf.get(refs)  # let the round end; its deltas are not applied
                        return w
                results = ddlf.get(refs)
                deltas = [d for d, _ in results]
                stats = [s for _, s in results]
                self.bytes_received += sum(nbytes(d) for d in deltas)
                w = _apply_mean(w, deltas)
                round_no += 1
                prev_row = self.new_row(round_no, epoch - 1 + (r + 1) / R, stats,
                                        time.perf_counter() - t_round)
        if prev_row is not None:
            w_ref = self.put_weights(w)
            evals = [self.submit_eval(j, w_ref) for j in range(K)]
            self.bytes_sent += K * w_bytes
            self.finish_row(prev_row, ddlf.get(evals) if evals[0] is not None else [])
        return w


def _apply_mean(w: list, deltas: list) -> list:
    """``w − (1/K) Σ delta_j``, layer by layer, in the weights' dtype."""
    K = len(deltas)
    out = []
    for i, wi in enumerate(w):
        acc = np.array(deltas[0][i], dtype=wi.dtype, copy=True)
        for d in deltas[1:]:
            acc += d[i]
        out.append(wi - acc / K)
    return out


def train_sync(model_fn, dataset, *, workers: int = 2, master_epochs: int = 1,
               worker_epochs: int = 1, batch_size: int = 32, rounds_per_epoch: int = 1,
               target_accuracy=None, patience=None, trainer_cls=None, num_cpus: float = 1,
               progress: bool = True, seed=0, callbacks=(), trainers=None,
               initial_weights=None, trainer_options=None, placement_strategy: str = "SPREAD",
               placement_timeout_s: float = 60.0):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers, synchronously.

    ``dataset``: a registered name, a callable returning ``((x, y), (x_test, y_test))``
    (shipped once, run on each trainer), or ``datasets.partitioned(path)``. Stops after
    ``master_epochs``, or when ``target_accuracy`` is reached, or after ``patience``
    evaluations without a better test loss. Returns a ``TrainResult`` (``history``,
    ``weights``, ``model``). Starts an embedded cluster if ``ddlf.init()`` was not called.

    The trainers' CPUs are reserved first, together, as a placement group
    (``placement_strategy``, one bundle per trainer), so a run never starts half-placed.

    Raises ``ValueError`` for an unknown dataset, ``UnschedulableError`` (naming the
    demand) when the cluster can never hold ``workers × num_cpus`` CPUs or has not freed
    them within ``placement_timeout_s``, ``TrainerStartError`` when ``model_fn`` or the
    dataset fails on a trainer.
    """
    config = config_from_call(locals())
    return SyncScheme(model_fn, dataset, config, trainers).run(initial_weights)
