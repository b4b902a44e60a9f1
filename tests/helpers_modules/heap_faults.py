"""Minor page faults of 20 training-like steps in a fresh process, for test_unit_heap.py.

    python heap_faults.py default|keep|trainer

A step mallocs sixteen 1 MiB blocks, writes them and frees them, as a framework's step
does with its activations. ``keep`` calls ``keep_freed_memory`` first; ``trainer``
builds a ``TrainerActor`` first (which should call it). Prints the faults of the steps.
"""

from __future__ import annotations

import ctypes
import resource
import sys

import numpy as np

MB = 1 << 20


def _data():
    x = np.zeros((8, 3), np.float32)
    y = np.zeros(8, np.int64)
    return (x, y), (x, y)


def main(mode: str) -> int:
    if mode == "keep":
        from ddlf_actors.apps.frameworks.heap import keep_freed_memory

        if not keep_freed_memory():
            raise SystemExit("keep_freed_memory did not apply")
    elif mode == "trainer":
        from ddlf_actors.apps.trainer import TrainerActor

        TrainerActor(object, _data, 0, 1)   # no framework owns object(): hooks unused
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)

    def step(n: int) -> None:
        blocks = [libc.malloc(MB) for _ in range(n)]
        for b in blocks:
            ctypes.memset(b, 1, MB)
        for b in blocks:
            libc.free(b)

    step(1)    # a freed 1 MiB block raises glibc's own thresholds to about its size
    step(16)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step(16)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
