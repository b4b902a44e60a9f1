"""Allreduce, the trainer's end: ``TrainerActor`` inherits :class:`AllreduceTrainer`.

A round is :meth:`AllreduceTrainer.hold_delta` on every trainer (train, keep the delta),
then :meth:`AllreduceTrainer.allreduce_held` on every trainer: the ring of ``ring.py``
over direct actor calls to the right neighbour, each chunk delivered by the receiver's
``async`` :meth:`AllreduceTrainer.deliver_chunk` while its execution thread waits in the
collective. The driver's end, and the faults, are ``allreduce.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

from ddlf_actors.errors import ActorDiedError

from .. import backends, ring
from ..arrays import nbytes
from .averaging import like_layers, ring_layers
from .fragments import StreamingTrainer
from .outer import apply_outer
from .ring_stream import RingStreamTrainer

__all__ = ["AllreduceTrainer"]

_MAILBOX_LOCK = threading.Lock()


class AllreduceTrainer(RingStreamTrainer, StreamingTrainer):
    """The trainer side of allreduce: ``TrainerActor`` inherits these methods. A round is
    :meth:`hold_delta` on every trainer, then :meth:`allreduce_held` on every trainer.
    Streamed rounds are :class:`~.ring_stream.RingStreamTrainer`'s. (Sync's,
    ``fragments.StreamingTrainer``, come to ``TrainerActor`` through this class too.)"""

    _ddlf_index: int        # what TrainerActor provides
    _last_call_end: float | None
    _train_from_start: Callable[..., Any]
    get_weights: Callable[[], list]
    set_weights: Callable[[list], None]
    buffer_mask: Callable[[], list]

    # This round's delta, kept here, the ring's mailbox, the outer velocity (a copy on every
    # trainer: each applies the same step to the same mean, so the copies stay equal).
    _held: tuple | None = None
    _velocity: list | None = None
    # Error feedback per hop with a lossy ring codec (ring.HopFeedback), as of the last
    # collective that completed here.
    _hop_feedback: ring.HopFeedback | None = None

    def _ring_mailbox(self) -> ring.Mailbox:
        box = getattr(self, "_ddlf_mailbox", None)
        if box is None:
            # The execution thread (the collective) and the event loop (a neighbour's first
            # chunk) can both get here first: two mailboxes would lose that chunk.
            with _MAILBOX_LOCK:
                box = getattr(self, "_ddlf_mailbox", None)
                if box is None:
                    box = self._ddlf_mailbox = ring.Mailbox()
        return box

    def hold_delta(self, key, indices, epochs: int, batch_size: int,
                   return_state: bool = False, learning_rate: float | None = None):
        """Train on rows ``indices`` from the current weights and keep the delta here for
        :meth:`allreduce_held` under ``key`` (``(run, round)``); return only the stats. The
        model keeps the round's starting weights: an evaluation queued behind this call
        sees them, and a collective that is redone starts again from them."""
        old, delta, stats = self._train_from_start(None, indices, epochs, batch_size,
                                                  return_state, learning_rate)
        self.set_weights(old)
        # The velocity (and hop feedback) the round starts from too: a redone collective
        # starts again there.
        hops = None if self._hop_feedback is None else self._hop_feedback.state()
        self._held = (tuple(key), old, delta, self._velocity, hops)
        return stats

    def allreduce_held(self, tag, rank: int, size: int, right, fraction: float,
                       timeout_s: float, outer: dict | None = None, codec=None,
                       feedback: bool = False, want_hops: bool = False) -> dict:
        """Average the held delta with the ring's (member ``rank`` of ``size``, sending to
        the handle ``right``; ``tag`` is ``(run, round, attempt)``), each scaled by its
        ``fraction`` of the samples, and apply the mean to the round's starting weights:
        plainly, or with ``outer = {"rate", "momentum", "nesterov"}`` on this trainer's
        copy of the velocity. ``codec`` (a spec) encodes each hop's chunk, summed in
        float32 (``ring.ring_allreduce``), with this trainer's error feedback per hop if
        ``feedback``; ``want_hops`` adds that feedback's state to the reply (``hops``, a
        checkpoint's). Returns ``{"status": "done", "digest": CRC, "sent_bytes", ...}``,
        or with the weights unchanged ``"aborted"`` (called off), ``"peer_lost"`` (the
        right neighbour died), ``"timeout"`` (nothing from the left for ``timeout_s``) or
        ``"nonfinite"`` (the codec met NaN or inf in this trainer's delta: it diverged).
        ``RuntimeError`` if no delta of that run and round is held (a driver bug)."""
        start = time.perf_counter()
        tag = tuple(int(t) for t in tag)
        if self._held is None or self._held[0] != tag[:2]:
            held = None if self._held is None else self._held[0]
            raise RuntimeError(f"allreduce {tag} on trainer {self._ddlf_index}, which holds "
                               f"the delta of (run, round) {held}")
        _, old, delta, velocity, hops = self._held
        box = self._ring_mailbox()
        box.begin(tag)
        vectors, spec = ring.scaled_vectors(ring_layers(delta), fraction)   # counters: f64
        fb = None
        if feedback:   # from the round's start: a redone collective feeds back the same
            fb = ring.HopFeedback()
            if hops is not None:
                fb.load(hops)
        # The ring's calls go through this trainer's own runtime.
        summed, reply = self._ring_member(tag, rank, size, right, timeout_s, vectors,
                                          backends.here(), box, codec, fb)
        if summed is None:
            return reply
        if fb is not None:
            self._hop_feedback = fb
            if want_hops:
                reply["hops"] = fb.state()
        mean = like_layers(ring.unflatten(summed, spec), delta)
        # Buffers (BatchNorm's statistics) take the mean at rate 1, no momentum (outer.py).
        weights, velocity = apply_outer(old, mean, velocity, outer, self.buffer_mask())
        self.set_weights(weights)
        if outer is not None:
            self._velocity = velocity
        spent = time.perf_counter() - start
        if self._last_call_end is not None:
            self._last_call_end += spent   # the collective is work, not idle time
        return {**reply, "status": "done", "digest": self.held_digest(),
                "collective_s": spent}

    def ring_send(self, right, tag, phase: str, step: int, chunk):
        """Send one chunk to the right neighbour; its call's ref (tests override it)."""
        return right.deliver_chunk.remote(tag, phase, step, chunk)

    async def deliver_chunk(self, tag, phase: str, step: int, chunk) -> None:
        """A chunk from the left. ``async``: it runs on the event loop, while the
        execution thread is inside :meth:`allreduce_held`."""
        self._ring_mailbox().deliver(tag, phase, step, chunk)

    async def abort_collective(self, tag, reason: str) -> None:
        """The driver calls collective ``tag`` off (a member was lost)."""
        self._ring_mailbox().abort(tag, reason)

    def adopt_weights(self, source) -> dict:
        """Copy the weights (and velocity) straight from the live trainer ``source``: how
        a replacement joins. ``{"status": "done", "digest", "bytes"}``, or
        ``{"status": "source_lost"}`` when ``source`` died first."""
        try:
            weights, velocity = backends.here().get(source.held_weights.remote(True))
        except ActorDiedError as e:
            return {"status": "source_lost", "detail": str(e).strip().splitlines()[0]}
        self.set_weights(weights)
        self._velocity = velocity or None   # None: no momentum step yet (zeros)
        return {"status": "done", "digest": self.held_digest(), "bytes": nbytes(weights)}

    def held_weights(self, velocity: bool = False) -> tuple[list, list]:
        """The weights held here and, with ``velocity``, the outer velocity ([] without):
        what the driver fetches for a checkpoint and at the end."""
        return self.get_weights(), list(self._velocity or []) if velocity else []

    def held_digest(self) -> int:
        """A CRC of the weights and the outer velocity this trainer holds: the driver checks
        that every member of an allreduce run holds the same."""
        return ring.weights_digest(list(self.get_weights()) + list(self._velocity or []))

    def set_hop_feedback(self, state: dict | None) -> None:
        """Continue from a checkpoint's hop feedback (``ring.HopFeedback.state()``), or
        start without any (None)."""
        self._hop_feedback = None
        if state is not None:
            self._hop_feedback = ring.HopFeedback()
            self._hop_feedback.load(state)

    def set_outer_velocity(self, velocity) -> None:
        """Start from ``velocity`` (a resumed allreduce run's, or None)."""
        self._velocity = None if velocity is None else [np.array(v, copy=True)
                                                        for v in velocity]
