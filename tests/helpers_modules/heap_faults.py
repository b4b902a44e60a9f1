"""Minor page faults of 20 training-like steps in a fresh process, for test_unit_heap.py.

    python heap_faults.py default|keep|trainer main|thread

A step mallocs sixteen 1 MiB blocks, writes them and frees them, as a framework's step
does with its activations. ``keep`` calls ``keep_freed_memory`` first; ``trainer``
builds a ``TrainerActor`` first (which should call it). ``main`` runs the steps on the
main thread (glibc's main arena); ``thread`` on a new thread that first holds 56 MiB of
long-lived blocks, as an actor's execution thread holds its model: the steps then spill
from the thread arena's first 64 MiB heap into a second one, which glibc deletes
whenever it is empty again. Prints the faults of the steps.
"""

from __future__ import annotations

import ctypes
import resource
import sys
import threading

import numpy as np

MB = 1 << 20


def _data():
    x = np.zeros((8, 3), np.float32)
    y = np.zeros(8, np.int64)
    return (x, y), (x, y)


def _libc():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    return libc


def _steps(libc, held: int) -> int:
    """Faults of this thread's 20 steps, after holding ``held`` MiB."""
    kept = [libc.malloc(MB) for _ in range(held)]
    for b in kept:
        ctypes.memset(b, 1, MB)

    def step(n: int) -> None:
        blocks = [libc.malloc(MB) for _ in range(n)]
        for b in blocks:
            ctypes.memset(b, 1, MB)
        for b in blocks:
            libc.free(b)

    step(1)    # a freed 1 MiB block raises glibc's own thresholds to about its size
    step(16)
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(20):
        step(16)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def main(mode: str, where: str) -> int:
    if mode == "keep":
        from ddlf_actors.apps.frameworks.heap import keep_freed_memory

        if not keep_freed_memory():
            raise SystemExit("keep_freed_memory did not apply")
    elif mode == "trainer":
        from ddlf_actors.apps.trainer import TrainerActor

        TrainerActor(object, _data, 0, 1)   # no framework owns object(): hooks unused
    libc = _libc()
    if where == "main":
        print(_steps(libc, 0))
        return 0
    out: list = []
    t = threading.Thread(target=lambda: out.append(_steps(libc, 56)))
    t.start()
    t.join()
    print(out[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
