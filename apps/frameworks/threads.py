"""Thread counts for every framework a trainer may load, set before it runs an op.

A trainer does not know which framework its ``model_fn`` uses until the model exists,
and by then TensorFlow's thread pools are fixed (they are made at its first op). So
:func:`limit_threads` runs before ``model_fn`` and

- sets the environment every library reads at start-up (OpenMP, MKL, OpenBLAS,
  ``TF_NUM_INTRAOP_THREADS``/``TF_NUM_INTEROP_THREADS``);
- arranges for TensorFlow's and PyTorch's own settings (``tf.config.threading``,
  ``torch.set_num_threads``) to be made the moment either finishes importing, before any
  op can run: a finder on ``sys.meta_path`` wraps their loading. Nothing is imported
  that ``model_fn`` does not import itself, so a PyTorch trainer never loads TensorFlow;
- for JAX (Keras on its JAX backend), which has no setting for a number of threads:
  with one thread, ``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
  intra_op_parallelism_threads=1"`` (Eigen's matrix products on the calling thread), set
  the moment jax is imported, before its CPU backend starts (at the first op). The second
  word is the form JAX's issues give; XLA's flag parser takes it as a positional word and
  ignores it, so ``--xla_cpu_multi_thread_eigen=false`` is what acts. With more than one,
  XLA sizes its pool from the CPUs the process may run on (its affinity mask), and
  nothing in JAX 0.10 lowers it short of pinning the process to CPUs, which a trainer
  does not do (``num_cpus`` is a count the scheduler reserves, not particular cores): a
  JAX trainer with ``num_cpus`` > 1 may use every core of its node;
- ``OMP_WAIT_POLICY=PASSIVE`` with more than one thread (unless set already), before
  torch loads its OpenMP runtime (libgomp reads it once, when it loads): see
  :data:`OMP_WAIT_POLICY`.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any, Callable

__all__ = ["limit_threads", "OMP_WAIT_POLICY", "XLA_ONE_THREAD"]

# What OpenMP threads do between parallel regions in a trainer with more than one thread.
# libgomp's default spins for a while (up to GOMP_SPINCOUNT), which on a machine whose
# cores are all busy takes the CPU from the very threads the spinner waits for. Measured
# here (2 cores shared with other sessions; the paper CNN in PyTorch, batch 32, 200 steps,
# one process per run, 4 interleaved repetitions: benchmarks/training/omp_wait_policy.py), steps/s
# (load average 2.9-4.8 on the 2 cores during the runs):
#   1 thread                 92.9  73.7  99.9  94.8
#   2 threads, spinning       8.5  14.1  10.8   4.6   (libgomp's default)
#   2 threads, PASSIVE       59.6  51.0  48.9  36.4
# so 2 spinning threads ran 5-20x slower than 1 thread, and PASSIVE ran 4-8x faster than
# spinning (still below 1 thread on a busy machine: num_cpus=1 trainers suit a shared
# host). What spinning would save on an idle machine (a wake-up per parallel region) was
# not measurable here: this machine is never idle. DDLF sets PASSIVE; set OMP_WAIT_POLICY
# yourself to choose otherwise.
OMP_WAIT_POLICY = "PASSIVE"

# XLA_FLAGS for a JAX trainer of one thread (see the module's docstring).
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _tensorflow(n: int) -> Callable[[Any], None]:
    def configure(tf) -> None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(n)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TF already ran an op in this process: keep its pools
            pass
    return configure


def _torch(n: int) -> Callable[[Any], None]:
    def configure(torch) -> None:
        torch.set_num_threads(n)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:   # only before any inter-op parallel work: keep what it has
            pass
    return configure


def _jax(n: int) -> Callable[[Any], None]:
    def configure(jax) -> None:
        # Read when jax starts its CPU backend, at the first op, not at import.
        if n == 1 and "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                                       + XLA_ONE_THREAD).strip()
    return configure


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run ``hooks[name](module)`` right after module ``name`` is executed."""

    def __init__(self):
        self.hooks: dict[str, Callable[[Any], None]] = {}

    def find_spec(self, fullname, path, target=None):
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None:   # a namespace package: nothing of it runs, nothing to hook
            return spec
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec
        del self.hooks[fullname]

        def exec_module(module):
            run(module)
            hook(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # its loader only
        return spec


_finder = _AfterImport()


def limit_threads(n: int) -> None:
    """Every framework in this process uses ``n`` intra-op threads and one inter-op
    thread: set now for those already imported, at import for the others."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "TF_NUM_INTRAOP_THREADS"):
        os.environ[name] = str(n)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    if n > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
    for name, make in (("tensorflow", _tensorflow), ("torch", _torch), ("jax", _jax)):
        module = sys.modules.get(name)
        if module is not None:
            make(n)(module)
        else:
            _finder.hooks[name] = make(n)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
