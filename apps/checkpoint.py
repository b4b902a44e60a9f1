"""Checkpoints of a training run: written atomically, off the critical path, never unpickled.

A checkpoint is one ``.npz`` file, ``<dir>/ckpt-<round>.npz``, holding:

- the global weights (``w_<i>``);
- each trainer's optimizer state where the model has any (``opt_<slot>_<i>``);
- arrays the scheme needs to continue (``x_<name>_<i>``: an async run's weights of
  rows still being evaluated);
- ``meta``: one JSON string with the round, the epoch position, history, events,
  the driver's RNG seed, the run's configuration and the fingerprint of its model and
  dataset.

Everything is numeric arrays and JSON, read back with ``allow_pickle=False``: loading a
checkpoint cannot run code, whoever wrote the file.

Writing: a temp file in the same directory, ``fsync``, ``os.replace`` onto the final
name, ``fsync`` of the directory. A reader (and ``latest``) only ever opens final names,
so it never sees a half-written checkpoint, whether the writer was killed or the
machine lost power. The newest ``keep`` checkpoints stay; older ones are deleted after a
newer one is safely in place.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import time
import warnings
from typing import Any

import numpy as np

__all__ = ["Checkpoint", "CheckpointWriter", "CheckpointMismatchError", "save", "load",
           "latest", "list_checkpoints", "compare_fingerprints"]

_NAME_RE = re.compile(r"^ckpt-(\d{8})\.npz$")
FORMAT = 1


class CheckpointMismatchError(ValueError):
    """``resume=`` points at a checkpoint of another model or dataset."""


@dataclasses.dataclass
class Checkpoint:
    """What a run needs to continue. ``meta`` is JSON; the rest are numpy arrays."""

    round: int
    weights: list
    meta: dict
    optimizer_states: dict = dataclasses.field(default_factory=dict)  # slot -> [arrays]
    arrays: dict = dataclasses.field(default_factory=dict)            # name -> [arrays]
    path: str | None = None

    @property
    def history(self) -> list:
        return self.meta.get("history", [])

    @property
    def events(self) -> list:
        return self.meta.get("events", [])


def _file_name(round_no: int) -> str:
    return f"ckpt-{round_no:08d}.npz"


def list_checkpoints(directory: str) -> list[str]:
    """Paths of the finished checkpoints in ``directory``, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = sorted((int(m.group(1)), n) for n in names if (m := _NAME_RE.match(n)))
    return [os.path.join(directory, n) for _, n in found]


def save(directory: str, ckpt: Checkpoint, keep: int = 2) -> str:
    """Write ``ckpt`` atomically into ``directory``; drop all but the newest ``keep``."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, _file_name(ckpt.round))
    tmp = os.path.join(directory, f".{_file_name(ckpt.round)}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    arrays: dict[str, Any] = {"meta": np.array(json.dumps({"format": FORMAT, "round": ckpt.round,
                                                             **ckpt.meta}))}
    for i, w in enumerate(ckpt.weights):
        arrays[f"w_{i}"] = np.asarray(w)
    for slot, state in ckpt.optimizer_states.items():
        for i, a in enumerate(state or ()):
            arrays[f"opt_{int(slot)}_{i}"] = np.asarray(a)
    for name, items in ckpt.arrays.items():
        if not re.match(r"^[A-Za-z0-9]+$", name):
            raise ValueError(f"checkpoint array group name {name!r}: letters and digits only")
        for i, a in enumerate(items):
            arrays[f"x_{name}_{i}"] = np.asarray(a)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    for old in list_checkpoints(directory)[:-keep]:
        try:
            os.unlink(old)
        except OSError:
            pass
    return final


def _fsync_dir(directory: str) -> None:
    # The rename is durable only once the directory entry is on disk too.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read(path: str) -> Checkpoint:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}, this DDLF "
                             f"reads format {FORMAT}")
        keys = list(z.keys())
        weights = [z[f"w_{i}"] for i in range(sum(1 for k in keys if k.startswith("w_")))]
        opt: dict = {}
        arrays: dict = {}
        for k in keys:
            if k.startswith("opt_"):
                _, slot, i = k.split("_")
                opt.setdefault(int(slot), {})[int(i)] = z[k]
            elif k.startswith("x_"):
                _, name, i = k.split("_")
                arrays.setdefault(name, {})[int(i)] = z[k]
    return Checkpoint(
        round=int(meta["round"]), weights=weights, meta=meta,
        optimizer_states={s: [v[i] for i in sorted(v)] for s, v in opt.items()},
        arrays={n: [v[i] for i in sorted(v)] for n, v in arrays.items()}, path=path)


def latest(directory: str) -> Checkpoint | None:
    """The newest readable checkpoint in ``directory``, or None if it holds none.

    A damaged newest file (a disk error; never a half-written one) is skipped with a
    warning in favour of the one before it.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            return _read(path)
        except (OSError, ValueError, KeyError) as e:
            warnings.warn(f"skipping unreadable checkpoint {path}: {e}", RuntimeWarning,
                          stacklevel=2)
    return None


