"""Streamed averaging, the driver's end (``overlap=True``, ``fragments=F``; sync uses it,
allreduce its outer step): the globals of the fragments, how they reach each trainer, and
what a checkpoint keeps of them. The trainer's end, and the algorithm, are ``fragments.py``.

Each fragment is a stream of its own (:class:`~.wire.Wire`): with ``compression=`` its
globals go down encoded (whole, or as changes of a replica that the driver and the
trainers share), exactly as sync's weights do, one fragment at a time. A fragment's
global is *published* (encoded and ``put``, once for every trainer) when the first round
that carries it is handed out, and each trainer is sent, with its next call, every
published global it does not hold: after a join (a replacement, an elastic addition) that
is every fragment, so a joiner starts from the newest weights and owes nothing.

The outer optimizer steps one fragment per round (:class:`FragmentOuter`: a velocity per
fragment and its own count of steps, which the warm-up and a schedule of ``outer_lr``
read; the warm-up is ``warmup_rounds / F`` of a fragment's steps).
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Callable

import numpy as np

from .. import codecs
from ..weight_messages import SET, Weights
from .averaging import weighted_mean
from .fragments import Fragments
from .outer import OuterOptimizer
from .wire import PLAIN, Broadcast, CallSpec, Wire

__all__ = ["Streaming", "FragmentOuter", "StreamEval"]


class FragmentOuter:
    """One outer optimizer per fragment (``OuterOptimizer``'s settings for each)."""

    def __init__(self, count: int, lr, momentum: float, nesterov: bool, scale_with_k: bool,
                 warmup_rounds: int):
        warm = math.ceil(warmup_rounds / count) if warmup_rounds else 0
        self.parts = [OuterOptimizer(lr, momentum, nesterov, scale_with_k, warm)
                      for _ in range(count)]
        self.last_rate = 1.0

    @property
    def plain(self) -> bool:
        return self.parts[0].plain

    @property
    def steps(self) -> list[int]:
        return [p.steps for p in self.parts]

    def step(self, values: list, f: int, mean: list, k: int, buffers=None) -> list:
        """Fragment ``f``'s new global from ``values`` and its averaged outer gradient
        (``buffers``: the mask of its pieces, which take the mean at rate 1)."""
        out = self.parts[f].step(values, mean, k, buffers)
        self.last_rate = self.parts[f].last_rate
        return out

    def remote_settings(self, k: int, f: int) -> dict | None:
        return self.parts[f].remote_settings(k)

    def took_step(self, settings: dict | None, f: int) -> None:
        self.parts[f].took_step(settings)
        self.last_rate = self.parts[f].last_rate

    def arrays(self) -> dict:
        return {f"outer{f}": p.state() for f, p in enumerate(self.parts) if p.state()}

    def load(self, arrays: dict, steps) -> None:
        steps = steps if isinstance(steps, list) else [0] * len(self.parts)
        for f, p in enumerate(self.parts):
            p.load_state(arrays.get(f"outer{f}", []), steps[f] if f < len(steps) else 0)


class _Published:
    """A fragment's newest global on its way out: its broadcast and base round."""

    def __init__(self, bc: Broadcast, base: int, serial: int):
        self.bc = bc
        self.base = base
        self.serial = serial


class Streaming:
    """The driver's fragments for one run: ``spec`` is the run's ``compression=``,
    ``weights`` the initial weights (their layout), ``count`` the fragments."""

    def __init__(self, spec, scheme: str, modes: tuple, put: Callable[[Any], Any],
                 weights: list, count: int):
        self.layout = Fragments(weights, count)
        self.count = count
        self.wires = [Wire(spec, scheme, modes, put=put) for _ in range(count)]
        self.plain = self.wires[0].plain
        self.up: codecs.Codec | None = None if self.plain else self.wires[0].up
        self.run = secrets.randbits(63)   # trainers can outlive a run: name this one
        self.bases = [0] * count          # fragment f's global holds sends of rounds <= this
        self.dirty = set(range(count))    # changed since published
        self.latest: list[_Published | None] = [None] * count
        self.given: dict[tuple[int, int], dict[int, int]] = {}   # (slot, starts) -> f: serial
        self._serial = 0
        self._out: list[Broadcast] = []   # broadcasts whose bytes are not yet taken
        self.states: dict[int, tuple[dict, list]] = {}           # slot -> its last state
        self.pending_states: dict[int, tuple[dict, list]] = {}   # from a checkpoint

    def fragment_of(self, round_no: int) -> int:
        """The fragment round ``round_no`` (1-based) syncs."""
        return (round_no - 1) % self.count

    # -- globals out ---------------------------------------------------------------------------
    def publish(self, w: list) -> None:
        """Send from now on the globals of the fragments ``w`` changed since last time."""
        for f in sorted(self.dirty):
            self._serial += 1
            bc = self.wires[f].broadcast(self.layout.take(w, f))
            self.latest[f] = _Published(bc, self.bases[f], self._serial)
            self._out.append(bc)
        self.dirty.clear()

    def messages(self, slot) -> tuple[list, list]:
        """``([(fragment, base)], [ref])``: the published globals ``slot``'s trainer lacks."""
        held = self.given.setdefault((slot.index, slot.starts), {})
        heads, refs = [], []
        for f, pub in enumerate(self.latest):
            if pub is not None and held.get(f) != pub.serial:
                heads.append((f, pub.base))
                refs.append(pub.bc.ref_for(slot))
                held[f] = pub.serial
        return heads, refs

    def take_bytes(self) -> int:
        out = sum(bc.take_bytes() for bc in self._out)
        self._out = [p.bc for p in self.latest if p is not None]
        return out

    def train(self, slot, round_no: int, indices, epochs: int, batch_size: int, *,
              reset: bool = False, **options) -> CallSpec:
        """``slot``'s call for round ``round_no``: the globals it lacks, then its steps."""
        if reset:
            self.given.pop((slot.index, slot.starts), None)
        heads, refs = self.messages(slot)
        return ("train_stream", ((self.run, round_no), heads, self.fragment_of(round_no),
                                 indices, epochs, batch_size, self.count, *refs),
                {"up": self.up, "reset": reset, **options})

    def flush(self, slot, key: int) -> CallSpec:
        """``slot``'s call at the end of a run of fragments: every fragment's unsent
        progress (the globals it lacks go with it)."""
        heads, refs = self.messages(slot)
        return ("flush_stream", ((self.run, key), heads, self.count, *refs), {"up": self.up})

    def flushed(self, w: list, outer: FragmentOuter, replies: list,
                buffers=None) -> tuple[list, int]:
        """``w`` with each fragment's flushed gradients averaged (trainers weighted alike)
        and stepped by its outer optimizer; and the bytes received."""
        size = 0
        for f in range(self.count):
            grads = []
            for payloads in replies:
                g, n = self.received(payloads[f])
                grads.append(g)
                size += n
            mean = weighted_mean(grads, [1.0] * len(grads))
            w = self.layout.put(w, f, outer.step(self.layout.take(w, f), f, mean, len(grads),
                                                 self.buffers(buffers, f)))
            self.dirty.add(f)
        return w, size

    def evaluation(self) -> StreamEval:
        """What a row's sharded evaluation sends: the globals published now."""
        return StreamEval(self)

    # -- outer gradients in --------------------------------------------------------------------
    def received(self, payload) -> tuple[list, int]:
        return self.wires[0].received(payload)

    def buffers(self, mask, f: int) -> list | None:
        """Which of fragment ``f``'s pieces are buffers, from the weights' mask."""
        return [bool(mask[i]) for i, _lo, _hi in self.layout.pieces[f]] if mask else None

    def step(self, w: list, round_no: int, outer: FragmentOuter, mean: list, k: int,
             buffers=None) -> list:
        """``w`` after round ``round_no``'s outer step on its fragment; ``buffers``: the
        weights' buffer mask (buffers take the mean at rate 1, no momentum)."""
        f = self.fragment_of(round_no)
        values = outer.step(self.layout.take(w, f), f, mean, k, self.buffers(buffers, f))
        self.bases[f] = round_no
        self.dirty.add(f)
        return self.layout.put(w, f, values)

    def model(self, w: list) -> list:
        """The weights the trainers hold for ``w`` (each fragment as its codec delivers it:
        the last published if unchanged since, else what publishing it would give)."""
        if self.plain:
            return w
        out = w
        for f in range(self.count):
            pub = self.latest[f]
            if f not in self.dirty and pub is not None:
                values = pub.bc.model
            else:
                values = self.wires[f].model(self.layout.take(w, f))
            out = self.layout.put(out, f, values)
        return out

    # -- membership and checkpoints ------------------------------------------------------------
    def keep(self, slot_index: int, stats: dict) -> None:
        state = stats.pop("stream_state", None)
        if state is not None:
            self.states[slot_index] = state

    def lose(self, slot_index: int) -> None:
        self.states.pop(slot_index, None)
        self.pending_states.pop(slot_index, None)
        for w in self.wires:
            w.lose(slot_index)

    def admit(self, slot) -> CallSpec | None:
        """After a resume: the call that gives ``slot``'s trainer its saved state."""
        saved = self.pending_states.pop(slot.index, None)
        if saved is None:
            return None
        return "load_stream_state", (self.run, self.count, *saved), {}

    def position(self) -> dict:
        return {"bases": list(self.bases), "dirty": sorted(self.dirty),
                "latest": [None if p is None else p.base for p in self.latest],
                "wires": [w.position() for w in self.wires],
                "states": {str(j): meta for j, (meta, _a) in self.states.items()}}

    def arrays(self) -> dict:
        out: dict = {}
        for f, pub in enumerate(self.latest):
            if pub is not None:
                out[f"sent{f}"] = list(pub.bc.model)
            for name, arrays in self.wires[f].arrays().items():
                out[f"wire{f}n{name}"] = arrays   # names: letters and digits
        for j, (_meta, arrays) in self.states.items():
            out[f"stream{j}"] = arrays
        return out

    def restore(self, position: dict, arrays: dict) -> None:
        """Continue from :meth:`position` and :meth:`arrays`: each trainer gets every
        fragment's last published global again, exactly, and its slot's saved state."""
        self.bases = [int(b) for b in position["bases"]]
        self.dirty = set(position["dirty"])
        for f, wire in enumerate(self.wires):
            prefix = f"wire{f}n"
            wire.restore(position["wires"][f], {k[len(prefix):]: v for k, v in arrays.items()
                                                if k.startswith(prefix)})
            base = position["latest"][f]
            if base is not None:
                self._serial += 1
                self.latest[f] = _Published(self._resend(wire, arrays[f"sent{f}"]), int(base),
                                            self._serial)
        for j, meta in position["states"].items():
            self.pending_states[int(j)] = (meta, arrays.get(f"stream{j}", []))

    def _resend(self, wire: Wire, values: list) -> Broadcast:
        """A broadcast of ``values`` exactly, as the version the wire holds now."""
        values = [np.array(v, copy=True) for v in values]
        if wire.mode == PLAIN:
            return Broadcast(wire, values, values, wire.version, wire.put(values),
                             sum(v.nbytes for v in values))
        msg = Weights(SET, wire.run, wire.version, None, codecs.get("none").encode(values),
                      wire.up)
        return Broadcast(wire, values, values, wire.version, wire.put(msg), msg.nbytes)


class StreamEval:
    """A row's evaluation over the trainers' globals (``evaluation.py`` sends it)."""

    def __init__(self, stream: Streaming):
        self.stream = stream

    def evaluate(self, slot, shard) -> CallSpec:
        s = self.stream
        heads, refs = s.messages(slot)
        return "evaluate_stream", ((s.run, 0), heads, shard, s.count, *refs), {}

    def take_bytes(self) -> int:
        return self.stream.take_bytes()
