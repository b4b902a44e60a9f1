"""Streamed averaging, the trainer's end: parameter fragments, and what a trainer keeps
between the rounds of a run with ``overlap=True`` or ``fragments=F`` (sync, allreduce).

**Fragments.** The parameters, flattened and laid end to end (in the weights' order), are
cut into F slices of equal length (:class:`Fragments`); a slice may cover parts of two
tensors, so fragments are equal whatever the layers' sizes (a CNN's dense kernel holds
most of its values). Round s of a run syncs fragment ``(s − 1) mod F`` only: a link then
carries 1/F of the model per round, and each fragment is averaged once every F rounds.

**Corrections** (:class:`LocalStream`). A trainer trains its own weights ``x`` and, per
fragment f, keeps an *anchor* ``a_f``: the point from which its progress on f has not yet
been sent. At the end of a round it sends fragment f's outer gradient ``g = a_f − x_f``,
keeps ``g`` as *pending* (sent, not yet in a global it has seen) and sets ``a_f = x_f``.
When the global ``G_f`` that the driver (or the ring) computed from the sends of rounds up
to ``b`` arrives, the trainer applies it at the start of its next train call as a
correction, keeping every bit of progress the global does not hold yet:

    pending_f ← the sends of rounds > b
    a_f'      = G_f − Σ pending_f
    x_f       ← a_f' + (x_f − a_f)          (progress since the last send, kept)
    a_f       ← a_f'

With ``overlap=False, fragments=1`` this is plain sync (the trainer starts each round from
the global). With ``overlap=True`` the global of round t arrives one round late, so a
trainer starts round t + 1 from its own weights and, at the start of round t + 2, replaces
its own delta of round t by the outer step of round t (``x = G^t − g^{t+1}``).

A global already applied (same fragment, same ``b``) is not applied again: resending one
(after a resume, to a trainer that lost track) changes nothing.

:class:`StreamingTrainer` is the trainer's remote side for sync (``train_stream``,
``evaluate_stream``, ``load_stream_state``); ``TrainerActor`` inherits it through
``AllreduceTrainer``, which builds allreduce's streamed rounds on :class:`LocalStream` too.
Numpy only: trainers import this module in their forkserver.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .. import codecs
from ..weight_messages import TrainerWire, Weights

__all__ = ["Fragments", "LocalStream", "StreamingTrainer"]


class Fragments:
    """F equal slices of a list of tensors laid end to end (flattened, in order).

    ``pieces[f]`` lists ``(tensor, lo, hi)``: fragment f holds ``tensor.ravel()[lo:hi]``
    of each. A fragment's *values* are those slices as 1-D arrays, in that order (what a
    round sends and a codec encodes). ValueError when there are fewer values than F.
    """

    def __init__(self, like: list, count: int):
        sizes = [int(np.asarray(a).size) for a in like]
        total = sum(sizes)
        if count < 1 or total < count:
            raise ValueError(f"cannot cut {total} parameter values into {count} fragments")
        self.count = int(count)
        self.layout = [(np.shape(a), np.asarray(a).dtype) for a in like]
        starts = np.cumsum([0] + sizes)
        self.pieces: list[list[tuple[int, int, int]]] = []
        for f in range(count):
            lo, hi = total * f // count, total * (f + 1) // count
            self.pieces.append([(i, max(lo, s) - s, min(hi, s + n) - s)
                                for i, (s, n) in enumerate(zip(starts[:-1], sizes))
                                if max(lo, s) < min(hi, s + n)])

    def take(self, weights: list, f: int) -> list:
        """Fragment ``f`` of ``weights``: copies of its slices (1-D)."""
        return [np.array(np.asarray(weights[i]).reshape(-1)[lo:hi]) for i, lo, hi in
                self.pieces[f]]

    def put(self, weights: list, f: int, values: list) -> list:
        """``weights`` with fragment ``f`` set to ``values``: a new list whose touched
        tensors are new arrays (the arrays of ``weights`` are never written)."""
        out = list(weights)
        fresh: set[int] = set()
        for (i, lo, hi), v in zip(self.pieces[f], values):
            if i not in fresh:
                out[i] = np.array(weights[i], copy=True)
                fresh.add(i)
            out[i].reshape(-1)[lo:hi] = v
        return out

    def nbytes(self, f: int) -> int:
        return int(sum((hi - lo) * self.layout[i][1].itemsize for i, lo, hi in self.pieces[f]))


class LocalStream:
    """One trainer's anchors, pending sends and last globals for one run (module doc)."""

    def __init__(self, run: Any, layout: Fragments):
        self.run = run
        self.layout = layout
        n = layout.count
        self.anchors: list[list | None] = [None] * n
        self.pending: list[list[tuple[int, list]]] = [[] for _ in range(n)]
        self.applied: list[int | None] = [None] * n   # the base of the global applied last
        self.globals: list[tuple[int, list] | None] = [None] * n   # (base, values) received
        self.encoders: dict[int, Any] = {}            # fragment -> its up encoder
        self.wires: dict[str, TrainerWire] = {}      # a compressed stream's run -> its end

    # -- globals in -----------------------------------------------------------------------------
    def receive(self, f: int, base: int, msg) -> None:
        """The global of fragment ``f`` that holds the sends of rounds up to ``base``:
        a list of values, or a ``wire.Weights`` message (decoded here, once)."""
        if isinstance(msg, Weights):
            end = self.wires.setdefault(msg.run, TrainerWire())
            values = end.receive(msg)
        else:
            values = [np.asarray(v) for v in msg]
        self.globals[f] = (int(base), values)

    def correct(self, weights: list) -> list:
        """Apply every global received and not yet applied; the new weights."""
        for f, got in enumerate(self.globals):
            if got is None or got[0] == self.applied[f]:
                continue
            base, values = got
            pending = [(k, g) for k, g in self.pending[f] if k > base]
            anchor = [np.array(v, copy=True) for v in values]
            for _k, g in pending:
                anchor = [a - d for a, d in zip(anchor, g)]
            old = self.anchors[f]
            if old is None:       # nothing of this run yet: start from the global
                new = anchor
            else:
                cur = self.layout.take(weights, f)
                new = [a + (c - o) for a, c, o in zip(anchor, cur, old)]
            weights = self.layout.put(weights, f, new)
            self.pending[f] = pending
            self.anchors[f] = anchor
            self.applied[f] = base
        return weights

    def anchor(self, f: int) -> list:
        """Fragment ``f``'s anchor; ``RuntimeError`` before the trainer has one (it gets one
        with the fragment's first global: a DDLF bug to ask before)."""
        a = self.anchors[f]
        if a is None:
            raise RuntimeError(f"fragment {f} has no anchor on this trainer yet (a bug in "
                               "DDLF, please report it)")
        return a

    def global_of(self, f: int) -> tuple[int, list]:
        """``(base, values)`` of fragment ``f``'s global held here; ``RuntimeError`` when
        none is (a DDLF bug)."""
        g = self.globals[f]
        if g is None:
            raise RuntimeError(f"this trainer holds no global of fragment {f} (a bug in "
                               "DDLF, please report it)")
        return g

    def unset(self) -> list[int]:
        """Fragments this trainer has no anchor for (it holds no global of them yet)."""
        return [f for f, a in enumerate(self.anchors) if a is None]

    # -- sends out ------------------------------------------------------------------------------
    def send(self, weights: list, f: int, key: int) -> list:
        """Fragment ``f``'s outer gradient for round ``key`` (anchor − now), kept pending."""
        cur = self.layout.take(weights, f)
        g = [a - c for a, c in zip(self.anchor(f), cur)]
        self.pending[f].append((int(key), g))
        self.anchors[f] = cur
        return g

    def pending_of(self, f: int, key: int) -> list | None:
        """The outer gradient sent for round ``key`` of fragment ``f``, if still pending."""
        return next((g for k, g in self.pending[f] if k == key), None)

    def encode(self, f: int, g: list, up: codecs.Codec) -> codecs.Encoded:
        """``g`` through fragment ``f``'s own encoder (its error-feedback residual)."""
        enc = self.encoders.get(f)
        if enc is None or enc.codec != up:
            enc = self.encoders[f] = up.encoder()
        return enc.encode(g)

    # -- checkpoints ----------------------------------------------------------------------------
    def export(self, weights: list) -> tuple[dict, list]:
        """``(meta, arrays)``: what a resumed run needs to continue this trainer bit for bit
        (anchors, weights where they differ from them, pending sends, encoder residuals)."""
        meta: dict = {"fragments": self.layout.count, "applied": list(self.applied),
                      "x": [], "pending": [], "residual": []}
        arrays: list = []
        for f in range(self.layout.count):
            anchor = self.anchor(f)
            arrays += anchor
            cur = self.layout.take(weights, f)
            same = all(np.array_equal(a, c) for a, c in zip(anchor, cur))
            meta["x"].append(not same)
            if not same:
                arrays += cur
            meta["pending"].append([k for k, _g in self.pending[f]])
            for _k, g in self.pending[f]:
                arrays += g
            enc = self.encoders.get(f)
            res = None if enc is None else enc.residual
            meta["residual"].append(None if res is None else [r is not None for r in res])
            if enc is not None:
                meta.setdefault("codec", {})[str(f)] = enc.codec.spec
            if res is not None:
                arrays += [np.array(r) for r in res if r is not None]
        return meta, arrays

    def restore(self, meta: dict, arrays: list, weights: list) -> list:
        """Continue from :meth:`export`'s ``(meta, arrays)``; the trainer's weights."""
        it = iter(arrays)

        def take(n: int) -> list:
            return [np.array(next(it), copy=True) for _ in range(n)]

        for f in range(self.layout.count):
            n = len(self.layout.pieces[f])
            anchor = self.anchors[f] = take(n)
            weights = self.layout.put(weights, f, take(n) if meta["x"][f] else anchor)
            self.pending[f] = [(int(k), take(n)) for k in meta["pending"][f]]
            kept = meta["residual"][f]
            spec = meta.get("codec", {}).get(str(f))
            if spec is not None:
                enc = self.encoders[f] = codecs.get(spec).encoder()
                if kept is not None:
                    res = [next(it) if k else None for k in kept]
                    enc.restore(res, self.layout.take(weights, f))
        self.applied = [None if b is None else int(b) for b in meta["applied"]]
        return weights


