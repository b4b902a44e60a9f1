"""int4 against int8 and fp16 (issue 23 section 3): bytes, speed and error on a 5 M-parameter
delta, and the ring allreduce with a codec per hop.

    python benchmarks/training/low_bit.py [--repeat 15] [--ks 2,3,4,5,8] [--json out.json]

The delta: the layers of ``models.wide_cnn`` (5,106,106 float32 values; 99.5 % in one
7744 x 656 dense kernel), each a Gaussian scaled like a round's delta (1e-3; the
layer's values are i.i.d., so this is the codecs' typical case, not their worst). No
TensorFlow.

**Codecs**: per codec, the payload's bytes and how many times fewer than float32, the
best encode and decode time of ``--repeat`` calls (the codecs take turns, so a change in
the machine's load touches all alike; one thread), their ratio to int8's, and the error:
L2 of (decoded − x) over L2 of x, and the largest |decoded − x| over the largest |x|.

**Ring**: K members (threads, with ``apps/ring.py``'s mailboxes; chunks through pickle
protocol 5 as the wire sends them) sum the delta, each member's scaled by 1/K, with a
codec per hop; the bytes one member sends per collective (equal to ``ring_send_bytes``'s
prediction, checked) and their ratio to float32, and the error of the result against the
exact float64 sum: relative L2, next to the error of encoding the exact mean once (what
the driver's path costs per direction). Every member ends bit-identical (checked).

**Feedback**: K = 4, ``--feedback-rounds`` collectives of fresh deltas (each half a
component that every round shares, half fresh noise), with and without a
``ring.HopFeedback`` per member: the running sum's relative L2 error.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ddlf_actors.apps import codecs, ring  # noqa: E402

WIDE_CNN = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (7744, 656), (656,), (656, 10), (10,)]
CODECS = ["none", "fp16", "int8", "int4", "int4:64"]


def delta(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in WIDE_CNN]


def rel_error(got: list, want: list) -> tuple[float, float]:
    num = sum(float(np.sum((np.asarray(g, np.float64) - w) ** 2)) for g, w in zip(got, want))
    den = sum(float(np.sum(np.asarray(w, np.float64) ** 2)) for w in want)
    worst = max(float(np.max(np.abs(np.asarray(g, np.float64) - w))) for g, w in zip(got, want))
    peak = max(float(np.max(np.abs(w))) for w in want)
    return (num / den) ** 0.5, worst / peak


def codec_table(repeat: int) -> tuple[str, dict]:
    x = delta()
    raw = sum(a.nbytes for a in x)
    best: dict = {s: [float("inf"), float("inf")] for s in CODECS}
    payloads = {}
    for _ in range(repeat):
        for spec in CODECS:       # in turns: load drifts touch every codec alike
            codec = codecs.get(spec)
            t = time.perf_counter()
            payload = codec.encode(x)
            enc = time.perf_counter() - t
            t = time.perf_counter()
            codec.decode(payload)
            dec = time.perf_counter() - t
            best[spec][0] = min(best[spec][0], enc)
            best[spec][1] = min(best[spec][1], dec)
            payloads[spec] = payload
    base = best["int8"]
    rows = ["| codec | MB | fewer than float32 | encode ms | decode ms | encode vs int8 | "
            "decode vs int8 | rel. L2 error | max err / max abs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out = {}
    for spec in CODECS:
        payload = payloads[spec]
        rel, worst = rel_error(codecs.get(spec).decode(payload), x)
        enc, dec = best[spec]
        out[spec] = {"bytes": payload.nbytes, "encode_s": enc, "decode_s": dec,
                     "rel_error": rel, "max_error": worst}
        rows.append(f"| {spec} | {payload.nbytes / 1e6:.3f} | {raw / payload.nbytes:.2f}x | "
                    f"{enc * 1e3:.1f} | {dec * 1e3:.1f} | {enc / base[0]:.2f}x | "
                    f"{dec / base[1]:.2f}x | {rel:.2e} | {worst:.2e} |")
    return "\n".join(rows), out


def ship(chunk):
    if isinstance(chunk, codecs.Encoded):
        buffers: list = []
        data = pickle.dumps(chunk, protocol=5, buffer_callback=buffers.append)
        return pickle.loads(data, buffers=[b.raw() for b in buffers])
    return [np.array(c) for c in chunk]


def run_ring(vectors: list, codec, feedbacks=None) -> tuple[list, list, float]:
    """Members as threads; returns (results, bytes each sent, wall seconds)."""
    n = len(vectors)
    boxes = [ring.Mailbox() for _ in range(n)]
    tag = (1, 1, 1)
    for b in boxes:
        b.begin(tag)
    results: list = [None] * n
    sent = [0] * n
    errors: list = []

    def member(r):
        def send(phase, step, chunk):
            sent[r] += ring.chunk_nbytes(chunk)
            boxes[(r + 1) % n].deliver(tag, phase, step, ship(chunk))

        def recv(phase, step):
            return boxes[r].take(tag, phase, step, 300.0)

        try:
            results[r] = ring.ring_allreduce(vectors[r], r, n, send, recv, codec=codec,
                                             feedback=feedbacks[r] if feedbacks else None)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    if errors:
        raise errors[0]
    return results, sent, time.perf_counter() - t


def ring_table(ks: list) -> tuple[str, list]:
    rows = ["| K | codec | MB sent per member | fewer than float32 | rel. L2 error of the sum | "
            "rel. error of one encoding of the mean | ring s (threads, in-process) |",
            "|---:|---|---:|---:|---:|---:|---:|"]
    out = []
    for k in ks:
        members = [delta(seed=1 + j) for j in range(k)]
        scaled = [ring.scaled_vectors(d, 1.0 / k) for d in members]
        vectors = [v for v, _ in scaled]
        spec_layout = scaled[0][1]
        exact = [sum(v[g].astype(np.float64) for v in vectors) for g in range(len(vectors[0]))]
        mean32 = ring.unflatten([e.astype(np.float32) for e in exact], spec_layout)
        raw = ring.ring_send_bytes(vectors[0], 0, k)
        for spec in ("none", "fp16", "int8", "int4"):
            results, sent, wall = run_ring(vectors, spec)
            for res in results[1:]:
                assert all(np.array_equal(a, b) for a, b in zip(res, results[0]))
            for r in range(k):
                assert sent[r] == ring.ring_send_bytes(vectors[r], r, k, codec=spec)
            rel, _ = rel_error(results[0], exact)
            codec = codecs.get(spec)
            once, _ = rel_error(codec.decode(codec.encode(mean32)),
                                ring.unflatten(exact, spec_layout))
            out.append({"k": k, "codec": spec, "bytes": sent[0], "rel_error": rel,
                        "one_encoding": once, "ring_s": wall})
            rows.append(f"| {k} | {spec} | {sent[0] / 1e6:.3f} | {raw / sent[0]:.2f}x | "
                        f"{rel:.2e} | {once:.2e} | {wall:.2f} |")
    return "\n".join(rows), out


def feedback_table(k: int, rounds: int) -> tuple[str, list]:
    """The running sum of ``rounds`` collectives (fresh deltas each round, half of each a
    component shared by every round: a steady drift plus noise), with and without a
    ``ring.HopFeedback`` per member: relative L2 error against the exact running sum."""
    rows = ["| K | codec | rounds | running sum's rel. L2 error, no feedback | with HopFeedback |",
            "|---:|---|---:|---:|---:|"]
    out = []
    drift = [delta(seed=100 + j) for j in range(k)]
    for spec in ("int8", "int4"):
        totals: dict = {"plain": None, "fed": None}
        exact = None
        feedbacks = [ring.HopFeedback() for _ in range(k)]
        for t in range(rounds):
            members = [[(a + b) / 2 for a, b in zip(drift[j], delta(seed=1000 * t + j))]
                       for j in range(k)]
            vectors = [ring.scaled_vectors(d, 1.0 / k)[0] for d in members]
            sums = [sum(v[g].astype(np.float64) for v in vectors) for g in range(len(vectors[0]))]
            exact = sums if exact is None else [a + b for a, b in zip(exact, sums)]
            for name in totals:
                res, _, _ = run_ring(vectors, spec,
                                     feedbacks if name == "fed" else None)
                got = [a.astype(np.float64) for a in res[0]]
                totals[name] = got if totals[name] is None else [
                    a + b for a, b in zip(totals[name], got)]
        plain, _ = rel_error(totals["plain"], exact)
        fed, _ = rel_error(totals["fed"], exact)
        out.append({"k": k, "codec": spec, "rounds": rounds, "plain": plain, "fed": fed})
        rows.append(f"| {k} | {spec} | {rounds} | {plain:.2e} | {fed:.2e} |")
    return "\n".join(rows), out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--ks", default="2,3,4,5,8")
    p.add_argument("--feedback-rounds", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args(argv)
    load = os.getloadavg()[0]
    ctable, cdata = codec_table(a.repeat)
    rtable, rdata = ring_table([int(k) for k in a.ks.split(",")])
    ftable, fdata = feedback_table(4, a.feedback_rounds)
    print(f"load average (1 min) {load:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"models.wide_cnn's layers, 5,106,106 float32 values, Gaussian x 1e-3\n")
    print(f"Codecs (best of {a.repeat} calls each, in turns):\n")
    print(ctable)
    print("\nRing allreduce with a codec per hop (each member's delta scaled by 1/K):\n")
    print(rtable)
    print("\nError feedback per hop (ring.HopFeedback), the running sum over rounds:\n")
    print(ftable)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"codecs": cdata, "ring": rdata, "feedback": fdata}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
