"""Ring allreduce between trainers: the chunking, the steps and the mailbox.

Each of ``n`` members of a ring holds a vector (its delta, already scaled by its share of
the samples) and a handle on its right-hand neighbour. The vector is cut into ``n``
chunks, and:

- **reduce-scatter**, steps ``s = 0 … n−2``: member ``r`` sends chunk ``(r − s) mod n`` to
  its right and adds the chunk ``(r − s − 1) mod n`` that arrives from its left to its
  own. After ``n − 1`` steps member ``r`` holds the complete sum of chunk ``(r + 1) mod n``.
- **all-gather**, steps ``s = 0 … n−2``: member ``r`` sends chunk ``(r + 1 − s) mod n``
  (complete) and replaces chunk ``(r − s) mod n`` with the complete one that arrives.

Every member sends ``2 (n − 1) / n`` of the vector and receives as much, whatever ``n``,
and every link of the ring carries the same load (Patarasuk and Yuan's bandwidth-optimal
allreduce, as in Horovod and NCCL). Each chunk's sum is computed once, by one member,
and forwarded verbatim, so every member ends with bit-identical weights.

Chunks travel as actor calls: the sender calls ``right.deliver_chunk.remote(...)``, an
``async def`` method that runs on the receiver's event loop even while its execution
thread is inside the collective, and puts the chunk in the receiver's :class:`Mailbox`.
The collective itself (:func:`ring_allreduce`) is written against two callables, ``send``
and ``recv``, so it runs in-process in the tests with no actors.

**Compression per hop** (``codec=``, one of ``apps/codecs``; issue 23 section 3). In
reduce-scatter each hop sends its partial-sum chunk encoded; the receiver decodes it to
the vector's dtype (float32) and adds its own values there, so the running sum is never
kept quantized: each hop adds one rounding of the chunk it sends, not a rounding of a
rounding. The member that completes a chunk encodes it once and keeps the *decoded*
chunk itself; in all-gather that one payload is forwarded verbatim, so every member
decodes the same bytes and ends with bit-identical vectors, as without a codec. A chunk
is thus encoded n times on its way (n − 1 partial sums and the complete sum), each time
with the codec's own error bound. The codec's own ``:ef`` flag is not read: error
feedback across collectives is a :class:`HopFeedback` the member keeps and passes in
(``feedback=``), which carries each hop's error to the same hop next time. Codecs that
keep only a fraction of each chunk (``topk``) are refused: forwarded verbatim in
all-gather, what they drop would be lost for every member.

Failures: a member waiting for a chunk gives up when the driver aborts the collective (it
noticed a member die), when one of its own sends failed (its right neighbour is gone), or
after ``timeout_s`` without the chunk. It never waits forever, and it never changes its
weights unless the whole collective completed.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any, Callable, Sequence

import numpy as np

from . import codecs

__all__ = ["Mailbox", "CollectiveAborted", "CollectiveTimeout", "PeerLost",
           "scaled_vectors", "unflatten", "ring_allreduce", "weights_digest", "ring_send_bytes",
           "ring_codec", "chunk_nbytes", "HopFeedback", "run_member"]


class CollectiveAborted(Exception):
    """The driver called the collective off (a member was lost): start again when asked."""


class CollectiveTimeout(Exception):
    """No chunk arrived from the left neighbour within the time allowed."""


class PeerLost(Exception):
    """A chunk could not be delivered: the right neighbour's process is gone."""


# -- the vectors: layers of a delta <-> one flat vector per dtype -----------------------------
def scaled_vectors(layers: Sequence, fraction: float) -> tuple[list, list]:
    """``fraction · layers``, flattened into one vector per dtype; and the spec to undo it.

    Each layer is scaled in its own dtype (``d * d.dtype.type(fraction)``), exactly as
    ``averaging.weighted_mean`` scales a delta, so the products are the same bits. Layers
    of different dtypes go into separate vectors: nothing is ever cast.
    """
    groups: dict = {}      # dtype -> [flat layers]
    spec = []              # per layer: (dtype, offset in its vector, shape)
    for layer in layers:
        a = np.asarray(layer)
        group = groups.setdefault(a.dtype.str, [])
        spec.append((a.dtype.str, sum(len(x) for x in group), a.shape))
        group.append(a.ravel())
    keys = list(groups)
    vectors = [np.concatenate(groups[k]) for k in keys]
    for v in vectors:   # scaled in place: the same products, one pass, no second copy
        np.multiply(v, v.dtype.type(fraction), out=v)
    return vectors, [(keys.index(k), offset, shape) for k, offset, shape in spec]


