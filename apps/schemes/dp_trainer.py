"""Data-parallel, the trainer's end: ``TrainerActor`` inherits :class:`DataParallelTrainer`.

A round is :meth:`DataParallelTrainer.dp_hold` on every trainer (keep the round's rows
and its starting state), then :meth:`DataParallelTrainer.dp_steps` on every trainer: for
each step, the gradient of this trainer's batch (``compute_gradients``), a ring
all-reduce of it over ``ring.py`` (the same chunks, mailbox and neighbour calls as
allreduce's), and the mean applied by this trainer's own optimizer (``apply_gradients``).
Every member applies the same bits, so weights and optimizer state stay equal, as in
PyTorch DDP; the driver checks a CRC of both after each round.

Batches: member j holds ``n_j`` rows; step s has ``b_j = min(B, n_j − sB)`` of them
(none past its end) and j's gradient counts ``b_j / Σ b``: with losses that are batch
means, that is the gradient of one batch made of every member's. A member with no rows
left in a step still takes part, with weight 0. Buffers (BatchNorm's statistics, which
each trainer updates from its own batches) are averaged once at the end of the round.

A collective that fails (a member lost, a timeout) puts back the round's starting weights
and optimizer state: the driver redoes the round over the survivors. Numpy only here.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from ddlf_actors.errors import ActorDiedError

from .. import backends, ring
from ..arrays import nbytes
from .averaging import like_layers

__all__ = ["DataParallelTrainer", "batch_sizes"]


def batch_sizes(counts: list[int], batch_size: int, step: int) -> list[int]:
    """Each member's rows in step ``step`` of an epoch, from its rows ``counts``."""
    return [max(0, min(batch_size, n - step * batch_size)) for n in counts]


