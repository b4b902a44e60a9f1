"""The weight messages of a run with ``compression=`` (what crosses the wire) and a trainer's
end of them. (The driver's end is ``schemes/wire.py``.)

With compression on, the driver sends each trainer a :class:`Weights` message instead of
a list of arrays, and a trainer answers with an :class:`~.codecs.Encoded` delta. A message
is one of two kinds:

``set``     the weights themselves, encoded with the down codec (a lossless or a
            non-summing lossy codec: ``none``, ``lz4``, ``zstd``, ``fp16``, ``int8``), or,
            in a run that broadcasts changes, the replica exactly (``none``);
``change``  the change of the weights since version ``base``, encoded with the down codec
            (``topk``, or a codec with ``:ef``). Every trainer holds the same *replica*
            of the weights and adds the same decoded change to it, in the replica's dtype,
            with :func:`apply_change`, which the driver also uses: so the driver knows the
            replica bit for bit.

A message names its run and its version, so a trainer applies each once (a train call and
an evaluation queued with the same message cost one decode) and refuses a change that
does not follow the version it holds: a wrong replica is an error, never a silent drift.

This module is numpy only; the driver's side is ``schemes/wire.py``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from . import codecs
from .codecs import Codec, Encoded

__all__ = ["Weights", "TrainerWire", "WireMethods", "apply_change", "difference", "SET",
           "CHANGE"]

SET = "set"
CHANGE = "change"


class Weights:
    """A down message: ``kind`` (``SET`` or ``CHANGE``), the ``run`` it belongs to, the
    ``version`` it brings the trainer to, the ``base`` version a change applies to (None
    for ``SET``), the ``payload`` (an :class:`Encoded`) and ``up``, the codec the trainer
    encodes its delta with."""

    __slots__ = ("kind", "run", "version", "base", "payload", "up")

    def __init__(self, kind: str, run: str, version: int, base: int | None, payload: Encoded,
                 up: Codec):
        self.kind = kind
        self.run = run
        self.version = version
        self.base = base
        self.payload = payload
        self.up = up

    @property
    def nbytes(self) -> int:
        """The payload's bytes: what this message adds to a connection."""
        return self.payload.nbytes

    def __reduce__(self):
        return Weights, (self.kind, self.run, self.version, self.base, self.payload, self.up)

    def __repr__(self) -> str:
        return (f"Weights({self.kind}, run={self.run}, version={self.version}, base={self.base}, "
                f"{self.payload!r})")


def difference(new: list, old: list) -> list:
    """``new − old`` per tensor, in each tensor's dtype: the change a ``CHANGE`` carries."""
    return [np.subtract(n, o, dtype=np.asarray(o).dtype) for n, o in zip(new, old)]


def apply_change(replica: list, change: list) -> list:
    """``replica + change`` per tensor, in the replica's dtype (new arrays).

    The driver and every trainer compute the next replica with this one function from the
    same decoded change, so they hold the same bits.
    """
    return [np.add(r, np.asarray(c).astype(r.dtype, copy=False), dtype=r.dtype)
            for r, c in zip(replica, change)]


