"""One copy of a dataset per node: normalised arrays as ``.npy`` files, memory-mapped.

Every trainer process on a host that calls ``load_shared`` for the same dataset maps
the same files read-only, so the kernel keeps one copy in the page cache and no
process holds a private one (their USS does not count it). Without this, K trainers
on a node would each hold the full float32 dataset (190 MB for Fashion-MNIST).

Layout under ``<cache>/arrays/`` (``<cache>`` = ``$DDLF_CACHE_DIR`` or ``~/.cache/ddlf``)::

    <key>/meta.json, x.npy, y.npy, ...   a finished entry (appears atomically)
    .<key>.lock                          flock'ed by the one process building <key>
    .<key>.tmp-<pid>-<rand>/             an entry being built (renamed to <key>)
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import warnings
from typing import Callable

import numpy as np

from . import registry
from .atomic import temp_name
from .partitions import Partition, PartitionedDataset
from .paths import cache_root

__all__ = ["load_shared", "SHM_DIR"]

# The fallback when the cache directory is not writable: tmpfs is shared memory too,
# so processes still share one copy (but it cannot be evicted, hence the warning).
SHM_DIR = "/dev/shm"

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENTRY_FORMAT = 1


def load_shared(dataset, *, data_dir: str | None = None, key: str | None = None):
    """``((x, y), (x_test, y_test))`` like ``load``, as read-only ``numpy.memmap`` arrays
    of a node-local cache, so all processes on a host share one copy.

    ``dataset`` is one of:

    - a dataset name (``"fashion-mnist"`` or a registered one; ``data_dir`` is passed
      to ``load`` when the cache is built). Key: name + format/registration version.
    - a callable returning ``((x, y), (x_test, y_test))``. Key: sha256 of its
      cloudpickle; for a module-level function that is its qualified name, so pass
      ``key=`` (or rename) when its output changes.
    - a partition, ``ds.partition(k)`` or ``(ds, k)`` for a ``PartitionedDataset``.
      Key: the part file's path, size and mtime. The test set is cached once, apart
      from the partitions, and is ``(None, None)`` when the directory has no test.npz.

    The first caller builds the entry (under an exclusive ``flock``, written to a temp
    directory then renamed), the rest wait for it and map it. If the cache directory is
    not writable, falls back to ``/dev/shm`` and then to a private read-only in-memory
    copy, each with a ``RuntimeWarning``.

    Raises ``TypeError`` for an unsupported ``dataset``, and whatever building raises
    (``ValueError`` for an unknown name, ``DatasetNotFoundError``, ...).
    """
    if isinstance(dataset, tuple) and len(dataset) == 2 and isinstance(dataset[0], PartitionedDataset):
        dataset = dataset[0].partition(dataset[1])
    if not isinstance(dataset, str) and data_dir is not None:
        raise TypeError("data_dir= applies to dataset names only")
    if isinstance(dataset, Partition):
        if key is not None:
            raise TypeError("key= is not supported for partitions (their key tracks the files)")
        return _shared_partition(dataset)
    if isinstance(dataset, PartitionedDataset):
        raise TypeError("load_shared needs one partition: pass ds.partition(k) or (ds, k)")
    if isinstance(dataset, str):
        auto_key = registry.cache_key(dataset)  # ValueError for an unknown name
        name = dataset

        def build():
            return _named_four(registry.load(name, data_dir=data_dir), name)
    elif callable(dataset):
        auto_key = "fn-" + registry.callable_digest(dataset)[:32]
        fn = dataset

        def build():
            return _named_four(fn(), getattr(fn, "__qualname__", repr(fn)))
    else:
        raise TypeError(
            "load_shared takes a dataset name, a callable returning ((x, y), (x_test, y_test)) "
            f"or a partition (ds.partition(k)); got {type(dataset).__name__}"
        )
    if key is not None and not _KEY_RE.match(key):
        raise ValueError(f"key {key!r} must be letters, digits, '.', '_', '-'")
    arrays = _shared(key or auto_key, build)
    return (arrays["x"], arrays["y"]), (arrays["x_test"], arrays["y_test"])


def _shared_partition(part: Partition):
    # Two entries, not one: every partition on a node shares the same test set, so
    # caching it inside each partition's entry would store it once per trainer.
    ds = part.dataset
    train = _shared(_file_key("part", ds.part_path(part.index)),
                    lambda: _named_pair(ds.load_partition(part.index)))
    if not ds.has_test:
        return (train["x"], train["y"]), (None, None)
    test = _shared(_file_key("test", ds.test_path), lambda: _named_pair(ds.load_test()))
    return (train["x"], train["y"]), (test["x"], test["y"])


def _shared(key: str, build: Callable[[], dict]) -> dict:
    """The arrays of cache entry ``key`` (name -> read-only memmap), building it if needed."""
    primary = cache_root()
    shm = os.path.join(SHM_DIR, f"ddlf-{os.getuid()}")
    for root in (primary, shm):
        arrays_dir = os.path.join(root, "arrays")
        entry = os.path.join(arrays_dir, key)
        mapped = _map_entry(entry)  # the common case: built already, no lock needed
        if mapped is not None:
            return mapped
        try:
            os.makedirs(arrays_dir, exist_ok=True)
            lock_fd = os.open(os.path.join(arrays_dir, f".{key}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            warnings.warn(f"dataset cache {arrays_dir} is not writable ({e}); "
                          + ("trying " + shm if root == primary else "using a private copy"),
                          RuntimeWarning, stacklevel=3)
            continue
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # waits while another process builds it
            mapped = _map_entry(entry)  # it may have been built while we waited
            if mapped is not None:
                return mapped
            _clear_leftovers(arrays_dir, key)
            arrays = build()
            try:
                _write_entry(entry, key, arrays)
            except OSError as e:  # e.g. disk full: we have the data, so hand it out
                warnings.warn(f"could not write dataset cache {entry} ({e}); using a private copy",
                              RuntimeWarning, stacklevel=3)
                return _read_only(arrays)
            mapped = _map_entry(entry)
            if mapped is None:
                raise RuntimeError(f"dataset cache entry {entry} unreadable right after writing it")
            return mapped
        finally:
            os.close(lock_fd)  # releases the flock
    return _read_only(build())


def _map_entry(entry: str) -> dict | None:
    """Map a finished entry, or None if it is absent or damaged (then it gets rebuilt)."""
    try:
        with open(os.path.join(entry, "meta.json")) as f:
            meta = json.load(f)
        if meta.get("format") != _ENTRY_FORMAT:
            return None
        out = {}
        for name, info in meta["arrays"].items():
            arr = np.load(os.path.join(entry, name + ".npy"), mmap_mode="r", allow_pickle=False)
            if list(arr.shape) != info["shape"] or arr.dtype.str != info["dtype"]:
                return None
            out[name] = arr
        return out
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_entry(entry: str, key: str, arrays: dict) -> None:
    tmp = temp_name(entry)
    os.mkdir(tmp)
    try:
        meta = {"format": _ENTRY_FORMAT, "key": key, "arrays": {}}
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            np.save(os.path.join(tmp, name + ".npy"), arr, allow_pickle=False)
            meta["arrays"][name] = {"shape": list(arr.shape), "dtype": arr.dtype.str}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        # A damaged old entry (we hold the lock and could not map it) makes way.
        if os.path.lexists(entry):
            shutil.rmtree(entry)
        os.rename(tmp, entry)  # atomic: readers see no entry or a whole one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _clear_leftovers(arrays_dir: str, key: str) -> None:
    """Remove temp dirs of builders of ``key`` that crashed (we hold its lock, so no one
    else is writing them)."""
    for path in glob.glob(os.path.join(glob.escape(arrays_dir), f".{glob.escape(key)}.tmp-*")):
        shutil.rmtree(path, ignore_errors=True)


def _file_key(prefix: str, path: str) -> str:
    """A key that changes when the file is rewritten (path, size, mtime)."""
    st = os.stat(path)
    ident = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    return f"{prefix}-{hashlib.sha256(ident.encode()).hexdigest()[:32]}"


def _named_pair(xy) -> dict:
    x, y = xy
    return {"x": np.asarray(x), "y": np.asarray(y)}


def _named_four(data, what: str) -> dict:
    try:
        (x, y), (x_test, y_test) = data
    except (TypeError, ValueError):
        raise TypeError(f"{what} must return ((x, y), (x_test, y_test)), "
                        f"got {type(data).__name__}") from None
    arrays = {"x": x, "y": y, "x_test": x_test, "y_test": y_test}
    for name, arr in arrays.items():
        arrays[name] = np.asarray(arr)
        if arrays[name].dtype == object:
            raise TypeError(f"{what}: {name} is not a numeric array")
    return arrays


def _read_only(arrays: dict) -> dict:
    out = {}
    for name, arr in arrays.items():
        arr = np.array(arr)  # own the memory, then freeze it like the mapped arrays
        arr.flags.writeable = False
        out[name] = arr
    return out


