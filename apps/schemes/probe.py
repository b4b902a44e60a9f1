"""The start-up probe of ``scheme="auto"``: a trainer's step time, its codecs' cost and the
ring's links, measured on the trainers themselves before the first round.

What ``auto.choose`` needs to pick the steps per round and the codec is three numbers:
how long a local step takes, how long encoding the model's size costs with each codec,
and how fast a trainer reaches its right-hand neighbour in the ring (the ring's slowest
link sets its pace). For the batch rule it needs two more: a step's time on the batch
split K ways, and the gradient noise scale (``noise.py``) from a few batches' gradients.
Each is measured where it happens, on the trainers, in a few seconds
(:class:`ProbeTrainer`, which ``TrainerActor`` inherits); :func:`measure` runs them
on every live trainer at once and never waits longer than its timeout: a probe that does
not finish (a link that drops, a trainer that hangs) comes back as a
:class:`Probe` with ``failed`` set, and ``auto`` falls back to settings that need no
measurement, saying so.

The step probe trains three batches and puts the weights and the optimizer's state back
(``get_optimizer_state``/``set_optimizer_state``): the run starts from the state it would
have had without the probe. A trainer whose optimizer state cannot be read (a
``TrainerActor`` subclass without those hooks) keeps what three steps did to its
optimizer's own state (a momentum, Adam's moments); its weights are put back all the same.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import numpy as np

from .. import backends
from . import noise

__all__ = ["Probe", "ProbeTrainer", "measure", "deadline", "LINK_SIZES", "NOISE_BATCHES",
           "NOISE_BUDGET_S", "STEPS_ALLOWED"]

# The two message sizes of the link probe: a small one for the latency, a large one for
# the bandwidth (the difference of their times is the large one's transfer).
LINK_SIZES = (64 * 1024, 4 * 1024 * 1024)
# The noise scale's gradients per trainer: 8 batches (with K = 2, 16 pooled) tell a
# model near its noise scale from one far below it (benchmarks/training/noise_scale.py at
# 0 epochs: gpt-tiny 1, paper_cnn 81, wide_cnn 86, with 32), at the cost of 8 steps' work.
NOISE_BATCHES = 8
# ... and at most this long on them once 4 are done (a slow node's probe stays short).
NOISE_BUDGET_S = 4.0
# What the default timeout adds, in the trainers' own measured steps, once those are in:
# the rest of a trainer's probe is at most 4 steps on the split batch, 8 gradients and the
# codecs. A 6 M-parameter GPT on one thread (a step of 0.94 s) needed about 20 s in all,
# and failed a fixed 20 s in one run of two (lm_compare.py --size small, 2026-11-30).
STEPS_ALLOWED = 24.0


@dataclasses.dataclass
class Probe:
    """What :func:`measure` found. ``step_s``: seconds per local step (the slowest
    trainer's); ``encode_s``: codec spec -> seconds to encode and decode the whole model
    once; ``bandwidth_Bps`` and ``latency_s``: the ring's slowest link (None with one
    trainer); ``split_step_s``: a step of ``split_batch`` samples; ``noise``: the gradient
    noise scale's estimate (``noise_failed``: why there is none); ``failed``: why the probe
    gave up, or None."""

    step_s: float | None = None
    encode_s: dict = dataclasses.field(default_factory=dict)
    # The batch rule's figures: the split batch, a step's seconds on it, and the pooled
    # noise estimate (noise.combine's), or why there is none.
    split_batch: int | None = None
    split_step_s: float | None = None
    noise: dict | None = None
    noise_failed: str | None = None
    bandwidth_Bps: float | None = None
    latency_s: float | None = None
    seconds: float = 0.0
    failed: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class ProbeTrainer:
    """The trainer's side of the probe: ``TrainerActor`` inherits these methods."""

    x: Any
    y: Any
    fit: Callable[..., float]
    get_weights: Callable[[], list]
    set_weights: Callable[[list], None]
    get_optimizer_state: Callable[[], Any]
    set_optimizer_state: Callable[[Any], None]
    compute_gradients: Callable[..., tuple]

    def probe_step(self, batch_size: int, steps: int = 3) -> dict:
        """Seconds per local step of ``batch_size`` (after one untimed step, which traces
        the framework's step), with the weights and optimizer state put back after."""
        weights = self.get_weights()
        state = self.get_optimizer_state()
        n = min(len(self.x), batch_size * (steps + 1))
        x, y = self.x[:n], self.y[:n]
        try:
            self.fit(x[:batch_size], y[:batch_size], 1, batch_size)
            done = max(1, (n - batch_size) // batch_size)
            t = time.perf_counter()
            self.fit(x[batch_size:batch_size * (done + 1)], y[batch_size:batch_size * (done + 1)],
                     1, batch_size)
            spent = (time.perf_counter() - t) / done
        finally:
            self.set_weights(weights)
            if state is not None:
                self.set_optimizer_state(state)
            else:
                adapter = getattr(self, "adapter", None)   # TrainerActor's, if any
                if adapter is not None:
                    adapter.reset_optimizer_state()
        return {"step_s": spent}

    def probe_noise(self, batch_size: int, batches: int = NOISE_BATCHES,
                    budget_s: float = NOISE_BUDGET_S, seed: int = 0) -> dict:
        """The noise scale's estimate (``noise.estimate``) from the gradients of up to
        ``batches`` disjoint batches of ``batch_size`` rows drawn from this trainer's data
        at its current weights (which it does not change); it stops early after
        ``budget_s`` once 4 are done."""
        n = min(int(batches), len(self.x) // batch_size)
        if n < 2:
            raise ValueError(f"{len(self.x)} rows hold fewer than 2 batches of {batch_size}")
        rows = np.random.default_rng(seed).choice(len(self.x), n * batch_size, replace=False)
        t0 = time.perf_counter()

        def gradients():
            for i in range(n):
                if i >= 4 and time.perf_counter() - t0 > budget_s:
                    return
                idx = np.sort(rows[i * batch_size:(i + 1) * batch_size])
                yield self.compute_gradients(self.x[idx], self.y[idx])[0]

        return {**noise.estimate(gradients(), batch_size), "seconds": time.perf_counter() - t0}

    def probe_codecs(self, specs: list) -> dict:
        """Seconds to encode and decode a float32 vector of the model's size with each codec
        (``specs``; ``:ef`` is dropped: error feedback adds one subtraction)."""
        from .. import codecs

        size = sum(int(np.size(w)) for w in self.get_weights())
        vector = np.random.default_rng(0).standard_normal(size).astype(np.float32)
        out = {}
        for spec in specs:
            codec = codecs.get(spec.split(":")[0])
            t = time.perf_counter()
            codec.decode(codec.encode([vector]))
            out[spec] = time.perf_counter() - t
        return out

    async def probe_sink(self, blob) -> int:
        """Receive one probe message (``async``: it runs on the event loop, even while the
        execution thread is in this trainer's own :meth:`probe_link`)."""
        return len(blob)

    def probe_link(self, right, sizes=LINK_SIZES, timeout_s: float = 10.0) -> dict:
        """Seconds to deliver a message of each of ``sizes`` bytes to ``right`` (the best of
        two, after one small message that opens the connection). ``TimeoutError`` when one
        takes longer than ``timeout_s``."""
        here = backends.here()
        here.get(right.probe_sink.remote(b"\0"), timeout=timeout_s)
        times = []
        for size in sizes:
            blob = np.zeros(size, np.uint8)
            best = float("inf")
            for _ in range(2):
                t = time.perf_counter()
                here.get(right.probe_sink.remote(blob), timeout=timeout_s)
                best = min(best, time.perf_counter() - t)
            times.append(best)
        return {"sizes": list(sizes), "seconds": times}


def link_figures(sizes, seconds) -> tuple[float, float]:
    """``(bandwidth in bytes/s, latency in s)`` of one link from the two probe messages:
    the small one's time is the latency, the difference is the large one's transfer."""
    small, large = sizes[0], sizes[-1]
    t_small, t_large = seconds[0], seconds[-1]
    transfer = t_large - t_small
    bandwidth = (large - small) / transfer if transfer > 0 else large / max(t_large, 1e-9)
    return float(bandwidth), float(t_small)


def measure(backend, handles: list, batch_size: int, codec_specs: list,
            timeout_s: float = 20.0, link: bool = True, split_batch: int | None = None,
            steps_allowed: float = 0.0) -> Probe:
    """Probe the trainers ``handles`` (ring order): every trainer's step, the first one's
    codecs and, with ``link`` and more than one trainer, each trainer's link to its right
    neighbour, all at once; with ``split_batch``, every trainer's step on it and its
    gradients' noise scale too. Never waits longer than ``timeout_s``, plus, with
    ``steps_allowed``, that many of the slowest trainer's measured steps once every step
    measurement is in (:func:`deadline`): a probe that does not finish comes back with
    ``failed`` set (its calls may still be queued on the trainers; each gives up by itself
    within ``timeout_s``)."""
    t0 = time.perf_counter()
    k = len(handles)
    steps = [h.probe_step.remote(batch_size) for h in handles]
    splits = ([h.probe_step.remote(split_batch) for h in handles]
              if split_batch is not None else [])
    noises = ([h.probe_noise.remote(batch_size, seed=i) for i, h in enumerate(handles)]
              if split_batch is not None else [])
    codec_ref = handles[0].probe_codecs.remote(list(codec_specs)) if codec_specs else None
    links = ([h.probe_link.remote(handles[(i + 1) % k], LINK_SIZES, timeout_s)
              for i, h in enumerate(handles)] if link and k > 1 else [])
    refs = steps + splits + noises + ([codec_ref] if codec_ref is not None else []) + links
    allowed = timeout_s
    if steps_allowed > 0:
        # Each trainer runs its calls in order, its step first: once every step is in,
        # the rest (a split step, the noise's gradients, the codecs) is work of a known
        # size in steps, so a model whose steps are slow is given their time, not failed.
        done, _ = backend.wait(steps, num_returns=len(steps), timeout=timeout_s)
        if len(done) == len(steps):
            try:
                slowest = max(backend.get(r)["step_s"] for r in steps)
            except Exception:   # said below, as the probe's failure
                slowest = 0.0
            allowed = deadline(timeout_s, slowest, steps_allowed)
    ready, _ = backend.wait(refs, num_returns=len(refs),
                            timeout=max(0.0, allowed - (time.perf_counter() - t0)))
    if len(ready) < len(refs):
        return Probe(seconds=time.perf_counter() - t0,
                     failed=f"{len(refs) - len(ready)} of its {len(refs)} measurements did not "
                            f"finish within {allowed:.3g} s (a slow or broken link between "
                            "trainers, or a trainer that is stuck)")
    try:
        step_s = max(backend.get(r)["step_s"] for r in steps)
        encode_s = backend.get(codec_ref) if codec_ref is not None else {}
        bandwidth = latency = None
        if links:
            figures = [link_figures(v["sizes"], v["seconds"]) for v in backend.get(links)]
            bandwidth = min(b for b, _ in figures)
            latency = statistics.median(lat for _, lat in figures)
    except Exception as e:   # a measurement that raised (TimeoutError on a link): say which
        return Probe(seconds=time.perf_counter() - t0,
                     failed=f"a measurement failed: {_brief(e)}")
    found = Probe(step_s=step_s, encode_s=encode_s, bandwidth_Bps=bandwidth,
                  latency_s=latency)
    if split_batch is not None:
        _batch_figures(backend, found, split_batch, splits, noises)
    found.seconds = time.perf_counter() - t0
    return found


def deadline(timeout_s: float, step_s: float, steps_allowed: float) -> float:
    """Seconds the whole probe may take: ``timeout_s`` and ``steps_allowed`` steps of
    ``step_s`` more. Bounded: the steps came in within ``timeout_s`` (4 of them a trainer,
    so a step is under a quarter of it), and a step reported longer counts as
    ``timeout_s``, so the probe never takes more than ``(1 + steps_allowed) · timeout_s``."""
    return timeout_s + steps_allowed * max(0.0, min(step_s, timeout_s))


def _batch_figures(backend, found: Probe, split_batch: int, splits: list, noises: list) -> None:
    """The batch rule's figures into ``found``: the slowest trainer's step on
    ``split_batch``, and the trainers' noise estimates pooled. A trainer that cannot give
    its gradients (a ``TrainerActor`` without ``compute_gradients``) leaves ``noise`` None
    and says why in ``noise_failed``: the batch is then kept."""
    found.split_batch = split_batch
    try:
        found.split_step_s = max(backend.get(r)["step_s"] for r in splits)
        found.noise = noise.combine(backend.get(noises))
    except Exception as e:   # any trainer's failure: keep the batch, say why
        found.noise_failed = _brief(e)[:300]


def _brief(error: BaseException) -> str:
    """``Type: first line of the message``: what a probe's line says of a failure."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
