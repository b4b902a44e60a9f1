"""Allreduce's streamed rounds, the trainer's end (``overlap=True``, ``fragments=F``).

The trainers keep the run's globals themselves, one per fragment (``fragments.LocalStream``,
as sync's trainers keep what the driver sends), with a copy of each fragment's outer
velocity. A round is :meth:`RingStreamTrainer.stream_hold` (apply the globals not applied
yet, train, keep the outer gradient of the round's fragment) on every trainer, then
:meth:`RingStreamTrainer.stream_reduce` (the ring over that gradient; each member takes
the outer step on its copy of the fragment's global and velocity).

With ``overlap`` the collective of round t runs on a thread of its own while the next
round's ``stream_hold`` trains: the hold joins it at its end and reports how it went, and
its result is *staged*, then committed (made the global the trainer holds) by the next
call that needs it: a collective of a later round, an evaluation, the hold after. A
collective that is redone (a member was lost) starts again from what was committed, so
a redone round is the same whichever attempt failed. The weights that a stopped run
returns (:meth:`stream_global`) are the committed ones, those of the last round reported.

``TrainerActor`` inherits this through ``AllreduceTrainer``. Numpy only.
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
from .fragments import LocalStream
from .outer import apply_outer

__all__ = ["RingStreamTrainer"]

# How a ring member's collective that did not complete ends: the status the driver reads.
_STATUSES = ((ring.CollectiveAborted, "aborted"),   # the driver called it off
             (ring.PeerLost, "peer_lost"),          # the right neighbour died
             (ring.CollectiveTimeout, "timeout"))   # nothing from the left in time


class RingStreamTrainer:
    """Streamed allreduce rounds on a trainer (module doc)."""

    # What TrainerActor and AllreduceTrainer provide.
    _ddlf_index: int
    _last_call_end: float | None
    _run: Callable[..., Any]
    _stats: Callable[..., dict]
    _local_stream: Callable[..., LocalStream]
    _ring_mailbox: Callable[[], ring.Mailbox]
    ring_send: Callable[..., Any]
    get_weights: Callable[[], list]
    set_weights: Callable[[list], None]
    buffer_mask: Callable[[], list]
    _stream: LocalStream | None
    _hop_feedback: ring.HopFeedback | None

    _svel: list | None = None     # per fragment: its outer velocity (None: zeros)
    _staged: dict | None = None   # a completed collective's result, not committed yet
    _bg: dict | None = None       # the collective running on its own thread

    def _held_stream(self) -> LocalStream:
        """The streamed run held here; ``RuntimeError`` when none is (a DDLF bug)."""
        if self._stream is None or self._svel is None:
            raise RuntimeError(f"trainer {self._ddlf_index} holds no streamed allreduce run: "
                               "stream_start was not called (a DDLF bug)")
        return self._stream

    def _velocities(self) -> list:
        """Each fragment's outer velocity held here (None: zeros)."""
        if self._svel is None:
            raise RuntimeError(f"trainer {self._ddlf_index} holds no streamed allreduce run: "
                               "stream_start was not called (a DDLF bug)")
        return self._svel

    def _ring_stream(self, run) -> LocalStream:
        st = self._stream
        if st is None or st.run != run or self._svel is None:
            raise RuntimeError(f"trainer {self._ddlf_index} holds no streamed allreduce run "
                               f"{run}: stream_start was not called (a DDLF bug)")
        return st

    def stream_start(self, run, fragments: int, weights, bases, velocities,
                     state=None) -> int:
        """Start run ``run`` from the globals ``weights`` (fragment f's holding the sends
        up to round ``bases[f]``) and the velocities (one list per fragment, [] for
        none); with ``state`` (``LocalStream.export``'s, from a checkpoint) this trainer's
        own weights and anchors come from it. Returns the digest of what it holds."""
        st = self._local_stream(run, fragments, reset=True)
        weights = [np.array(w, copy=True) for w in weights]
        x = weights if state is None else st.restore(state[0], state[1], weights)
        for f in range(fragments):
            values = st.layout.take(weights, f)
            st.globals[f] = (int(bases[f]), values)
            if state is None:
                st.anchors[f] = [np.array(v, copy=True) for v in values]
                st.applied[f] = int(bases[f])
        self.set_weights(x)
        self._svel = [[np.array(a, copy=True) for a in v] if v else None for v in velocities]
        self._staged = self._bg = None
        return self._stream_digest()

    def stream_hold(self, key, send: int, indices, epochs: int, batch_size: int,
                    fragments: int, join=None, return_state: bool = False,
                    learning_rate: float | None = None) -> dict:
        """Round ``key = (run, round)``: apply the globals not applied yet, train on
        ``indices`` and keep fragment ``send``'s outer gradient for the collective; the
        stats. ``join = (run, round)``: then wait for that round's collective (running
        since the previous call) and report it as ``stats["collective"]``."""
        start = time.perf_counter()
        run, round_no = key
        st = self._ring_stream(run)
        self._commit_staged()
        self.set_weights(st.correct(self.get_weights()))
        _old, new, loss, samples = self._run(None, indices, epochs, batch_size, learning_rate)
        st.send(new, int(send), int(round_no))
        stats = self._stats(start, samples, loss, return_state)
        if join is not None:
            stats["collective"] = self._join(tuple(int(t) for t in join))
        return stats

    def _ring_member(self, tag, rank: int, size: int, right, timeout_s: float, vectors,
                     runtime, box, codec, fb, on_thread: bool = False) -> tuple:
        """This trainer's part of collective ``tag`` (``ring.run_member``), its chunks sent
        to the handle ``right``, for ``allreduce_held`` and the streamed rounds alike:
        ``(summed, reply)``, ``reply`` holding ``index`` and ``sent_bytes``. Where the
        collective did not complete, ``summed`` is None and ``reply`` says why, in
        ``status`` and ``detail``: ``aborted``, ``peer_lost``, ``timeout`` (``_STATUSES``),
        or ``nonfinite`` (the codec met NaN or inf in this trainer's delta). Any other
        exception propagates, unless ``on_thread``: there nothing else would see it, so it
        is the status ``error``."""
        sent = [0]

        def send(phase, step, chunk):
            sent[0] += ring.chunk_nbytes(chunk)
            return self.ring_send(right, tag, phase, step, chunk)

        reply: dict = {"index": self._ddlf_index}
        status = detail = None
        try:
            summed = ring.run_member(vectors, rank, size, tag, box, send, runtime, timeout_s,
                                     codec=codec, feedback=fb)
        except tuple(kind for kind, _ in _STATUSES) as e:
            status = next(s for kind, s in _STATUSES if isinstance(e, kind))
            detail = str(e)
        except ValueError as e:
            if codec is None and not on_thread:
                raise
            status, detail = ("nonfinite" if codec is not None else "error"), str(e)
        except Exception as e:
            if not on_thread:
                raise
            status, detail = "error", f"{type(e).__name__}: {e}"
        reply["sent_bytes"] = sent[0]
        if status is not None:
            return None, {**reply, "status": status, "detail": detail}
        return summed, reply

    def stream_reduce(self, tag, rank: int, size: int, right, fraction: float,
                      timeout_s: float, fragment: int, fragments: int, outer=None,
                      codec=None, feedback: bool = False,
                      want_hops: bool = False, want_state: bool = False,
                      background: bool = False, zero: bool = False) -> dict:
        """The collective of round ``tag[1]`` (``tag = (run, round, attempt)``) over
        fragment ``fragment``'s outer gradient held here (zeros with ``zero``: a member
        that did not train it), or with ``fragment = -1`` over every fragment's progress
        not sent yet (the end of a run of fragments; ``outer`` then one per fragment).
        As ``allreduce_held`` otherwise (``outer``, ``codec``, ``feedback``, the statuses). With
        ``background`` it runs on a thread and returns ``{"status": "started"}`` at once
        (the next ``stream_hold`` reports it); else it returns its reply, with the digest
        of what this trainer holds once it committed the result, and with ``want_state``
        the ``stream_state`` a checkpoint keeps."""
        start = time.perf_counter()
        tag = tuple(int(t) for t in tag)
        run, round_no = tag[0], tag[1]
        st = self._ring_stream(run)
        if self._bg is not None:          # a collective of an earlier round: done with it
            self._join(self._bg["tag"][:2])
        if self._staged is not None:
            if self._staged["round"] == round_no:
                self._staged = None       # a redo: start again from what was committed
            else:
                self._commit_staged()
        frags = list(range(fragments)) if fragment < 0 else [int(fragment)]
        outers = list(outer) if fragment < 0 else [outer]
        grads = self._held_grads(st, frags, round_no, fragment < 0, zero)
        flat = [a for g in grads for a in g]
        vectors, spec = ring.scaled_vectors(ring_layers(flat), fraction)   # counters: f64
        mask = self.buffer_mask()
        masks = [[bool(mask) and mask[i] for i, _lo, _hi in st.layout.pieces[f]] for f in frags]
        box = self._ring_mailbox()
        box.begin(tag)
        fb = None
        if feedback:
            fb = ring.HopFeedback()
            if self._hop_feedback is not None:
                fb.load(self._hop_feedback.state())
        job = {"tag": tag, "size": size, "timeout": timeout_s, "result": {}}
        bases = {f: st.global_of(f)[1] for f in frags}
        vels = {f: self._velocities()[f] for f in frags}
        runtime = backends.here()

        def work():
            job["result"] = self._collective(
                tag, rank, size, right, timeout_s, vectors, spec, flat, frags, outers,
                masks, bases, vels, codec, fb, want_hops, runtime, box)

        if background:
            job["thread"] = threading.Thread(target=work, daemon=True,
                                             name=f"ddlf-ring-{self._ddlf_index}")
            self._bg = job
            job["thread"].start()
            return {"index": self._ddlf_index, "status": "started"}
        work()
        reply, staged = job["result"]["reply"], job["result"].get("staged")
        if reply["status"] == "error":
            raise RuntimeError(reply["detail"])
        if staged is not None:
            self._staged = staged
            self._commit_staged()
            reply["digest"] = self._stream_digest()
            if want_state:
                reply["stream_state"] = st.export(self.get_weights())
        if self._last_call_end is not None:   # the collective is work, not idle time
            self._last_call_end += time.perf_counter() - start
        return reply

    def _held_grads(self, st: LocalStream, frags: list, round_no: int, flush: bool,
                    zero: bool) -> list:
        if flush:   # send every fragment's progress now (once: a redo takes the same)
            if any(st.pending_of(f, round_no) is None for f in frags):
                weights = st.correct(self.get_weights())
                self.set_weights(weights)
                for f in frags:
                    if st.pending_of(f, round_no) is None:
                        st.send(weights, f, round_no)
        out = []
        for f in frags:
            g = st.pending_of(f, round_no)
            if g is None:
                if not zero:
                    raise RuntimeError(f"trainer {self._ddlf_index} holds no outer gradient "
                                       f"of fragment {f} for round {round_no} (a DDLF bug)")
                g = [np.zeros_like(v) for v in st.globals[f][1]]
            out.append(g)
        return out

    def _collective(self, tag, rank, size, right, timeout_s, vectors, spec, flat, frags,
                    outers, masks, bases, vels, codec, fb, want_hops, runtime, box) -> dict:
        """The ring and the outer steps, on whichever thread: ``{"reply", "staged"}``."""
        t0 = time.perf_counter()
        summed, reply = self._ring_member(tag, rank, size, right, timeout_s, vectors, runtime,
                                          box, codec, fb, on_thread=True)
        if summed is None:
            return {"reply": reply}
        mean = like_layers(ring.unflatten(summed, spec), flat)
        staged: dict = {"round": tag[1], "fragments": {}, "hops": fb}
        i = 0
        for f, o, mask in zip(frags, outers, masks):
            n = len(mask)
            # Buffers' pieces take the mean at rate 1, no momentum (outer.py).
            values, vel = apply_outer(bases[f], mean[i:i + n], vels[f], o, mask)
            i += n
            staged["fragments"][f] = (values, vel)
        reply.update(status="done", collective_s=time.perf_counter() - t0)
        if want_hops and fb is not None:
            reply["hops"] = fb.state()
        return {"reply": reply, "staged": staged}

    def _join(self, key) -> dict:
        """Wait for the collective of ``key = (run, round)`` running on its thread (the ring
        bounds each of its waits); stage its result; its reply, with the digest."""
        job = self._bg
        if job is None or job["tag"][:2] != key:
            return {"index": self._ddlf_index, "status": "missing",
                    "detail": f"no collective of (run, round) {key} runs here"}
        job["thread"].join(job["timeout"] * 2 * job["size"] + 60)
        if job["thread"].is_alive():
            return {"index": self._ddlf_index, "status": "timeout", "sent_bytes": 0,
                    "detail": "the collective's thread did not end"}
        self._bg = None
        reply = job["result"]["reply"]
        if job["result"].get("staged") is not None:
            self._staged = job["result"]["staged"]
            reply["digest"] = self._stream_digest()
        return reply

    def _commit_staged(self) -> None:
        """Make a completed collective's result the globals (and velocities) held here."""
        staged, self._staged = self._staged, None
        if staged is None:
            return
        st, velocities = self._held_stream(), self._velocities()
        for f, (values, vel) in staged["fragments"].items():
            st.globals[f] = (staged["round"], values)
            velocities[f] = vel
        if staged["hops"] is not None:
            self._hop_feedback = staged["hops"]

    def _stream_digest(self) -> int:
        """A CRC of the globals and velocities held here, the staged result counted in:
        every member of a run holds the same."""
        st = self._held_stream()
        staged = self._staged["fragments"] if self._staged is not None else {}
        arrays: list = []
        for f in range(st.layout.count):
            arrays += staged[f][0] if f in staged else st.global_of(f)[1]
        for f, vel in enumerate(self._svel or []):
            vel = staged[f][1] if f in staged else vel
            arrays += list(vel or [])
        return ring.weights_digest(arrays)

    def stream_global(self, velocity: bool = False) -> tuple[list, list]:
        """The committed globals as weights and, with ``velocity``, the velocities (a
        list per fragment, [] for none): what the driver fetches."""
        st = self._held_stream()
        weights = self.get_weights()
        for f in range(st.layout.count):
            weights = st.layout.put(weights, f, st.global_of(f)[1])
        return weights, [list(v or []) for v in self._velocities()] if velocity else []

    def stream_snapshot(self) -> dict:
        """What a trainer joining the run copies from this one (``stream_adopt``)."""
        self._commit_staged()
        weights, velocities = self.stream_global(True)
        return {"weights": weights, "velocities": velocities,
                "bases": [self._held_stream().global_of(f)[0]
                          for f in range(self._held_stream().layout.count)]}

    def stream_adopt(self, source, run, fragments: int) -> dict:
        """Join streamed run ``run`` with the globals and velocities of the live trainer
        ``source``: ``{"status": "done", "digest", "bytes"}`` or ``"source_lost"``."""
        try:
            snap = backends.here().get(source.stream_snapshot.remote())
        except ActorDiedError as e:
            return {"status": "source_lost", "detail": str(e).strip().splitlines()[0]}
        digest = self.stream_start(run, fragments, snap["weights"], snap["bases"],
                                   snap["velocities"])
        return {"status": "done", "digest": digest, "bytes": nbytes(snap["weights"])}