class DataParallelTrainer:
    """The trainer side of ``scheme="dataparallel"`` (module doc)."""

    # What TrainerActor and AllreduceTrainer provide.
    _ddlf_index: int
    _last_call_end: float | None
    x: Any
    y: Any
    _ring_mailbox: Callable[[], ring.Mailbox]
    _stats: Callable[..., dict]
    ring_send: Callable[..., Any]
    get_weights: Callable[[], list]
    set_weights: Callable[[list], None]
    buffer_mask: Callable[[], list]
    get_optimizer_state: Callable[[], Any]
    set_optimizer_state: Callable[[Any], None]
    set_learning_rate: Callable[[float], None]
    compute_gradients: Callable[..., tuple]
    apply_gradients: Callable[[list], None]

    _dp_held: dict | None = None

    def dp_hold(self, key, indices, epochs: int, batch_size: int,
                return_state: bool = False, learning_rate: float | None = None) -> dict:
        """Round ``key = (run, round)``: keep rows ``indices`` and the state the round
        starts from (weights, optimizer state) for :meth:`dp_steps`; the stats (samples)."""
        start = time.perf_counter()
        if learning_rate is not None:
            self.set_learning_rate(learning_rate)
        self._dp_held = {"key": tuple(int(k) for k in key), "indices": np.asarray(indices),
                         "epochs": int(epochs), "batch_size": int(batch_size),
                         "start": (self.get_weights(), self.get_optimizer_state()),
                         "dirty": False}
        return self._stats(start, int(len(indices)), 0.0, False)

    def _dp_restore(self, held: dict) -> None:
        weights, state = held["start"]
        self.set_weights(weights)
        if state is not None:
            self.set_optimizer_state(state)
        held["dirty"] = False

    def dp_steps(self, tag, rank: int, size: int, right, fraction: float, timeout_s: float,
                 counts=(), codec=None, want_state: bool = False, **_unused) -> dict:
        """Run the held round's steps as member ``rank`` of ``size`` (sending to the
        handle ``right``; ``tag = (run, round, attempt)``); ``counts`` are every member's
        rows, in rank order (``fraction``, allreduce's weight of a member, is not used: a
        step's weights come from ``counts``). ``codec`` encodes each hop. Returns
        ``{"status": "done", "digest", "loss", "compute_s", "sent_bytes", "steps", ...}``
        (with ``want_state`` the optimizer state), or with the round's starting state
        put back ``"aborted"``, ``"peer_lost"``, ``"timeout"``, ``"nonfinite"``."""
        start = time.perf_counter()
        tag = tuple(int(t) for t in tag)
        held = self._dp_held
        if held is None or held["key"] != tag[:2]:
            have = None if held is None else held["key"]
            raise RuntimeError(f"dataparallel {tag} on trainer {self._ddlf_index}, which holds "
                               f"the rows of (run, round) {have} (a DDLF bug)")
        if held["dirty"]:       # a redo: from the round's start again
            self._dp_restore(held)
        held["dirty"] = True
        counts = [int(n) for n in counts]
        idx, B = held["indices"], held["batch_size"]
        x, y = self.x[idx], self.y[idx]
        steps = max([-(-n // B) for n in counts] + [0])
        box = self._ring_mailbox()
        sent = [0]
        ring_s = 0.0
        runtime = backends.here()
        reply: dict = {"index": self._ddlf_index}
        step_no = 0
        loss_sum = 0.0

        def reduce(arrays: list, share: float) -> list:
            nonlocal ring_s, step_no
            step_tag = (*tag, step_no)
            step_no += 1
            box.begin(step_tag)
            vectors, spec = ring.scaled_vectors(arrays, share)
            t0 = time.perf_counter()

            def send(phase, step, chunk):
                sent[0] += ring.chunk_nbytes(chunk)
                return self.ring_send(right, step_tag, phase, step, chunk)

            summed = ring.run_member(vectors, rank, size, step_tag, box, send, runtime,
                                     timeout_s, codec=codec)
            ring_s += time.perf_counter() - t0
            return like_layers(ring.unflatten(summed, spec), arrays)

        try:
            for _epoch in range(held["epochs"]):
                loss_sum = 0.0
                for s in range(steps):
                    sizes = batch_sizes(counts, B, s)
                    mine = sizes[rank]
                    # A member out of rows still computes a gradient (of one row, weight
                    # 0): the ring needs its arrays' shapes, the same as everyone's.
                    if mine:
                        xb, yb = x[s * B:s * B + mine], y[s * B:s * B + mine]
                    else:
                        xb, yb = self.x[:1], self.y[:1]
                    grads, loss = self.compute_gradients(xb, yb)
                    if mine:
                        loss_sum += float(loss) * mine
                    self.apply_gradients(reduce(list(grads), mine / sum(sizes)))
            mask = self.buffer_mask()
            if any(mask):     # each trainer's own batches moved them: average them once
                weights = self.get_weights()
                share = counts[rank] / max(1, sum(counts))
                mean = reduce([w for w, m in zip(weights, mask) if m], share)
                it = iter(mean)
                self.set_weights([next(it) if m else w for w, m in zip(weights, mask)])
        except (ring.CollectiveAborted, ring.PeerLost, ring.CollectiveTimeout,
                ValueError) as e:
            if isinstance(e, ValueError) and codec is None:
                raise
            status = {ring.CollectiveAborted: "aborted", ring.PeerLost: "peer_lost",
                      ring.CollectiveTimeout: "timeout"}.get(type(e), "nonfinite")
            self._dp_restore(held)
            return {**reply, "sent_bytes": sent[0], "status": status, "detail": str(e)}
        spent = time.perf_counter() - start
        if self._last_call_end is not None:
            self._last_call_end += spent   # the round's steps are work, not idle time
        reply.update(status="done", digest=self.dp_digest(), sent_bytes=sent[0],
                     loss=loss_sum / max(1, counts[rank]), steps=step_no,
                     compute_s=spent - ring_s, collective_s=ring_s)
        if want_state:
            reply["optimizer_state"] = self.get_optimizer_state()
        return reply

    def dp_digest(self) -> int:
        """A CRC of the weights and the optimizer state held here: every member of a
        data-parallel run holds the same."""
        state = self.get_optimizer_state() or []
        return ring.weights_digest(list(self.get_weights()) + [np.asarray(a) for a in state])

    def dp_snapshot(self) -> tuple[list, Any]:
        """The weights and the optimizer state: what a trainer joining copies."""
        return self.get_weights(), self.get_optimizer_state()

    def dp_adopt(self, source) -> dict:
        """Copy the weights and the optimizer state from the live trainer ``source``:
        ``{"status": "done", "digest", "bytes"}``, or ``"source_lost"``."""
        try:
            weights, state = backends.here().get(source.dp_snapshot.remote())
        except ActorDiedError as e:
            return {"status": "source_lost", "detail": str(e).strip().splitlines()[0]}
        self.set_weights(weights)
        if state is not None:
            self.set_optimizer_state(state)
        return {"status": "done", "digest": self.dp_digest(),
                "bytes": nbytes(weights) + nbytes(list(state or []))}
