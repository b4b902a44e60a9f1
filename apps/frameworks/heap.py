"""glibc's heap in a training process: keep freed memory for the next step.

A training step allocates its activations and gradients, a few MB each, and frees them at
its end; the next step asks for the same sizes again. glibc serves a request of more than
``M_MMAP_THRESHOLD`` (128 KiB at start) with its own ``mmap`` and gives the pages back at
``free``, and trims the heap's free top above ``M_TRIM_THRESHOLD``. It raises both
thresholds as it sees large blocks freed (up to 32 MiB and 64 MiB), so how many of a
step's blocks come back as fresh, zeroed pages depends on what the process happened to
free before training. PyTorch's CPU allocator calls ``malloc`` for every tensor.

Measured (``benchmarks/torch_alg6_gap.py``'s half epoch: the paper CNN in PyTorch,
25,000 images, batch 32, one thread, idle machine): a process that had loaded its data
into memory (and freed the loader's temporaries, which raised the thresholds) trained in
5.3-5.4 s with ~0.1 M minor page faults; the same process on the node's memory-mapped
dataset cache, which frees nothing large first, took 7.0-9.1 s with 1.1-1.8 M faults
(2 s of kernel time); a ``TrainerActor`` 6.8-8.6 s. With the thresholds fixed as below:
5.2-5.6 s and 0.07 M faults for both. Keras on TensorFlow, whose allocator is its own,
did not change (3.6-3.9 s either way).

:func:`keep_freed_memory` fixes the thresholds where glibc's own adjustment would end
(which also stops the adjustment): a trainer keeps up to 64 MiB of freed heap instead of
returning it. It leaves them alone where the user chose them
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``) and on a C
library other than glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

# glibc's upper bounds for its dynamic thresholds on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX,
# and twice that for trimming, as its adjustment sets it).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20

_M_TRIM_THRESHOLD = -1   # mallopt's parameter numbers, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def _chosen_by_user() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return (any(name in os.environ for name in _USER_SETTINGS)
            or any(name in tunables for name in _USER_TUNABLES))


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (see the module docstring);
    return whether they were set. Safe to call more than once."""
    if _chosen_by_user() or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)   # the C library this process already runs on
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting either threshold stops the adjustment of both.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
