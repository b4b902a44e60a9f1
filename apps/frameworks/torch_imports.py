"""torch's lazy imports in a trainer's process: made once, before its first optimizer, and
safe in a process where TensorFlow is loaded.

The first ``torch.optim`` optimizer built in a process imports ``torch._dynamo`` (about
6 s on this project's machines), and that imports ``triton`` where it is installed:
PyPI's torch for Linux x86_64 is the CUDA build, which brings it (torch 2.13.0 with
triton 3.7.1; this machine's ``+cpu`` build does not). Keras on its torch backend
imports both during ``fit``.

``triton`` cannot load after TensorFlow. TensorFlow's PyPI wheels 2.20 and 2.21 load
their library with ``RTLD_GLOBAL`` (tensorflow#124205, fixed upstream after 2.21), which
puts the LLVM statically linked into ``libtensorflow_framework.so.2`` into the process's
global symbol table. ``libtriton.so`` carries an LLVM of its own, of another version;
loaded after TensorFlow, about 14,000 of its symbol references bind to TensorFlow's
copies (``LD_DEBUG=bindings``), and its static initializers crash the process
(SIGSEGV in ``llvm::DebugCounter``'s registration, ``_GLOBAL__sub_I_PassBuilder.cpp``).
``import tensorflow; import triton`` is enough. Loaded in the other order, both work;
JAX is not involved (jaxlib exports no LLVM symbols: ``import jax; import triton`` and
the reverse both work). A process meets this when it runs Keras on TensorFlow and then
a PyTorch trainer (the in-process fake backend does, and so does the test suite), or
when a user's script imports TensorFlow before it trains PyTorch.

So, before ``triton`` is imported in a process whose global symbols hold an LLVM,
:func:`load_triton_apart` loads ``libtriton.so`` with ``RTLD_DEEPBIND``: its references
to symbols it defines itself (its LLVM among them) stay within it. Python's own import
then finds the library loaded and only initializes the module. Measured: after
TensorFlow, triton compiled a kernel to the same PTX and cubin, byte for byte, as in a
process without TensorFlow. :func:`install` puts a finder on ``sys.meta_path`` that does
this whenever anything imports ``triton``, whoever asks (torch's optimizers, Keras on
torch, ``torch.compile``): every trainer installs it before its ``model_fn`` runs.

:func:`finish_torch_imports` makes the optimizer's lazy import itself, once per process
and under a lock, before an adapter builds its first optimizer: several trainers on
threads (the fake backend runs each trainer on its own thread) then never import
``torch._dynamo`` at the same time, and the finder is in place before it is imported.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading

__all__ = ["install", "finish_torch_imports", "load_triton_apart", "llvm_is_global"]

# A symbol every LLVM build defines (llvm::cl::Option::addArgument(), which each
# command-line option's static initializer calls): found in the global scope only where a
# library put its LLVM there.
_LLVM_SYMBOL = "_ZN4llvm2cl6Option11addArgumentEv"
_TRITON_LIBRARY = "triton._C.libtriton"

_lock = threading.RLock()   # re-entrant: the finder runs inside finish_torch_imports' import
_torch_imports_done = False


def llvm_is_global() -> bool:
    """Whether this process's global symbol table holds an LLVM (TensorFlow 2.20 and 2.21
    from PyPI, once imported), which a later ``libtriton.so`` would bind to."""
    try:
        return hasattr(ctypes.CDLL(None), _LLVM_SYMBOL)
    except OSError:   # no dynamic loader to ask: no global scope to clash with
        return False


def _triton_library_path() -> str | None:
    """Where ``triton/_C/libtriton*.so`` is, found without importing ``triton`` (its
    ``__init__`` loads the library)."""
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_C", "libtriton" + suffix)
            if os.path.isfile(path):
                return path
    return None


def load_triton_apart() -> bool:
    """Load ``libtriton.so`` with ``RTLD_DEEPBIND`` if it is installed, not loaded yet, and
    an LLVM is in the global symbol table; return whether it did. Elsewhere (no triton, no
    LLVM in the global scope, a loader without ``RTLD_DEEPBIND``) it does nothing: the
    usual import is safe there, or nothing here could make it so."""
    deepbind = getattr(os, "RTLD_DEEPBIND", None)
    if deepbind is None or _TRITON_LIBRARY in sys.modules:
        return False
    with _lock:
        if _TRITON_LIBRARY in sys.modules or not llvm_is_global():
            return False
        path = _triton_library_path()
        if path is None:
            return False
        try:
            # Kept loaded by the loader for the process's life (Python's import opens the
            # same file again and gets this copy); the handle itself is not needed.
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL | deepbind)
        except OSError:
            return False   # a broken install: let the import say what is wrong
        return True


class _TritonFinder(importlib.abc.MetaPathFinder):
    """Loads ``libtriton.so`` apart (see the module docstring) right before Python's own
    finders locate it; finds nothing itself."""

    def find_spec(self, fullname, path, target=None):
        if fullname == _TRITON_LIBRARY:
            load_triton_apart()
        return None


_finder = _TritonFinder()


def install() -> None:
    """Make every later ``import triton`` in this process safe after TensorFlow. Cheap,
    imports nothing, and safe to call more than once."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def finish_torch_imports() -> None:
    """Once per process, under a lock: what torch imports when its first optimizer is
    built (``torch._dynamo``, and ``triton`` through it where installed), with
    :func:`install`'s finder in place. Call it before building an optimizer."""
    global _torch_imports_done
    if _torch_imports_done:
        return
    with _lock:
        if _torch_imports_done:
            return
        install()
        import torch._dynamo  # noqa: F401  (what torch.optim.Optimizer.__init__ imports)

        _torch_imports_done = True
