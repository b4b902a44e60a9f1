"""The gradient noise scale of DDLF's models as one process trains them: whether K
trainers should each take the user's batch or split it between them.

    python benchmarks/training/noise_scale.py [--models gpt-tiny,wide_cnn]
        [--at 0,0.05,0.15,0.3] [--batch 32] [--batches 32] [--seed 0] [--json FILE]

Why: on text, DDLF's defaults (each of K trainers steps on the whole batch) learn per
token what DDP learns, far less than one process; with the batch split between the
trainers they learn what one process does (``lm_compare.py``, ``ddlf-split-batch``). On
the CNNs of issue 30 the whole batch per trainer cost almost no epochs. McCandlish et al.
("An Empirical Model of Large-Batch Training", 2018) name the quantity that separates
the two: the simple noise scale ``B_simple = tr(Σ) / |G|²``, about the batch above which
a bigger batch stops buying progress per step. A rule for ``auto`` would compare K times
the batch with it; this script measures it, to see whether it does separate the models.

How (their appendix A, unbiased from two batch sizes; ``apps/schemes/noise.py``, which
``auto``'s start-up probe uses too): at each point of a single
process's training (``--at``, in epochs; the process trains with its own optimizer at
``--batch`` in between), the gradient of ``--batches`` disjoint batches of ``b =
--batch`` samples through the framework adapter's ``compute_gradients`` (DDLF's own,
as ``scheme="dataparallel"`` takes it); their mean is the gradient of one batch of ``B =
n·b``. With ``|G_b|²`` the mean squared norm of the small batches' gradients and
``|G_B|²`` the big one's:

    |G|²  = (B·|G_B|² − b·|G_b|²) / (B − b)
    tr(Σ) = (|G_b|² − |G_B|²) / (1/b − 1/B)

One process, the model's own threads (2); a point takes ``--batches`` gradients. The
GPT is the PyTorch one on Debian's fortunes (context 128, byte tokens: a sample is a
window); the CNN is Keras on Fashion-MNIST (a sample is an image). Prints a table.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")   # before numpy, torch or TF load
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: ddlf_actors from the checkout
    sys.path.insert(0, _ROOT)

import numpy as np  # noqa: E402

from ddlf_actors.apps.schemes.noise import estimate  # noqa: E402

__all__ = ["main"]

MODELS = ("gpt-tiny", "gpt-small", "paper_cnn", "wide_cnn")


def _data(name: str, seed: int):
    """``(adapter, x, y)``: the model built as a DDLF trainer builds it, and its data."""
    from ddlf_actors.apps import datasets, frameworks, lm, models, tf_startup

    if name.startswith("gpt-"):
        ds = datasets.corpus("fortunes", context=128).prepare()
        (x, y), _ = ds.load_shared()
        fn = lm.GptModelFn(ds, framework="torch", size=name[4:], seed=seed,
                           total_steps=max(1, len(x) // 32))
    else:
        (x, y), _ = datasets.load("fashion-mnist")
        fn = getattr(models, name)
        tf_startup.import_tensorflow().keras.utils.set_random_seed(seed)
    with tf_startup.quiet_startup():
        model = fn()
    return frameworks.for_model(model)(model, {}), x, y


def _gradients(adapter, x, y, probe, b: int, losses: list):
    """The gradient of each batch of ``b`` of the rows ``probe``, one at a time (their
    losses appended to ``losses``)."""
    for i in range(len(probe) // b):
        idx = np.sort(probe[i * b:(i + 1) * b])
        g, loss = adapter.compute_gradients(x[idx], y[idx])
        losses.append(loss)
        yield g


def measure(name: str, at: list, b: int, n: int, seed: int) -> list:
    adapter, x, y = _data(name, seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    done, rows = 0, []   # samples trained so far, in order
    for epochs in at:
        upto = int(round(epochs * len(x)))
        while done < upto:   # train one process to this point, a slice of the epoch at a time
            step = min(upto - done, 64 * b)
            idx = np.sort(order[done:done + step])
            adapter.fit(x[idx], y[idx], 1, b)
            done += step
        probe = rng.choice(len(x), n * b, replace=False)
        t0 = time.perf_counter()
        losses: list = []
        est = estimate(_gradients(adapter, x, y, probe, b, losses), b)
        rows.append({"model": name, "epochs": epochs, "loss": float(np.mean(losses)), **est,
                     "probe_s": time.perf_counter() - t0})
        shown = "-" if est["b_simple"] is None else f"{est['b_simple']:.0f}"
        print(f"{name} at {epochs:g} epochs: loss {rows[-1]['loss']:.3f}, B_simple {shown} "
              f"({rows[-1]['probe_s']:.1f} s)", file=sys.stderr, flush=True)
    return rows


def table(rows: list, b: int) -> str:
    out = [f"| model | epochs trained | loss | B_simple (samples) | K·{b} at K = 2, 4, 8 "
           "against it |", "|---|---|---|---|---|"]
    for r in rows:
        bs = r["b_simple"]
        verdict = "-" if bs is None else ", ".join(
            f"{'above' if k * b > bs else 'below'}" for k in (2, 4, 8))
        out.append(f"| {r['model']} | {r['epochs']:g} | {r['loss']:.3f} | "
                   f"{'-' if bs is None else f'{bs:,.0f}'} | {verdict} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="gpt-tiny,wide_cnn")
    p.add_argument("--at", default="0,0.05,0.15,0.3", help="epochs of training, ascending")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args(argv)
    names = [m for m in a.models.split(",") if m]
    bad = [m for m in names if m not in MODELS]
    if bad:
        p.error(f"unknown models {bad}; known: {', '.join(MODELS)}")
    at = [float(v) for v in a.at.split(",")]
    if at != sorted(at) or at[0] < 0:
        p.error("--at: epochs, ascending, from 0")
    if a.batches < 2 or a.batch < 1:
        p.error("--batches must be >= 2 and --batch >= 1")
    rows = [r for name in names for r in measure(name, at, a.batch, a.batches, a.seed)]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    print(table(rows, a.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
