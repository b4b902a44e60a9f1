"""A node's GPUs: which ids it offers, and which it has handed to which workers.

The head counts a node's GPUs as a total; the node decides which ids a demand gets, so
that ``CUDA_VISIBLE_DEVICES`` in a worker names GPUs that are really free. Fractions
(``num_gpus=0.5``) pack onto one GPU; whole demands take unused GPUs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess

from .. import config
from ..errors import DDLFError

__all__ = ["GpuAllocator", "detect_gpus"]

log = logging.getLogger("ddlf.node")


class GpuAllocator:
    """GPU id -> the fraction of it not yet handed to a worker.

    ``take`` is pure bookkeeping; ``claim`` waits on ``loop`` for a GPU on its way back.
    """

    def __init__(self, ids: list, loop=None):
        self.ids = list(ids)
        self.free: dict = {g: 1.0 for g in self.ids}
        self.loop = loop
        self._returned = asyncio.Event()

    @staticmethod
    def share(amount: float) -> float:
        """What a demand of ``amount`` GPUs holds of each GPU it is given."""
        return amount if amount < 1 else 1.0

    def take(self, amount: float, share: bool = True) -> list | None:
        """Pick GPU ids for a demand of ``amount`` GPUs and mark them used.

        A fraction goes to the fullest GPU it still fits on, so fractions pack together
        and whole GPUs stay free; a whole number takes that many unused GPUs. When no
        GPU has room: None, or with ``share`` the least used ones, shared (GPU use is
        not enforced, as in Ray), with a warning.
        """
        free = self.free
        if amount <= 0 or not free:
            return []
        if amount < 1:
            fits = [g for g, f in free.items() if f + 1e-9 >= amount]
            if fits:
                ids = [min(fits, key=lambda g: free[g])]
            elif not share:
                return None
            else:
                ids = [max(free, key=lambda g: free[g])]
                log.warning("no single GPU has %.2f free; sharing GPU %s", amount, ids[0])
        else:
            n = int(round(amount))
            ids = [g for g, f in free.items() if f >= 1 - 1e-9][:n]
            if len(ids) < n:
                if not share:
                    return None
                ids = sorted(free, key=lambda g: -free[g])[:n]
                log.warning("fewer than %d unused GPUs; sharing GPUs %s", n, ids)
        for g in ids:
            free[g] -= self.share(amount)
        return ids

    async def claim(self, amount: float) -> list:
        """GPU ids for a demand the head placed here, waiting briefly if none has room.

        The head counts this node's GPUs in total. It frees a killed actor's share at
        once, while its process may still be exiting here, and it cannot see how
        fractions are spread over GPUs; so a demand may arrive before a GPU is back.
        """
        loop = self.loop
        deadline = loop.time() + config.GPU_WAIT_S
        while True:
            ids = self.take(amount, share=loop.time() >= deadline)
            if ids is not None:
                return ids
            self._returned.clear()
            try:
                await asyncio.wait_for(self._returned.wait(),
                                       max(0.01, deadline - loop.time()))
            except asyncio.TimeoutError:
                pass

    def give_back(self, ids: list, share: float) -> None:
        """``share`` of each GPU in ``ids`` is free again (a worker exited or was released)."""
        for g in ids:
            if g in self.free:
                self.free[g] = min(1.0, self.free[g] + share)
        if ids:
            self._returned.set()


def detect_gpus(declared: float | None = None) -> list:
    """The GPU ids this node offers.

    As in Ray: the entries of ``CUDA_VISIBLE_DEVICES`` when it is set (kept as strings),
    else ``0 .. n-1`` for the n GPUs ``nvidia-smi -L`` lists (none without it). A declared
    count (``--num-gpus``) keeps the first n visible ids, or numbers them ``0 .. n-1``;
    declaring more than ``CUDA_VISIBLE_DEVICES`` lists is an error.
    """
    if declared is not None and (isinstance(declared, bool) or declared < 0
                                 or float(declared) != int(declared)):
        raise DDLFError(f"num_gpus of a node must be a whole number >= 0, got {declared!r}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [] if visible.strip() in ("", "NoDevFiles") else [
            i.strip() for i in visible.split(",") if i.strip()]
        if declared is None:
            return ids
        if int(declared) > len(ids):
            raise DDLFError(f"num_gpus={declared:g} but CUDA_VISIBLE_DEVICES={visible!r} lists "
                            f"{len(ids)} GPU(s); declare at most {len(ids)} or widen "
                            "CUDA_VISIBLE_DEVICES")
        return ids[:int(declared)]
    if declared is not None:
        return list(range(int(declared)))
    return list(range(_nvidia_smi_count()))


def _nvidia_smi_count() -> int:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))