class StreamingTrainer:
    """The trainer's remote side of sync's streamed rounds (``TrainerActor`` inherits it
    through ``AllreduceTrainer``)."""

    # What TrainerActor provides.
    _ddlf_index: int
    _run: Callable[..., Any]
    _stats: Callable[..., dict]
    evaluate: Callable[..., Any]
    get_weights: Callable[[], list]
    set_weights: Callable[[list], None]

    _stream: LocalStream | None = None

    def _local_stream(self, run, fragments: int, reset: bool = False) -> LocalStream:
        st = self._stream
        if st is None or st.run != run or st.layout.count != fragments or reset:
            st = self._stream = LocalStream(run, Fragments(self.get_weights(), fragments))
        return st

    def train_stream(self, key, heads, send: int, indices, epochs: int, batch_size: int,
                     fragments: int, *globals_, up: codecs.Codec | None = None,
                     reset: bool = False, return_state: bool = False,
                     learning_rate: float | None = None):
        """One streamed round ``key = (run, round)``: take in the globals ``globals_`` (of
        fragments and base rounds ``heads = [(fragment, base)]``; arguments of their own,
        so that the runtime resolves their refs), apply every global not applied yet (see
        ``LocalStream.correct``), train on ``indices`` and return ``(outer gradient of
        fragment send, stats)``, the gradient encoded with ``up`` through this trainer's
        encoder for that fragment when given. ``reset`` drops what the trainer kept of the
        run (the driver sends every fragment with it). With ``return_state`` the stats
        hold ``stream_state`` (``LocalStream.export``) and the optimizer's state.
        RuntimeError when the trainer would train a fragment it holds no global of."""
        start = time.perf_counter()
        run, round_no = key
        st = self._local_stream(run, fragments, reset)
        for (f, base), msg in zip(heads, globals_):
            st.receive(int(f), int(base), msg)
        decode_s = time.perf_counter() - start
        self.set_weights(st.correct(self.get_weights()))
        missing = st.unset()
        if missing:
            raise RuntimeError(f"trainer {self._ddlf_index} was asked to train round {round_no} "
                               f"holding no weights of fragment(s) {missing}: a DDLF bug, please "
                               "report it")
        _old, new, loss, samples = self._run(None, indices, epochs, batch_size, learning_rate)
        t0 = time.perf_counter()
        g = st.send(new, int(send), int(round_no))
        payload = g if up is None else st.encode(int(send), g, up)
        stats = self._stats(start, samples, loss, return_state)
        stats["codec_s"] = decode_s + time.perf_counter() - t0
        if return_state:
            stats["stream_state"] = st.export(new)
        return payload, stats

    def flush_stream(self, key, heads, fragments: int, *globals_,
                     up: codecs.Codec | None = None):
        """The end of a run of fragments: apply the globals given (as :meth:`train_stream`
        takes them), then send every fragment's progress not sent yet, without training.
        Returns ``(one outer gradient per fragment, stats)``, each encoded with ``up``
        through its fragment's encoder when given."""
        start = time.perf_counter()
        st = self._local_stream(key[0], fragments)
        for (f, base), msg in zip(heads, globals_):
            st.receive(int(f), int(base), msg)
        weights = st.correct(self.get_weights())
        self.set_weights(weights)
        out = []
        for f in range(fragments):
            g = st.send(weights, f, int(key[1]))
            out.append(g if up is None else st.encode(f, g, up))
        return out, self._stats(start, 0, 0.0, False)

    def evaluate_stream(self, key, heads, shard, fragments: int, *globals_):
        """``(loss, accuracy)`` on test ``shard`` of the run's global weights as this
        trainer holds them once ``globals_`` are in (as :meth:`train_stream` takes them):
        every fragment's last global."""
        st = self._local_stream(key[0], fragments)
        self._commit_staged()
        for (f, base), msg in zip(heads, globals_):
            st.receive(int(f), int(base), msg)
        weights = self.get_weights()
        for f in range(st.layout.count):   # RuntimeError for a fragment with no global
            weights = st.layout.put(weights, f, st.global_of(f)[1])
        return self.evaluate(weights, shard)

    def _commit_staged(self) -> None:
        """Make a global this trainer computed itself its own (allreduce's, see
        ``ring_stream.py``); nothing here."""

    def load_stream_state(self, run, fragments: int, meta: dict, arrays: list) -> None:
        """Continue run ``run`` from a checkpoint's state of this trainer's slot."""
        st = self._local_stream(run, fragments, reset=True)
        self.set_weights(st.restore(meta, arrays, self.get_weights()))
