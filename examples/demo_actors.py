"""A tour of DDLF's actor API on an embedded local cluster.

    python examples/demo_actors.py

Training arrives with the training issue; until then this is the main demo.
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np

import ddlf_actors as ddlf


@ddlf.remote
class ParameterHolder:
    """Long-lived state: the paper's "workers keep their state" in actor form."""

    def __init__(self, dim: int):
        self.w = np.zeros(dim, dtype=np.float32)
        self.updates = 0

    def apply(self, delta: np.ndarray) -> int:
        self.w -= delta
        self.updates += 1
        return self.updates

    def weights(self) -> np.ndarray:
        return self.w


@ddlf.remote(num_cpus=1)
def gradient(weights: np.ndarray, seed: int) -> np.ndarray:
    # A stand-in for a worker's local training step on its own index partition.
    rng = np.random.default_rng(seed)
    print(f"computing a gradient for seed {seed}")
    return (weights - rng.normal(1.0, 0.1, size=weights.shape)).astype(np.float32) * 0.5


@ddlf.remote(max_concurrency=4)
class AsyncEcho:
    async def echo(self, x):
        await asyncio.sleep(0.1)
        return x


def main() -> None:
    info = ddlf.init()
    print(f"embedded cluster at {info.address}: {ddlf.cluster_resources()}")

    ps = ParameterHolder.remote(1_000_000)
    t0 = time.perf_counter()
    for step in range(5):
        w = ddlf.put(ddlf.get(ps.weights.remote()))     # one copy, shipped once per worker
        grads = ddlf.get([gradient.remote(w, seed) for seed in range(4)])
        ddlf.get(ps.apply.remote(np.mean(grads, axis=0)))
        print(f"step {step}: mean weight {ddlf.get(ps.weights.remote()).mean():.4f}")
    print(f"5 synchronous rounds over 4 workers in {time.perf_counter() - t0:.2f} s")

    echo = AsyncEcho.remote()
    t0 = time.perf_counter()
    print("async actor:", ddlf.get([echo.echo.remote(i) for i in range(8)]),
          f"in {time.perf_counter() - t0:.2f} s (4 at a time)")

    @ddlf.remote
    def boom():
        raise ValueError("remote failure, with its traceback")

    try:
        ddlf.get(boom.remote())
    except ValueError as e:  # the TaskError is also a ValueError
        print("caught a remote error:", type(e).__name__, "-", str(e).splitlines()[0])
    time.sleep(0.2)  # let the workers' output reach this terminal
    ddlf.shutdown()
    print(f"done (pid {os.getpid()})")


if __name__ == "__main__":
    main()