def unflatten(vectors: Sequence[np.ndarray], spec: list) -> list:
    """The layers :func:`scaled_vectors` flattened, cut back out of ``vectors``."""
    out = []
    for g, offset, shape in spec:
        n = int(np.prod(shape, dtype=np.int64))
        out.append(np.asarray(vectors[g][offset:offset + n]).reshape(shape))
    return out


# -- the collective ----------------------------------------------------------------------------
def ring_codec(codec) -> codecs.Codec | None:
    """The codec a ring runs with: None (raw chunks, the default) or the
    :class:`~.codecs.Codec` a spec names (``"int4"``, ``"fp16"``, a Codec, ...).

    Raises ValueError for an unknown spec (naming the valid forms) and for a codec that
    sends only part of each chunk (``topk``): see the module's docstring.
    """
    if codec is None:
        return None
    codec = codecs.get(codec)
    if codec.needs_summing:
        raise ValueError(
            f"codec {codec.spec!r} keeps only part of each chunk: in a ring's all-gather the "
            "complete chunks are forwarded verbatim, so what it drops would be lost for every "
            "member. Use a dense codec (fp16, int8, int4) or a lossless one (none, lz4, zstd)")
    return codec


class HopFeedback:
    """Error feedback for one ring member's encodes, kept across its collectives.

    A member encodes the same hops every collective: at reduce-scatter step ``s`` the
    partial sum of chunk ``(rank − s) mod n``, and at the end the chunk it completes.
    With feedback, each hop's input gets what that hop's codec dropped last time added to
    it, and keeps what it drops now (Seide et al.'s 1-bit SGD and Karimireddy et al.'s
    error feedback, applied per hop): over any number of collectives, the sum of what the
    ring delivered equals the sum of its inputs minus the residuals still held, bounded
    by one encoding's error per hop, where without feedback a quantizer's bias adds up
    every round. Every member decodes the same payloads, so members stay bit-identical.

    The residuals are committed only when a collective completes on this member (one
    that raises leaves them as they were, so a redone collective starts from the same
    state). A ring of another size, another rank or other vectors carries other chunks
    on each hop: the residuals are dropped then (what they held is lost, one encoding's
    error). :meth:`state` and :meth:`load` save and restore them (checkpoints).
    """

    def __init__(self):
        self._key: tuple | None = None
        self._residuals: dict = {}

    def reset(self) -> None:
        self._key, self._residuals = None, {}

    def state(self) -> dict:
        """``{"key": ..., "residuals": {hop: [array or None per vector]}}``: copies."""
        return {"key": self._key, "residuals": {
            h: [None if r is None else r.copy() for r in rs]
            for h, rs in self._residuals.items()}}

    def load(self, state: dict) -> None:
        self._key = state["key"]
        self._residuals = {h: [None if r is None else np.array(r) for r in rs]
                           for h, rs in state["residuals"].items()}

    def _bind(self, rank: int, size: int, vectors: list) -> None:
        key = (rank, size, tuple((len(v), v.dtype.str) for v in vectors))
        if key != self._key:
            self._key, self._residuals = key, {}

    def _corrected(self, hop: str, chunk: list) -> list:
        res = self._residuals.get(hop)
        if res is None:
            return chunk
        return [c if r is None else c + r for c, r in zip(chunk, res)]


