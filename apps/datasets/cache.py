"""One copy of a dataset per node: normalised arrays as ``.npy`` files, memory-mapped.

Every trainer process on a host that calls ``load_shared`` for the same dataset maps
the same files read-only, so the kernel keeps one copy in the page cache and no
process holds a private one (their USS does not count it). Without this, K trainers
on a node would each hold the full float32 dataset (190 MB for Fashion-MNIST).

Layout under ``<cache>/arrays/`` (``<cache>`` = ``$DDLF_CACHE_DIR`` or ``~/.cache/ddlf``)::

    <family>-<stamp>/meta.json, x.npy, ...  a finished entry (appears atomically)
    .<family>.lock                          flock'ed by the one process building in it
    .<family>-<stamp>.tmp-<pid>-<rand>/     an entry being built (renamed into place)

An entry is named by what it was built from (``identity`` has the parts). The *family*
is where the data comes from and stays put when the data changes: the files a dataset
name resolves to, a callable's pickle, a partition file's path. The *stamp* is what
that source holds now: the files' sizes and times, the code the callable runs. So a
changed source gets a new entry, never the old arrays.

An entry whose family has a newer stamp can never be asked for again, so the builder of
the new stamp removes it (and leftovers of crashed builders) under the family's lock.
A process may still have the old entry mapped: that is safe on a local file system or
tmpfs, where an unlinked file lives on until its last map is gone. (On a cache shared
over NFS, a trainer on *another* host mapping a removed entry could fault; keep
``$DDLF_CACHE_DIR`` node-local.) Entries of sources that no longer exist at all (a
deleted directory, a deleted function) are not found by this and stay until removed by
hand; ``rm -r <cache>/arrays`` is safe while no run is starting.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import registry
from .atomic import temp_name
from .identity import code_stamp, declared_files, digest, files_stamp, pickled_digest
from .partitions import Partition, PartitionedDataset
from .paths import cache_root
from .sources import BUILTIN, FORMAT_VERSION

__all__ = ["load_shared", "SHM_DIR"]

# The fallback when the cache directory is not writable: tmpfs is shared memory too,
# so processes still share one copy (but it cannot be evicted, hence the warning).
SHM_DIR = "/dev/shm"

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENTRY_FORMAT = 1
_HEX = 16  # hex digits of a family's digest and of a stamp


@dataclass(frozen=True)
class _Key:
    """A cache entry's name: ``<family>-<stamp>``, or an explicit ``key=`` (no stamp)."""

    family: str
    stamp: str | None = None

    @property
    def name(self) -> str:
        return self.family if self.stamp is None else f"{self.family}-{self.stamp}"


def _key(label: str, where: list, stamp: list) -> _Key:
    return _Key(f"{label}-{digest(*where)[:_HEX]}", digest(*stamp)[:_HEX])


def load_shared(dataset, *, data_dir: str | None = None, key: str | None = None):
    """``((x, y), (x_test, y_test))`` like ``load``, as read-only ``numpy.memmap`` arrays
    of a node-local cache, so all processes on a host share one copy.

    ``dataset`` is one of the following; each entry of the cache is keyed by what it is
    built from, so a changed source gets a new entry and never the old arrays:

    - a built-in name (``"fashion-mnist"``, ``"mnist"``, ``"cifar10"``): found as
      ``load`` finds it (``data_dir``, ``$DDLF_DATA_DIR``, the cache, the system copy,
      else fetched first). Key: the paths, sizes, mtimes, ctimes and inode numbers of
      the files found, and the format version. Finding them costs ``stat`` calls, not a
      read; when the node has no copy, the key is made after fetching one.
    - a registered name (``register``; ``data_dir`` is passed to its loader). Key: the
      ``data_dir``, and the ``version=`` given to ``register`` or else the loader as a
      callable is keyed (below).
    - a callable returning ``((x, y), (x_test, y_test))``. Key: sha256 of its
      cloudpickle (for a module-level function, its qualified name and a partial's
      arguments), the sha256 of the *source* of the modules its code is defined in
      (the same on every host, whatever path the module is imported from), its
      bytecode and the plain module-level values it reads (so a process running code
      older than the file does not file old data under the new source), and, if it has
      a ``source_files()`` method, the stat of the files that returns. Functions of
      other modules it calls, and data files it reads without naming them, are not
      seen: pass ``key=`` for those, and change it when the data changes.
    - a text dataset (``datasets.corpus``, ``datasets.text``): its tokens, keyed by its
      files' stat, the tokenizer and the splits, served as windows (``text_dataset.py``).
    - a partition, ``ds.partition(k)`` or ``(ds, k)`` for a ``PartitionedDataset``.
      Key: the part file's path, size and times. The test set is cached once, apart
      from the partitions, and is ``(None, None)`` when the directory has no test.npz.

    ``key=`` names the entry outright (letters, digits, ``.``, ``_``, ``-``). Building a
    new entry removes the entries its source superseded (see the module docstring).

    The first caller builds the entry (under an exclusive ``flock``, written to a temp
    directory then renamed), the rest wait for it and map it. If the cache directory is
    not writable, falls back to ``/dev/shm`` and then to a private read-only in-memory
    copy, each with a ``RuntimeWarning``.

    Raises ``TypeError`` for an unsupported ``dataset``, and whatever building raises
    (``ValueError`` for an unknown name, ``DatasetNotFoundError``, ...).
    """
    if callable(getattr(type(dataset), "load_shared", None)):
        # A dataset that serves itself from this cache (text_dataset.TextDataset: windows
        # of its tokens), named by its class rather than imported: it builds on this module.
        if key is not None or data_dir is not None:
            raise TypeError("key= and data_dir= do not apply to a dataset that serves itself "
                            "(a text dataset's source names its files: "
                            "datasets.corpus(name, data_dir=...))")
        return dataset.load_shared()
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
    if not (isinstance(dataset, str) or callable(dataset)):
        raise TypeError(
            "load_shared takes a dataset name, a callable returning ((x, y), (x_test, y_test)) "
            f"or a partition (ds.partition(k)); got {type(dataset).__name__}"
        )
    if key is not None and not _KEY_RE.match(key):
        raise ValueError(f"key {key!r} must be letters, digits, '.', '_', '-'")
    if isinstance(dataset, str):
        auto_key, build = _named(dataset, data_dir)
    else:
        auto_key = None if key is not None else _callable_key(dataset)
        fn = dataset

        def build():
            return _named_four(fn(), getattr(fn, "__qualname__", repr(fn)))
    arrays = _shared(_Key(key) if key is not None else auto_key, build)
    return (arrays["x"], arrays["y"]), (arrays["x_test"], arrays["y_test"])


