"""glibc's heap in a training process: keep freed memory for the next step.

A training step allocates its activations and gradients, a few MB each, and frees them at
its end; the next step asks for the same sizes again. glibc serves a request of more than
``M_MMAP_THRESHOLD`` (128 KiB at start) with its own ``mmap`` and gives the pages back at
``free``, and trims the heap's free top above ``M_TRIM_THRESHOLD``. It raises both
thresholds as it sees large blocks freed (up to 32 MiB and 64 MiB), so how many of a
step's blocks come back as fresh, zeroed pages depends on what the process happened to
free before training. PyTorch's CPU allocator calls ``malloc`` for every tensor.

Measured (``benchmarks/peers/torch_alg6_gap.py``'s half epoch: the paper CNN in PyTorch,
25,000 images, batch 32, one thread, idle machine): a process that had loaded its data
into memory (and freed the loader's temporaries, which raised the thresholds) trained in
5.3-5.4 s with ~0.1 M minor page faults; the same process on the node's memory-mapped
dataset cache, which frees nothing large first, took 7.0-9.1 s with 1.1-1.8 M faults
(2 s of kernel time); a ``TrainerActor`` 6.8-8.6 s. With the thresholds fixed as below:
5.2-5.6 s and 0.07 M faults for both. Keras on TensorFlow, whose allocator is its own,
did not change (3.6-3.9 s either way).

A second door to the same cost: an actor's methods run on an execution thread, whose
allocations go to a thread arena made of 64 MiB heaps. When a step's blocks spill past
the heap that holds the model into a second heap, glibc deletes that heap (``munmap``)
as soon as it is empty again, whatever the trim threshold, and maps a new one at the
next step. In a cluster, one trainer in two of some runs did that (565 heaps made and
deleted in a half epoch, 0.67-1.19 M faults, 6.8-7.9 s against 5.5-6.2); with the
thresholds alone it stayed. ``M_TOP_PAD`` keeps a heap whose deletion would leave its
predecessor with less free room than the pad: with 64 MiB of pad, 10 trainers of 10
out of 5 runs kept their heaps (0.07 M faults each).

:func:`keep_freed_memory` fixes the thresholds where glibc's own adjustment would end
(which also stops the adjustment) and pads the top by 64 MiB: a trainer keeps up to
about 64 MiB of freed heap per arena instead of returning it. It leaves them alone
where the user chose them (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_``, ``GLIBC_TUNABLES``) and on a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "TOP_PAD"]

# glibc's upper bounds for its dynamic thresholds on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX,
# and twice that for trimming, as its adjustment sets it).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
TOP_PAD = 64 << 20   # a thread arena's heap is 64 MiB at most: pad by one (see above)

_M_TRIM_THRESHOLD = -1   # mallopt's parameter numbers, from glibc's malloc.h
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold",
                  "glibc.malloc.top_pad")


def _chosen_by_user() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return (any(name in os.environ for name in _USER_SETTINGS)
            or any(name in tunables for name in _USER_TUNABLES))


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds and pad its heap's top, for this process (see
    the module docstring); return whether they were set. Safe to call more than once."""
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
    # The pad is read at every trim, so it applies to arenas that exist already.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and mallopt(_M_TOP_PAD, TOP_PAD))
