"""The DDLF paper's Table 3.7, redone: codecs on the paper CNN's weights and on a real delta.

    python benchmarks/training/compression.py [--data-dir DIR] [--samples 30000] [--repeat 7]
                                     [--json out.json] [--quick]

Three inputs, each a list of the paper CNN's 8 tensors (515,146 float32 values, 2.06 MB):

initial weights   ``models.paper_cnn()`` as built (Glorot-uniform kernels, zero biases):
                  the paper's input for Table 3.7.
trained weights   the same model after training on ``--samples`` Fashion-MNIST images
                  (SGD 0.01, batch 32): what the driver ships to trainers in a run.
delta             initial − trained weights: what a trainer sends back after one round.
                  The default 30,000 samples are one trainer's share of an epoch at K = 2.

If Fashion-MNIST is not found (``datasets.load``: ``--data-dir``, ``$DDLF_DATA_DIR``,
the cache, Debian's ``dataset-fashion-mnist``), random images and labels of the same
shape are used instead, and the output says so.

Methods: the paper's stdlib compressors at their default levels (bz2 9, gzip 9, lzma
preset 6, zlib 6), applied to each tensor's bytes as the lz4 and zstd codecs are, and
the codecs of ``ddlf_actors.apps.codecs`` (none, lz4, zstd, zstd:19, fp16, int8,
topk:0.01, topk:0.1).

Per method and input:

- size: the codec's ``payload.nbytes``, or the compressed bytes;
- + wire: what DDLF's serialization adds to that when the payload is returned from a
  call (its pickle beyond the data; frame headers not counted);
- saved: the paper's "ratio", 1 − size/original; ×: original/size;
- encode, decode: the best of at least ``--repeat`` calls (``time.perf_counter``, one
  thread); calls that take under 0.5 s in all are repeated until 0.5 s is spent;
- max err, L2 err: max |x̂ − x| / max |x| and ‖x̂ − x‖ / ‖x‖ over all tensors;
- total: encode + transfer + decode, the transfer *computed* as size·8/rate at 1 Gbit/s
  and 100 Mbit/s (no protocol overhead, nothing measured). The paper measured its
  transfer on a 1 Gbit/s LAN: 0.438 s for 2.06 MB, about 38 Mbit/s in effect.
"""

from __future__ import annotations

import os

# Before numpy and TensorFlow load: one thread, as a trainer has (codecs run single-threaded).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import bz2  # noqa: E402
import datetime  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import lzma  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402

from ddlf_actors.apps import codecs, datasets, models  # noqa: E402
from ddlf_actors.runtime.wire import serialization  # noqa: E402

CODEC_SPECS = ["none", "lz4", "zstd", "zstd:19", "fp16", "int8", "topk:0.01", "topk:0.1"]
STDLIB = {"bz2": (bz2.compress, bz2.decompress), "gzip": (gzip.compress, gzip.decompress),
          "lzma": (lzma.compress, lzma.decompress), "zlib": (zlib.compress, zlib.decompress)}
ORDER = ["none", "bz2", "gzip", "lz4", "lzma", "zlib", "zstd", "zstd:19", "fp16", "int8",
         "topk:0.01", "topk:0.1"]
LINKS = {"1G": 1e9, "100M": 1e8}