def ring_allreduce(vectors: Sequence[np.ndarray], rank: int, size: int,
                   send: Callable[[str, int, Any], None],
                   recv: Callable[[str, int], Any], codec=None,
                   feedback: HopFeedback | None = None) -> list:
    """Sum ``vectors`` over the ``size`` members of a ring; this member is ``rank``.

    ``send(phase, step, chunk)`` delivers ``chunk`` to the right neighbour; ``recv(phase,
    step)`` returns what the left neighbour sent for that step (``phase`` is ``"rs"`` or
    ``"ag"``). A chunk is a list with one array per vector; with ``codec`` (a spec or
    :class:`~.codecs.Codec`, see :func:`ring_codec`; every member must use the same) it
    is that list's :class:`~.codecs.Encoded` payload. Returns the summed vectors, the same
    bits on every member. Raises whatever ``send`` or ``recv`` raise, ValueError for a
    codec the ring refuses, and a codec's ValueError for NaN or inf in a lossy chunk.
    Arrays and payloads passed to ``send`` are never written afterwards, so a transport
    may hold on to them without copying.

    ``feedback`` (a :class:`HopFeedback` this member keeps across collectives; needs a
    lossy ``codec``) adds each hop's last error to its next input: see there.
    """
    codec = ring_codec(codec)
    vectors = [np.asarray(v) for v in vectors]
    if feedback is not None and (codec is None or codec.lossless):
        raise ValueError("feedback= carries a lossy codec's error to the next collective: "
                         f"it needs a lossy codec (fp16, int8, int4), got {codec!r}")
    if size == 1:
        return [v.copy() for v in vectors]
    parts = [np.array_split(v, size) for v in vectors]
    chunks = [[p[c] for p in parts] for c in range(size)]
    if codec is None:
        for s in range(size - 1):
            send("rs", s, chunks[(rank - s) % size])
            c = (rank - s - 1) % size
            got = recv("rs", s)
            # The partial sum first: chunk c adds up members c, c+1, ... in ring order.
            chunks[c] = [g + m for g, m in zip(got, chunks[c])]
        for s in range(size - 1):
            send("ag", s, chunks[(rank + 1 - s) % size])
            chunks[(rank - s) % size] = [np.asarray(g) for g in recv("ag", s)]
    else:
        staged: dict = {}   # this collective's new residuals, committed at the end

        def encode(hop: str, chunk: list):
            if feedback is None:
                return codec.encode(chunk)
            payload, staged[hop] = codec.encode_with_error(feedback._corrected(hop, chunk))
            return payload

        if feedback is not None:
            feedback._bind(rank, size, vectors)
        for s in range(size - 1):
            send("rs", s, encode(f"rs{s}", chunks[(rank - s) % size]))
            c = (rank - s - 1) % size
            got = codec.decode(recv("rs", s))
            # Decoded to float32 and added there, in the same order as without a codec.
            chunks[c] = [g + m for g, m in zip(got, chunks[c])]
        done = (rank + 1) % size
        payload = encode("done", chunks[done])
        # Keep what the others will decode, not the exact sum: bit-identical members.
        chunks[done] = codec.decode(payload)
        for s in range(size - 1):
            send("ag", s, payload)
            payload = recv("ag", s)      # forwarded verbatim at the next step
            chunks[(rank - s) % size] = codec.decode(payload)
        if feedback is not None:
            feedback._residuals.update(staged)
    return [np.concatenate([chunks[c][g] for c in range(size)]) for g in range(len(vectors))]


def ring_send_bytes(vectors: Sequence[np.ndarray], rank: int, size: int,
                    codec=None) -> int | None:
    """Bytes member ``rank`` sends in :func:`ring_allreduce` (about ``2 (n−1)/n`` of the
    vectors, or of their encoding with ``codec``): the chunks' ``nbytes``, as
    :func:`chunk_nbytes` counts them. None when the codec's sizes depend on the values
    (lz4, zstd): count what was sent instead."""
    codec = ring_codec(codec)
    if size == 1:
        return 0
    total = 0
    for v in vectors:
        v = np.asarray(v)
        sizes = [len(p) for p in np.array_split(np.empty(len(v), np.int8), size)]
        sent = [sizes[(rank - s) % size] for s in range(size - 1)]         # reduce-scatter
        sent += [sizes[(rank + 1 - s) % size] for s in range(size - 1)]    # all-gather
        for n in sent:
            got = n * v.dtype.itemsize if codec is None else codec.predicted_nbytes(n, v.dtype)
            if got is None:
                return None
            total += got
    return total


def chunk_nbytes(chunk) -> int:
    """The bytes a chunk carries: its arrays' ``nbytes``, or an encoded chunk's payload
    bytes (``Encoded.nbytes``; the small header is not counted, as for codecs elsewhere)."""
    if isinstance(chunk, codecs.Encoded):
        return chunk.nbytes
    return int(sum(np.asarray(a).nbytes for a in chunk))


def weights_digest(layers: Sequence) -> int:
    """A CRC-32 of the layers' bytes: trainers compare it to prove they hold the same
    weights (a few ms for the paper's CNN)."""
    crc = 0
    for layer in layers:
        a = np.ascontiguousarray(layer)
        crc = zlib.crc32(a.dtype.str.encode(), crc)
        crc = zlib.crc32(a.data.cast("B"), crc)
    return crc


# -- the mailbox -------------------------------------------------------------------------------
_MISSING = object()