class TrainerWire:
    """A trainer's end of the wire: the weights it holds for the current run, and its own
    encoder for deltas (its error-feedback residual, if the up codec keeps one).

    The residual lives only here: a trainer that dies takes it along (its replacement
    starts a new stream with none), and so does a trainer that a new run reuses.
    """

    def __init__(self):
        self.run: str | None = None
        self.version: int | None = None
        self.weights: list | None = None
        self._encoder = None
        self._encoder_key = None

    def receive(self, msg: Weights) -> list:
        """The weights ``msg`` brings, applying it at most once.

        Raises RuntimeError for a change that does not apply to the version held here (a
        bug in the driver's bookkeeping: it must send this trainer the whole replica).
        """
        if not isinstance(msg, Weights):
            raise TypeError(f"expected a wire.Weights message, got {type(msg).__name__}")
        if msg.run == self.run and msg.version == self.version and self.weights is not None:
            return self.weights
        if msg.kind == SET:
            weights = [np.array(a, copy=True) for a in codecs.decode(msg.payload)]
        elif msg.kind == CHANGE:
            if msg.run != self.run or msg.base != self.version or self.weights is None:
                held = "nothing" if self.run != msg.run else f"version {self.version}"
                raise RuntimeError(
                    f"the driver sent a weight change from version {msg.base} to {msg.version} "
                    f"of run {msg.run}, but this trainer holds {held} of that run; the driver "
                    "should have sent it the whole replica. This is a DDLF bug: please report it")
            weights = apply_change(self.weights, codecs.decode(msg.payload))
        else:
            raise ValueError(f"unknown weight message kind {msg.kind!r}")
        if msg.run != self.run:
            self.reset_encoder()
        self.run, self.version, self.weights = msg.run, msg.version, weights
        return weights

    def encoder(self, codec: Codec):
        """This run's encoder for deltas with ``codec`` (made on first use)."""
        key = (self.run, codec.spec)
        if self._encoder_key != key:
            self._encoder, self._encoder_key = codec.encoder(), key
        return self._encoder

    def encode(self, delta: list, codec: Codec) -> tuple[Encoded, float]:
        """``(payload, seconds spent encoding)``."""
        t0 = time.perf_counter()
        payload = self.encoder(codec).encode(delta)
        return payload, time.perf_counter() - t0

    def residual(self, codec: Codec) -> list | None:
        """The delta stream's residual (per tensor, None where nothing is owed), or None."""
        residual = self.encoder(codec).residual
        return None if residual is None else [None if r is None else np.array(r)
                                              for r in residual]

    def load_residual(self, run: str, codec: Codec, residual: list | None, like: list) -> None:
        """Start run ``run``'s delta stream with ``residual`` (from a checkpoint), for
        tensors laid out as ``like``."""
        # The weights held here (if any) are of another run: a change must not apply to them.
        self.run, self.version, self.weights = run, None, None
        encoder = codec.encoder()
        encoder.restore(residual, like)
        self._encoder, self._encoder_key = encoder, (run, codec.spec)

    def reset_encoder(self) -> None:
        self._encoder = self._encoder_key = None


class WireMethods:
    """The trainer's remote methods for a run with ``compression=`` (``TrainerActor``
    inherits them): :meth:`train` and :meth:`evaluate` with a :class:`Weights` message in
    place of the weights, and an encoded delta in place of the delta."""

    # What the class it is mixed into (TrainerActor) provides.
    train: Callable[..., Any]
    evaluate: Callable[..., Any]
    get_weights: Callable[[], list]
    _last_call_end: float | None

    def _wire_end(self) -> TrainerWire:
        end = getattr(self, "_ddlf_wire", None)
        if end is None:
            end = self._ddlf_wire = TrainerWire()
        return end

    def train_wire(self, msg: Weights, indices, epochs: int, batch_size: int,
                   residual: bool = False, **options):
        """:meth:`train` from the weights ``msg`` brings. Returns ``(payload, stats)``: the
        delta encoded with ``msg.up`` through this trainer's own encoder (which keeps its
        error-feedback residual), and ``train``'s stats plus ``codec_s``, the seconds spent
        decoding the weights and encoding the delta, and with ``residual`` the encoder's
        residual afterwards (``wire_residual``, for a checkpoint). ``options`` go to
        ``train`` as they are."""
        end = self._wire_end()
        t0 = time.perf_counter()
        weights = end.receive(msg)
        decode_s = time.perf_counter() - t0
        delta, stats = self.train(weights, indices, epochs, batch_size, **options)
        payload, encode_s = end.encode(delta, msg.up)
        stats["codec_s"] = decode_s + encode_s
        stats["idle_s"] = max(0.0, stats["idle_s"] - decode_s)   # decoding is work
        if self._last_call_end is not None:
            self._last_call_end += encode_s                     # so is encoding
        if residual:
            stats["wire_residual"] = end.residual(msg.up)
        return payload, stats

    def evaluate_wire(self, msg: Weights, shard=None):
        """:meth:`evaluate` of the weights ``msg`` brings."""
        return self.evaluate(self._wire_end().receive(msg), shard)

    def load_wire_residual(self, run: str, codec: Codec, residual: list | None) -> None:
        """Continue the delta stream of run ``run`` with a residual saved in a checkpoint
        (a resumed run; never a replacement, whose predecessor's later deltas already
        delivered part of it)."""
        self._wire_end().load_residual(run, codec, residual, self.get_weights())