class Stdlib:
    """A paper-style compressor over each tensor's bytes (not a registered codec)."""

    def __init__(self, name):
        self.name = name
        self.compress, self.decompress = STDLIB[name]

    def encode(self, arrays):
        # As uint8: gzip takes len() of its input as the byte count, which for an
        # ndarray is the length of its first axis.
        return [(a.shape, a.dtype, self.compress(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
                for a in arrays]

    def decode(self, payload):
        return [np.frombuffer(self.decompress(b), dtype=d).reshape(s) for s, d, b in payload]

    @staticmethod
    def nbytes(payload):
        return sum(len(b) for _, _, b in payload)


class CodecMethod:
    def __init__(self, spec):
        self.name = spec
        self.codec = codecs.get(spec)

    def encode(self, arrays):
        # A fresh stateless encoder: a table entry is one message, with nothing owed yet.
        return self.codec.encoder(error_feedback=False).encode(arrays)

    def decode(self, payload):
        return self.codec.decode(payload)

    @staticmethod
    def nbytes(payload):
        return payload.nbytes


def methods(available_only=True):
    out = []
    for name in ORDER:
        if name in STDLIB:
            out.append(Stdlib(name))
            continue
        try:
            out.append(CodecMethod(name))
        except codecs.CodecUnavailableError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
    return out


def best_of(fn, repeat, budget_s=0.5, most=200):
    """The fastest of at least ``repeat`` calls; fast calls repeat until ``budget_s`` is
    spent (at most ``most`` calls), so a busy machine's noise is less likely to stick."""
    best, result, spent, n = float("inf"), None, 0.0, 0
    while n < repeat or (spent < budget_s and n < most):
        t = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t
        best, spent, n = min(best, dt), spent + dt, n + 1
    return best, result


def measure(method, arrays, repeat, budget_s):
    enc_s, payload = best_of(lambda: method.encode(arrays), repeat, budget_s)
    dec_s, decoded = best_of(lambda: method.decode(payload), repeat, budget_s)
    x = np.concatenate([a.ravel() for a in arrays]).astype(np.float64)
    y = np.concatenate([np.asarray(b).ravel() for b in decoded]).astype(np.float64)
    size = method.nbytes(payload)
    original = sum(a.nbytes for a in arrays)
    # What DDLF's wire carries for this payload as a call's result: its pickle plus the
    # out-of-band buffers (frame headers not counted).
    wire = sum(memoryview(s).nbytes for s in serialization.dumps((payload, {"loss": 0.0})))
    row = {"method": method.name, "bytes": int(size), "wire_bytes": int(wire),
           "saved": 1 - size / original,
           "factor": original / size, "encode_s": enc_s, "decode_s": dec_s,
           "max_err": float(np.max(np.abs(y - x)) / np.max(np.abs(x))),
           "l2_err": float(np.linalg.norm(y - x) / np.linalg.norm(x))}
    for link, rate in LINKS.items():
        row[f"tx_{link}_s"] = size * 8 / rate
        row[f"total_{link}_s"] = enc_s + dec_s + size * 8 / rate
    return row


def load_data(data_dir, samples, seed):
    try:
        (x, y), _ = datasets.load("fashion-mnist", data_dir=data_dir, download=False)
        source = "Fashion-MNIST"
    except FileNotFoundError:
        rng = np.random.default_rng(seed)
        x = (rng.random((samples, 28, 28, 1), dtype=np.float32) - 0.5)
        y = rng.integers(0, 10, samples)
        source = "generated (Fashion-MNIST not found)"
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(x))[:samples]
    return x[idx], y[idx], source


def make_inputs(args):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(args.seed)
    model = models.paper_cnn()
    initial = [np.asarray(w) for w in model.get_weights()]
    x, y, source = load_data(args.data_dir, args.samples, args.seed)
    t = time.perf_counter()
    hist = model.fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
    train_s = time.perf_counter() - t
    trained = [np.asarray(w) for w in model.get_weights()]
    delta = [o - n for o, n in zip(initial, trained)]
    info = {"data": source, "samples": int(len(x)), "train_s": train_s,
            "loss": float(hist.history["loss"][-1]),
            "params": int(sum(a.size for a in initial)),
            "bytes": int(sum(a.nbytes for a in initial))}
    return {"initial weights": initial, "trained weights": trained, "delta": delta}, info


def fmt_table(title, rows, original):
    lines = [f"### {title} ({original / 1e6:.3f} MB)", "",
             "| method | size (MB) | + wire (KB) | saved | × | encode (ms) | decode (ms) | max err "
             "| L2 err | total @1G (ms) | total @100M (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        err = ("0" if r["max_err"] == 0 else f"{r['max_err']:.1e}",
               "0" if r["l2_err"] == 0 else f"{r['l2_err']:.1e}")
        lines.append(
            f"| {r['method']} | {r['bytes'] / 1e6:.3f} | {(r['wire_bytes'] - r['bytes']) / 1e3:.2f} | "
            f"{100 * r['saved']:.2f} % | "
            f"{r['factor']:.2f} | {1e3 * r['encode_s']:.2f} | {1e3 * r['decode_s']:.2f} | "
            f"{err[0]} | {err[1]} | {1e3 * r['total_1G_s']:.1f} | "
            f"{1e3 * r['total_100M_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="where Fashion-MNIST's IDX files are")
    p.add_argument("--samples", type=int, default=30000,
                   help="training images for the delta (default: one trainer's share at K=2)")
    p.add_argument("--repeat", type=int, default=7,
                   help="timings are the best of at least this many calls")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--quick", action="store_true", help="2,000 samples, best of 2")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.repeat = min(args.samples, 2000), 2
    inputs, info = make_inputs(args)
    print(f"# compression.py  {datetime.date.today()}  {platform.node()}  "
          f"python {platform.python_version()}  numpy {np.__version__}", file=sys.stderr)
    print(f"paper CNN: {info['params']:,} parameters, {info['bytes'] / 1e6:.3f} MB; delta from "
          f"{info['samples']:,} {info['data']} images (SGD 0.01, batch 32, {info['train_s']:.1f} s, "
          f"loss {info['loss']:.3f}); best of >= {args.repeat} calls (fast ones: 0.5 s of calls); "
          "totals add size·8/rate to encode "
          "and decode (computed, not measured)\n")
    results = {}
    for title, arrays in inputs.items():
        rows = [measure(m, arrays, args.repeat, 0.05 if args.quick else 0.5) for m in methods()]
        results[title] = rows
        print(fmt_table(title, rows, sum(a.nbytes for a in arrays)) + "\n")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results, "date": str(datetime.date.today())},
                      f, indent=1)


if __name__ == "__main__":
    main()