def _named(name: str, data_dir: str | None):
    """``(key, build)`` for a dataset name. Raises ``ValueError`` for an unknown name, and
    what resolving raises (``DatasetNotFoundError`` when it is nowhere and cannot be
    fetched)."""
    reg = registry.registered(name)
    if reg is not None:
        where = [os.path.abspath(os.path.expanduser(data_dir)) if data_dir else ""]
        if reg.version is not None:
            stamp = ["version", reg.version]
        else:
            stamp = _callable_stamp(reg.loader, data_dir)
            stamp.insert(0, pickled_digest(reg.loader))
        return _key(name, where, stamp), \
            lambda: _named_four(registry.load(name, data_dir=data_dir), name)
    # The key must name the files the build reads: resolve once (stat calls, or a fetch
    # when the node has no copy yet, since only then are there files to name), key by
    # what was found and build from that same directory.
    directory = registry.resolve(name, data_dir)
    files = BUILTIN[name].files(directory)
    key = _key(name, [os.path.abspath(f) for f in files], [FORMAT_VERSION, files_stamp(files)])
    return key, lambda: _named_four(registry.read(name, directory), name)


def _callable_key(fn) -> _Key:
    return _key("fn", [pickled_digest(fn)], _callable_stamp(fn))


def _callable_stamp(fn, data_dir: str | None = None) -> list:
    # FORMAT_VERSION too: a callable may wrap ``load``, whose output it versions.
    return [FORMAT_VERSION, code_stamp(fn), files_stamp(declared_files(fn, data_dir))]


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


def _shared(key: _Key, build: Callable[[], dict]) -> dict:
    """The arrays of cache entry ``key`` (name -> read-only memmap), building it if needed."""
    primary = cache_root()
    shm = os.path.join(SHM_DIR, f"ddlf-{os.getuid()}")
    for root in (primary, shm):
        arrays_dir = os.path.join(root, "arrays")
        entry = os.path.join(arrays_dir, key.name)
        mapped = _map_entry(entry)  # the common case: built already, no lock needed
        if mapped is not None:
            return mapped
        try:
            os.makedirs(arrays_dir, exist_ok=True)
            lock = os.path.join(arrays_dir, f".{key.family}.lock")
            lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
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
            _clear_family(arrays_dir, key)  # before building: the disk may be needed
            arrays = build()
            try:
                _write_entry(entry, key.name, arrays)
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
        meta: dict[str, Any] = {"format": _ENTRY_FORMAT, "key": key, "arrays": {}}
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


def _clear_family(arrays_dir: str, key: _Key) -> None:
    """Remove what ``key``'s family left that no one can use (we hold the family's lock,
    so no one else is building in it): temp dirs of builders that crashed, and entries
    of other stamps, which the sources they were built from no longer match.

    A process that has a removed entry mapped keeps reading it: unlinking a file removes
    its name, while its pages stay until the last map of it is gone.
    """
    family = re.escape(key.family)
    stamp = f"-[0-9a-f]{{{_HEX}}}"
    leftover = re.compile(rf"^\.{family}(?:{stamp})?\.tmp-")
    superseded = re.compile(rf"^{family}{stamp}$")
    for name in os.listdir(arrays_dir):
        if leftover.match(name) or (key.stamp is not None and name != key.name
                                    and superseded.match(name)):
            shutil.rmtree(os.path.join(arrays_dir, name), ignore_errors=True)


def _file_key(label: str, path: str) -> _Key:
    """A key whose stamp changes when the file is rewritten (see ``files_stamp``)."""
    return _key(label, [os.path.abspath(path)], [files_stamp([path])])


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


