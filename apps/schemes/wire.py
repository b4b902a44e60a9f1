"""The driver's end of the wire: ``compression=`` for the schemes.

A scheme hands each version of the weights to :meth:`Wire.broadcast` and sends every
trainer the call :meth:`Broadcast.train` / :meth:`Broadcast.evaluate` describe for it; it
decodes what comes back with :meth:`Wire.received`. Without compression (``None``, ``"none"`` or
``("none", "none")``) this is the plain path: one ``put`` of the arrays, ``train`` and
``evaluate`` called with its ref, deltas as lists of arrays.

With compression, the down codec decides how weights travel (see ``apps/weight_messages.py`` for the
messages):

- **whole weights**, once per version (one ``put``), for a lossless codec or a lossy one
  that does not need summing (``fp16``, ``int8``). The driver keeps its weights exact and
  encodes each version afresh, so rounding never accumulates;
- **changes of a shared replica**, for a codec that needs summing (``topk``) or one with
  error feedback (``int8:ef``, ``fp16:ef``): every trainer holds the same replica ``r``;
  a broadcast sends ``C(w − r)`` and everyone, the driver included, sets
  ``r ← r + decode(C(w − r))`` (DoubleSqueeze-style bidirectional compression). This *is*
  error feedback on the driver's side, with the residual held as ``w − r``: what a change
  leaves out is part of the next one, and nothing drifts from rounding a running sum. A
  trainer that does not hold the previous version (a replacement, an elastic addition,
  every trainer after a resume) is sent the whole replica instead, exactly.

A trainer's rows, its result and its evaluations are of the weights the trainers hold
(the decoded broadcast), which for a lossless codec are the driver's weights bit for bit.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable

import numpy as np

from .. import codecs
from ..arrays import nbytes
from ..records import TrainStats
from ..weight_messages import CHANGE, SET, Weights, apply_change, difference

__all__ = ["Wire", "Broadcast", "CallSpec", "resolve", "PLAIN", "WHOLE", "CHANGES"]

# A trainer call as (method name, args, kwargs): what a scheme's machine turns into a
# ``Call`` order.
CallSpec = tuple[str, tuple, dict]

PLAIN = "plain"       # no compression: arrays as they are
WHOLE = "whole"       # the weights, encoded, once per version
CHANGES = "changes"   # changes of a replica every trainer shares


def resolve(spec) -> tuple[codecs.Codec, codecs.Codec, str]:
    """``(down, up, mode)`` for a ``compression=`` value; ValueError for a bad one."""
    down, up = codecs.resolve_pair(spec)
    if down.name == "none" and up.name == "none":
        return down, up, PLAIN
    if down.needs_summing or down.error_feedback:
        if not down.error_feedback:
            raise ValueError(
                f"down codec {down.spec!r}: weights are sent as changes of the trainers' "
                "replica, and the part of a change a codec leaves out is always sent later "
                f"(the driver keeps w − replica), so ':noef' does not apply; use "
                f"{down.spec.replace(':noef', '')!r}")
        return down, up, CHANGES
    return down, up, WHOLE


def _no_put(value):
    raise RuntimeError("this Wire was made without a put (to check a compression spec): it "
                       "cannot send weights")


class Broadcast:
    """One version of the weights on its way to the trainers.

    ``model`` is what a trainer holds once it has it (the decoded weights). ``train`` and
    ``evaluate`` make the call on a slot's trainer with what that trainer needs;
    :meth:`take_bytes` returns the bytes sent since the last call (each message counted
    once per trainer, as one ``put`` crosses each trainer's connection once).
    """

    def __init__(self, wire: Wire, source: list, model: list, version: int,
                 message: Any, message_bytes: int, full: Weights | None = None):
        self.wire = wire
        self.source = source
        self.model = model
        self.version = version
        self._message = message            # the ref every trainer is sent (plain, whole, change)
        self._message_bytes = message_bytes
        self._full = full                  # CHANGES: the replica, for a trainer without the base
        self._full_ref: Any = None
        self._given: dict = {}             # (slot, its trainer's start) -> the ref it was sent
        self._bytes = 0

    def ref_for(self, slot) -> Any:
        """The ref to send ``slot``'s trainer, counting its bytes the first time."""
        key = (slot.index, slot.starts)
        ref = self._given.get(key)
        if ref is not None:
            return ref
        ref, size = self._message, self._message_bytes
        wire = self.wire
        if self._full is not None:
            # A change applies only to the version before it: a trainer that does not hold
            # that one (it joined, or this broadcast is no longer the newest) gets the replica.
            if wire.held.get(slot.index) != (slot.starts, self.version - 1) \
                    or wire.version != self.version:
                if self._full_ref is None:
                    self._full_ref = wire.put(self._full)
                ref, size = self._full_ref, self._full.nbytes
        if wire.mode == CHANGES:
            wire.held[slot.index] = (slot.starts, self.version)
        self._given[key] = ref
        self._bytes += size
        return ref

    def train(self, slot, indices, epochs: int, batch_size: int, *, residual: bool = False,
              **options) -> CallSpec:
        """``slot``'s train call with these weights. ``residual``: ask a compressing
        trainer for its error-feedback residual (a checkpoint round)."""
        ref = self.ref_for(slot)
        if self.wire.mode == PLAIN:
            return "train", (ref, indices, epochs, batch_size), dict(options)
        return ("train_wire", (ref, indices, epochs, batch_size),
                {"residual": residual, **options})

    def evaluate(self, slot, shard) -> CallSpec:
        """``slot``'s call evaluating these weights on test shard ``shard = (k, K)``."""
        ref = self.ref_for(slot)
        if self.wire.mode == PLAIN:
            return "evaluate", (ref, shard), {}
        return "evaluate_wire", (ref, shard), {}

    def take_bytes(self) -> int:
        out, self._bytes = self._bytes, 0
        return out


class Wire:
    """The driver's codecs, the replica the trainers share, and what each trainer holds.

    ``modes``: how the scheme can send weights. ``CHANGES`` needs every trainer to get
    the same version at a time (sync); an asynchronous scheme, whose trainers hold
    different versions, leaves it out and so refuses a down codec that needs it. A
    scheme that does not encode its traffic at all gives only ``PLAIN``. Raises
    ValueError (naming what to use instead) for a ``spec`` outside ``modes``.
    """

    def __init__(self, spec, scheme: str, modes: tuple = (PLAIN, WHOLE, CHANGES),
                 put: Callable[[Any], Any] | None = None):
        self.down, self.up, self.mode = resolve(spec)
        # The runtime's put: the run's backend's (DDLF's, Ray's, or the in-process fake's).
        # Without one (checking a spec) nothing can be sent.
        self.put: Callable[[Any], Any] = put or _no_put
        if self.mode not in modes:
            from ..options import ConfigError

            raise ConfigError("compression", self._refusal(scheme, modes))
        self.run = secrets.token_hex(8)
        self.version = 0
        self.replica: list | None = None
        self.held: dict = {}                 # slot index -> (its trainer's start, version)
        self.residuals: dict = {}            # slot index -> its last reported residual
        self.pending_residuals: dict = {}    # from a checkpoint, for the resumed trainers
        self.last: Broadcast | None = None

    def _refusal(self, scheme: str, modes: tuple) -> str:
        if PLAIN in modes and WHOLE in modes:
            return (f"down codec {self.down.spec!r} is sent as changes of one "
                    f"replica that every trainer shares, which the {scheme!r} scheme cannot "
                    "keep (its trainers hold different versions of the weights). Use a codec "
                    "that sends whole weights down and compress the deltas: compression="
                    f"('fp16', {self.up.spec!r}), or ('none', {self.up.spec!r}); or train_sync")
        return (f"is not supported by the {scheme!r} scheme: its machine sends plain arrays "
                "only (its wire_modes); leave it out")

    @property
    def plain(self) -> bool:
        return self.mode == PLAIN

    # -- weights down --------------------------------------------------------------------------
    def broadcast(self, w: list) -> Broadcast:
        """A new version of the weights ``w``; ``.model`` is what the trainers will hold."""
        self.version += 1
        v = self.version
        if self.mode == PLAIN:
            bc = Broadcast(self, w, w, v, self.put(w), nbytes(w))
        elif self.mode == WHOLE:
            payload = self.down.encode(w)
            model = w if self.down.lossless else [np.asarray(a) for a in self.down.decode(payload)]
            msg = Weights(SET, self.run, v, None, payload, self.up)
            bc = Broadcast(self, w, model, v, self.put(msg), msg.nbytes)
        elif self.replica is None:
            self.replica = [np.array(a, copy=True) for a in w]
            msg = self._full(v)
            bc = Broadcast(self, w, self.replica, v, self.put(msg), msg.nbytes)
        else:
            payload = self.down.encode(difference(w, self.replica))
            self.replica = apply_change(self.replica, self.down.decode(payload))
            msg = Weights(CHANGE, self.run, v, v - 1, payload, self.up)
            bc = Broadcast(self, w, self.replica, v, self.put(msg), msg.nbytes,
                           full=self._full(v))
        self.last = bc
        return bc

    def _full(self, version: int) -> Weights:
        return Weights(SET, self.run, version, None, codecs.get("none").encode(self.replica),
                       self.up)

    def model(self, w: list) -> list:
        """The weights the trainers hold for ``w``: the last broadcast's if it was of ``w``,
        else what a broadcast of ``w`` would give them (nothing is sent)."""
        if self.last is not None and self.last.source is w:
            return self.last.model
        if self.mode == PLAIN or self.down.lossless:
            return w
        if self.mode == WHOLE:
            return [np.asarray(a) for a in self.down.decode(self.down.encode(w))]
        if self.replica is None:
            return w
        return apply_change(self.replica, self.down.decode(
            self.down.encode(difference(w, self.replica))))

    # -- deltas up -----------------------------------------------------------------------------
    def received(self, delta) -> tuple[list, int]:
        """``(delta as arrays, bytes that crossed the wire)`` for what a train call returned."""
        if self.mode == PLAIN:
            return delta, nbytes(delta)
        if not isinstance(delta, codecs.Encoded):
            raise TypeError(f"a trainer returned {type(delta).__name__} for an encoded delta: "
                            "its class overrides train_wire wrongly")
        return codecs.decode(delta), delta.nbytes

    # -- membership and checkpoints ------------------------------------------------------------
    def keep(self, slot_index: int, stats: TrainStats) -> int:
        """Take a reported residual out of ``stats``; return its bytes (they crossed too)."""
        if "wire_residual" not in stats:
            return 0
        residual = stats.pop("wire_residual")
        self.residuals[slot_index] = residual
        return 0 if residual is None else nbytes([r for r in residual if r is not None])

    def lose(self, slot_index: int) -> None:
        """A trainer was lost: its residual went with it, and its replacement holds nothing."""
        self.residuals.pop(slot_index, None)
        self.pending_residuals.pop(slot_index, None)
        self.held.pop(slot_index, None)

    def admit(self, slot) -> CallSpec | None:
        """A trainer joins: after a resume, it continues its slot's saved delta stream
        (the call that gives it its residual, or None)."""
        residual = self.pending_residuals.pop(slot.index, None)
        if residual is not None and not self.plain:
            return "load_wire_residual", (self.run, self.up, residual), {}
        return None

    def position(self) -> dict:
        """The JSON part of a checkpoint (the arrays are :meth:`arrays`)."""
        return {"version": self.version, "replica": self.replica is not None,
                "residuals": {str(j): [r is None for r in res]
                              for j, res in self.residuals.items() if res is not None}}

    def arrays(self) -> dict:
        out = {}
        if self.replica is not None:
            out["replica"] = self.replica
        for j, res in self.residuals.items():
            if res is not None:
                out[f"residual{j}"] = [r for r in res if r is not None]
        return out

    def restore(self, position: dict | None, arrays: dict) -> None:
        """Continue from a checkpoint's :meth:`position` and :meth:`arrays`."""
        if not position:
            return
        self.version = int(position.get("version", 0))
        if position.get("replica"):
            self.replica = [np.array(a, copy=True) for a in arrays["replica"]]
        for j, nones in position.get("residuals", {}).items():
            saved = iter(arrays.get(f"residual{j}", []))
            self.pending_residuals[int(j)] = [None if none else next(saved) for none in nones]