class Mailbox:
    """Chunks that arrived for a trainer's collectives, and the driver's aborts.

    Filled on the worker's event loop (by ``deliver_chunk`` and ``abort_collective``),
    read by its execution thread inside the collective. A collective is named by a *tag*,
    ``(run, round, attempt)``: ``run`` is a random id per training run (trainers can
    outlive a run and serve the next, whose rounds count from 1 again), and ``(round,
    attempt)`` increases through a run. Data-parallel adds a step, ``(run, round,
    attempt, step)``; an abort of ``(run, round, attempt)`` calls off each of its steps.
    Within a run, a chunk or an abort of an older tag than the one being worked on is stale
    and dropped, while one of a newer tag (a neighbour that started first) waits for its
    turn; starting a collective of another run drops everything of the previous ones.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._chunks: dict = {}
        self._aborted: dict = {}
        self._current: tuple | None = None

    def _stale(self, tag: tuple) -> bool:
        # A shorter tag names every collective it prefixes (data-parallel's steps share
        # their round's (run, round, attempt), which the driver's abort names).
        cur = self._current
        return cur is not None and tag[0] == cur[0] and tag[1:] < cur[1:len(tag)]

    def begin(self, tag: tuple) -> None:
        """Work on ``tag`` from now on: forget everything older, and other runs'."""
        tag = tuple(tag)
        with self._cond:
            self._current = tag

            def keep(t):
                return t[0] == tag[0] and t[1:] >= tag[1:len(t)]

            self._chunks = {k: v for k, v in self._chunks.items() if keep(k[0])}
            self._aborted = {t: r for t, r in self._aborted.items() if keep(t)}

    def deliver(self, tag: tuple, phase: str, step: int, chunk: Any) -> None:
        tag = tuple(tag)
        with self._cond:
            if self._stale(tag):
                return
            self._chunks[(tag, phase, int(step))] = chunk
            self._cond.notify_all()

    def abort(self, tag: tuple, reason: str) -> None:
        tag = tuple(tag)
        with self._cond:
            if self._stale(tag):
                return
            self._aborted[tag] = reason
            self._cond.notify_all()

    def take(self, tag: tuple, phase: str, step: int, timeout_s: float,
             check: Callable[[], None] | None = None, poll_s: float = 0.1) -> Any:
        """Wait for the chunk of ``(tag, phase, step)`` and return it.

        Calls ``check()`` (outside the lock) every ``poll_s`` while waiting; what it raises
        propagates. Raises :class:`CollectiveAborted` once ``tag`` is aborted and
        :class:`CollectiveTimeout` after ``timeout_s`` without the chunk.
        """
        tag = tuple(tag)
        key = (tag, phase, int(step))
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                while True:
                    for n in range(len(tag), 1, -1):   # this tag, or one prefixing it
                        if tag[:n] in self._aborted:
                            raise CollectiveAborted(self._aborted[tag[:n]])
                    item = self._chunks.pop(key, _MISSING)
                    if item is not _MISSING:
                        return item
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CollectiveTimeout(
                            f"no chunk {phase}/{step} of collective {tag} arrived within "
                            f"{timeout_s:g} s")
                    if not self._cond.wait(min(left, poll_s)):
                        break   # a poll tick: run check() outside the lock
            if check is not None:
                check()


def run_member(vectors: list, rank: int, size: int, tag: tuple, box: Mailbox,
               send_chunk: Callable[[str, int, Any], Any], runtime: Any,
               timeout_s: float, codec=None, feedback: HopFeedback | None = None) -> list:
    """One member's part of a collective over actor calls: :func:`ring_allreduce` with
    ``send_chunk(phase, step, chunk)`` (an actor call to the right neighbour, returning its
    ref) and the chunks from the left taken from ``box`` (filled by the member's
    ``deliver_chunk``). ``runtime`` is the member's backend (its ``wait``/``get``);
    ``codec`` and ``feedback`` as :func:`ring_allreduce` takes them.

    Raises :class:`PeerLost` as soon as a send's call failed because the right neighbour
    died, and as :meth:`Mailbox.take` does (aborted, timed out)."""
    from ddlf_actors.errors import ActorDiedError

    sends: list = []

    def send(phase, step, chunk):
        sends.append(send_chunk(phase, step, chunk))

    def check():
        # A send that failed means the right neighbour is gone: stop waiting now rather
        # than when the driver's abort arrives.
        if not sends:
            return
        ready, _ = runtime.wait(list(sends), num_returns=len(sends), timeout=0)
        for ref in ready:
            sends.remove(ref)
            try:
                runtime.get(ref)
            except ActorDiedError as e:
                raise PeerLost(str(e).strip().splitlines()[0]) from None

    def recv(phase, step):
        return box.take(tag, phase, step, timeout_s, check)

    return ring_allreduce(vectors, rank, size, send, recv, codec=codec, feedback=feedback)