def load(directory: str) -> Checkpoint:
    """The newest checkpoint in ``directory``. Raises ``FileNotFoundError`` if none."""
    ckpt = latest(directory)
    if ckpt is None:
        what = "does not exist" if not os.path.isdir(directory) else "holds no checkpoint"
        raise FileNotFoundError(
            f"cannot resume: {directory} {what} (expected ckpt-<round>.npz files written by "
            "a run with checkpoint_dir=, or ddlf-train run --checkpoint-every N --out DIR)")
    return ckpt


def compare_fingerprints(saved: dict, current: dict) -> list[str]:
    """What differs between a checkpoint's model/dataset fingerprint and this run's."""
    out = []
    for part in ("model", "dataset"):
        a, b = saved.get(part, {}), current.get(part, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out.append(f"{part} {key}: checkpoint has {_short(a.get(key))}, this run has "
                           f"{_short(b.get(key))}")
    return out


def _short(v) -> str:
    text = json.dumps(v)
    return text if len(text) <= 160 else text[:157] + "..."


class CheckpointWriter:
    """Writes checkpoints on a background thread, one at a time, in order.

    ``submit`` returns at once (after waiting for the previous write, which has had a
    whole round to finish); ``blocked_s`` is the time the training loop spent here, which
    is what checkpointing costs the run. ``write_s`` is the writer's own wall time and
    ``write_cpu_s`` its CPU time (the rest is waiting on the disk: ``fsync``); that CPU
    is what the writer takes from training. ``on_done(ckpt, path, perf_counter_when_done)``
    and ``on_error(exc)`` run on the caller's thread, at the next ``submit`` or at
    ``close``. A failed write does not stop the run: the previous checkpoint is whole.
    """

    def __init__(self, directory: str, keep: int = 2, on_done=None, on_error=None):
        self.directory = directory
        self.keep = keep
        self.on_done = on_done
        self.on_error = on_error
        self.blocked_s = 0.0
        self.write_s = 0.0
        self.write_cpu_s = 0.0
        self.written = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ddlf-ckpt")
        self._pending: concurrent.futures.Future | None = None

    def submit(self, ckpt: Checkpoint) -> None:
        t0 = time.perf_counter()
        self._settle()
        self._pending = self._pool.submit(self._write, ckpt)
        self.blocked_s += time.perf_counter() - t0

    def _write(self, ckpt: Checkpoint):
        t0, cpu0 = time.perf_counter(), time.thread_time()
        path = save(self.directory, ckpt, self.keep)
        done = time.perf_counter()
        self.write_s += done - t0
        self.write_cpu_s += time.thread_time() - cpu0
        self.written += 1
        return ckpt, path, done

    def _settle(self) -> None:
        fut, self._pending = self._pending, None
        if fut is None:
            return
        try:
            ckpt, path, done = fut.result()
        except Exception as e:
            if self.on_error is not None:
                self.on_error(e)
            return
        if self.on_done is not None:
            self.on_done(ckpt, path, done)

    def close(self) -> None:
        """Finish the last write (so a completed run's last checkpoint is on disk)."""
        t0 = time.perf_counter()
        try:
            self._settle()
        finally:
            self._pool.shutdown(wait=True)
            self.blocked_s += time.perf_counter() - t0
