"""Asynchronous data parallelism: the paper's Algorithm 3, improved.

Trainers never wait for each other. As each delta arrives the driver applies
``delta_j / K`` (divided by ``staleness + 1`` with ``staleness_scaling``), then gives
that trainer the newest weights and a fresh partition. ``staleness_bound = s`` is SSP:
a trainer may start its next update only while it is at most ``s`` updates ahead of
the slowest trainer. An epoch ends when the trainers together have processed as many
samples as the training set holds; there is one history row per epoch.
"""

from __future__ import annotations

import collections
import time

import numpy as np

import ddlf_actors as ddlf

from ..trainer import nbytes
from .base import Scheme, config_from_call, partition_indices

__all__ = ["AsyncScheme", "train_async"]


class AsyncScheme(Scheme):
    name = "async"

    def total_rows(self) -> int:
        return self.config.master_epochs

    def _work(self, rng):
        """Queues of (epoch, indices) pieces for the whole run, and the samples per epoch.

        Trainers that share one dataset take the next piece from one queue, so a fast
        trainer never idles while a slow one still has work. With a partitioned dataset
        each trainer has its own queue of pieces of its own partition.
        """
        cfg, K = self.config, self.K
        shared = not any(info.get("partitioned") for info in self.infos)
        queues = [collections.deque() for _ in range(1 if shared else K)]
        total = 0
        for epoch in range(1, cfg.master_epochs + 1):
            parts = partition_indices(rng, self.infos, K, cfg.rounds_per_epoch)
            for r in range(cfg.rounds_per_epoch):
                for j in range(K):
                    queues[0 if shared else j].append((epoch, parts[j][r]))
                    total += len(parts[j][r])
        return queues, total // cfg.master_epochs

    def loop(self, w: list) -> list:
        cfg, K, trainers = self.config, self.K, self.trainers
        queues, epoch_samples = self._work(np.random.default_rng(cfg.seed))
        w_bytes = nbytes(w)
        self.updates = []
        version = 0                     # updates applied so far
        counts = [0] * K                # updates completed per trainer
        w_ref, w_ref_version = None, -1
        inflight: dict = {}             # train ref -> (trainer, start version, lead)
        pending_evals = [collections.deque() for _ in range(K)]  # per trainer: (row, ref)
        eval_parts: dict = {}           # id(row) -> [row, eval refs by shard]
        weights_at: dict = {}           # id(row) -> the weights that row evaluates
        parked: set[int] = set()
        samples_done = 0
        epoch_done = 0
        epoch_stats: list = []
        t_epoch = time.perf_counter()

        def queue_of(j: int):
            return queues[0] if len(queues) == 1 else queues[j]

        def dispatch(j: int) -> None:
            nonlocal w_ref, w_ref_version
            if not queue_of(j):
                return
            lead = counts[j] - min(counts)
            if cfg.staleness_bound is not None and lead > cfg.staleness_bound:
                parked.add(j)   # SSP: wait for the slowest trainer to catch up
                return
            parked.discard(j)
            if w_ref_version != version:
                w_ref, w_ref_version = self.put_weights(w), version
            while pending_evals[j]:
                row, snapshot = pending_evals[j].popleft()
                eval_parts[id(row)][1][j] = self.submit_eval(j, snapshot)
            _epoch, piece = queue_of(j).popleft()
            ref = trainers[j].train.remote(w_ref, piece, cfg.worker_epochs, cfg.batch_size)
            self.bytes_sent += w_bytes + piece.nbytes
            inflight[ref] = (j, version, lead)

        for j in range(K):
            dispatch(j)
        while inflight and not self.run_state.stop:
            ready, _ = ddlf.wait(list(inflight), num_returns=1)
            ref = ready[0]
            j, start_version, lead = inflight.pop(ref)
            delta, stats = ddlf.get(ref)
            self.bytes_received += nbytes(delta)
            staleness = version - start_version
            scale = 1.0 / K
            if cfg.staleness_scaling:
                scale /= staleness + 1
            w = [wi - (scale * di).astype(wi.dtype, copy=False) for wi, di in zip(w, delta)]
            version += 1
            counts[j] += 1
            self.updates.append({"trainer": j, "start_version": start_version,
                                 "applied_version": version, "staleness": staleness,
                                 "lead": lead, "loss": stats["loss"]})
            samples_done += stats["samples"]
            # An update received in this epoch may have started in the previous one: count
            # only the part of its work that falls inside this epoch's window, so that the
            # row's compute_s never exceeds its wall time (nor overhead_s goes negative).
            inside = max(0.0, time.perf_counter() - t_epoch)
            epoch_stats.append({**stats, "compute_s": min(stats["compute_s"], inside),
                                "eval_s": min(stats.get("eval_s", 0.0),
                                              max(0.0, inside - stats["compute_s"]))})
            while epoch_done < cfg.master_epochs and samples_done >= (epoch_done + 1) * epoch_samples:
                epoch_done += 1
                now = time.perf_counter()
                row = self.new_row(version, epoch_done, epoch_stats, now - t_epoch)
                epoch_stats, t_epoch = [], now
                weights_at[id(row)] = w
                if self.num_test:
                    # Evaluated in K shards, each queued before a trainer's next call.
                    snapshot = self.put_weights(w)
                    self.bytes_sent += K * w_bytes
                    eval_parts[id(row)] = [row, [None] * K]
                    for q in pending_evals:
                        q.append((row, snapshot))
                else:
                    self.finish_row(row, [])
            self._collect_evals(eval_parts)
            dispatch(j)
            for p in sorted(parked):
                dispatch(p)
        if inflight:  # stopped early: let running calls end; their deltas are dropped
            ddlf.get(list(inflight))
        # Evaluations not yet queued on a train call run now, on all trainers at once.
        for j in range(K):
            while pending_evals[j]:
                row, snapshot = pending_evals[j].popleft()
                if id(row) in eval_parts:
                    eval_parts[id(row)][1][j] = self.submit_eval(j, snapshot)
        self._collect_evals(eval_parts, block=not self.run_state.stop)
        if self.run_state.stop and self.history.rows:
            return weights_at.get(id(self.history.rows[-1]), w)
        return w

    def _collect_evals(self, eval_parts: dict, block: bool = False) -> None:
        """Finish rows, in order, whose K evaluation shards are all back."""
        for key in list(eval_parts):
            row, refs = eval_parts[key]
            if any(r is None for r in refs):
                break
            if not block:
                ready, _ = ddlf.wait(refs, num_returns=len(refs), timeout=0)
                if len(ready) < len(refs):
                    break
            self.finish_row(row, ddlf.get(refs))
            del eval_parts[key]


def train_async(model_fn, dataset, *, workers: int = 2, master_epochs: int = 1,
                worker_epochs: int = 1, batch_size: int = 32, rounds_per_epoch: int = 1,
                staleness_bound=None, staleness_scaling: bool = False, target_accuracy=None,
                patience=None, trainer_cls=None, num_cpus: float = 1, progress: bool = True,
                seed=0, callbacks=(), trainers=None, initial_weights=None,
                trainer_options=None, placement_strategy: str = "SPREAD",
                placement_timeout_s: float = 60.0):
    """Train ``model_fn()`` data-parallel on ``workers`` trainers, asynchronously.

    Same arguments and errors as :func:`train_sync`, plus ``staleness_bound`` (SSP: no
    trainer runs more than that many updates ahead of the slowest) and
    ``staleness_scaling`` (divide a delta by its staleness + 1). ``result.updates``
    records, per applied update, the trainer, the versions, its staleness and how far
    ahead of the slowest trainer it started (``lead``).
    """
    config = config_from_call(locals())
    return AsyncScheme(model_fn, dataset, config, trainers).run(initial_weights)
