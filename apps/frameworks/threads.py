"""Thread counts for every framework a trainer may load, set before it runs an op.

A trainer does not know which framework its ``model_fn`` uses until the model exists,
and by then TensorFlow's thread pools are fixed (they are made at its first op). So
:func:`limit_threads` runs before ``model_fn`` and

- sets the environment every library reads at start-up (OpenMP, MKL, OpenBLAS,
  ``TF_NUM_INTRAOP_THREADS``/``TF_NUM_INTEROP_THREADS``);
- arranges for TensorFlow's and PyTorch's own settings (``tf.config.threading``,
  ``torch.set_num_threads``) to be made the moment either finishes importing, before any
  op can run: a finder on ``sys.meta_path`` wraps their loading. Nothing is imported
  that ``model_fn`` does not import itself, so a PyTorch trainer never loads TensorFlow.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any, Callable

__all__ = ["limit_threads"]


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
    for name, make in (("tensorflow", _tensorflow), ("torch", _torch)):
        module = sys.modules.get(name)
        if module is not None:
            make(n)(module)
        else:
            _finder.hooks[name] = make(n)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
