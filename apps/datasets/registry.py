"""Named datasets and where ``load`` looks for them, in order.

For a built-in name (``fashion-mnist``, ``mnist``, ``cifar10``) ``load`` tries:

1. the ``data_dir`` argument, else ``$DDLF_DATA_DIR``: first ``<dir>/<name>``, then the
   files directly in ``<dir>`` (unless ``<dir>`` is named for another built-in
   dataset). A person's own copy wins over anything automatic;
2. the cache ``<cache>/<name>`` (``$DDLF_CACHE_DIR`` or ``~/.cache/ddlf``);
3. a system-wide copy (``SYSTEM_DIRS``: Debian's ``dataset-fashion-mnist``);
4. ``fetch`` into the cache (official URLs, then for Fashion-MNIST the Debian package).

``resolve`` is that lookup alone: the directory ``load`` reads, fetched if need be.
``source_files`` names the files in it, which is how ``load_shared`` keys its cache.
``ensure`` runs the lookup before a run starts and fetches only what is missing.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .download import _fetch, fetch
from .errors import DatasetNotFoundError
from .paths import cache_root, data_dir_from_env
from .sources import BUILTIN, not_found_error

__all__ = ["load", "locate", "resolve", "read", "source_files", "ensure", "register",
           "registered", "Registered", "names", "normalise_images", "SYSTEM_DIRS"]

# Step 3 of the lookup. Tests point this at a temporary directory.
SYSTEM_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist",
               "fortunes": "/usr/share/games/fortunes"}   # a text corpus (corpora.py)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # it becomes a directory name


@dataclass(frozen=True)
class Registered:
    """A dataset added with ``register``: its loader and the caller's version, if given."""

    loader: Callable
    version: str | None


_REGISTERED: dict = {}


def names() -> list:
    """All dataset names ``load`` accepts, sorted: the built-ins plus registered ones."""
    return sorted(set(BUILTIN) | set(_REGISTERED))


def register(name: str, loader: Callable, *, version: str | None = None,
             overwrite: bool = False) -> None:
    """Make ``load(name)`` call ``loader()`` (``loader(data_dir=...)`` if a data_dir is given).

    ``loader`` must return ``((x, y), (x_test, y_test))``; ``load`` passes it through as
    is. ``load_shared`` keys its cache by the ``data_dir`` and, unless ``version`` is
    given, by the loader (its pickle, the source of the module it is defined in, and the
    files it names with a ``source_files()`` method, if it has one). ``version`` replaces
    the loader part: entries are then reused until the version changes, even if the
    loader's code does. Registration is per process (do it at import time of your module
    so remote workers have it too).

    Raises ``ValueError`` for a name that is taken (built-ins always; registered ones
    unless ``overwrite``) or unusable as a directory name, ``TypeError`` if ``loader``
    is not callable.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"dataset name {name!r} must be letters, digits, '.', '_', '-'")
    if not callable(loader):
        raise TypeError(f"loader for {name!r} must be callable, got {type(loader).__name__}")
    if name in BUILTIN or (name in _REGISTERED and not overwrite):
        raise ValueError(f"dataset {name!r} is already registered"
                         + ("" if name in BUILTIN else "; pass overwrite=True to replace it"))
    _REGISTERED[name] = Registered(loader, None if version is None else str(version))


def registered(name: str) -> Registered | None:
    """What ``register`` stored for ``name``, or None for a built-in or unknown name."""
    return _REGISTERED.get(name)


def load(name: str, data_dir: str | None = None, *, download: bool = True):
    """Load dataset ``name`` as ``((x, y), (x_test, y_test))``.

    For the built-ins: ``x`` float32 NHWC normalised as in the DDLF paper
    (``x / 255 - 0.5``, so in [-0.5, 0.5]), (N, 28, 28, 1) for MNIST / Fashion-MNIST
    and (N, 32, 32, 3) for CIFAR-10; ``y`` int64 of shape (N,) with classes 0..9.
    See the module docstring for where it looks; ``download=False`` skips step 4.

    Raises ``ValueError`` for an unknown name (the message lists the known ones),
    ``DatasetNotFoundError`` (a ``FileNotFoundError``) listing every place tried and how
    to get the files, ``DatasetFormatError`` if a copy exists but is corrupt (we stop
    rather than silently use another copy).
    """
    if name in _REGISTERED:
        loader = _REGISTERED[name].loader
        return loader() if data_dir is None else loader(data_dir=data_dir)
    if name not in BUILTIN:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(names())}")
    return read(name, resolve(name, data_dir, download=download))


def resolve(name: str, data_dir: str | None = None, *, download: bool = True) -> str:
    """The directory ``load(name, data_dir, download=download)`` reads built-in ``name``
    from: the first place in the lookup order that has it, else the cache after fetching.

    Only ``stat`` calls unless it has to fetch. Raises ``ValueError`` for a name that is
    not built in, ``DatasetNotFoundError`` as ``load`` does.
    """
    source = BUILTIN.get(name)
    if source is None:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(names())}")
    tried = []
    if data_dir is None and data_dir_from_env() is None:
        tried.append("$DDLF_DATA_DIR: not set")
    for directory, label in _places(name, data_dir):
        if not os.path.isdir(directory):
            tried.append(f"{directory} ({label}): no such directory")
            continue
        other = os.path.basename(directory)
        if other != name and other in BUILTIN:
            # e.g. $DDLF_DATA_DIR=.../fashion-mnist while loading "mnist": same file
            # names, different data, so never take one for the other.
            tried.append(f"{directory} ({label}): skipped, it is named for {other!r}")
            continue
        found, why = source.probe(directory)
        if found is not None:
            return found
        tried.append(f"{directory} ({label}): {why}")
    if not download:
        tried.append("download: skipped (download=False)")
        raise not_found_error(name, tried)
    path, fetch_tried = _fetch(name)
    tried += fetch_tried
    if path is None:
        raise not_found_error(name, tried)
    return source.probe(path)[0]


def read(name: str, directory: str):
    """Built-in ``name`` read from ``directory`` (as ``resolve`` returns it) and normalised,
    as ``load`` returns it. Raises ``DatasetFormatError`` for a corrupt file."""
    return _normalised(BUILTIN[name].read(directory))


def source_files(name: str, data_dir: str | None = None, *, download: bool = True) -> list:
    """The files ``load(name, data_dir)`` would read for built-in ``name``, fetching them
    first if this node has none (``download=False``: raise instead).

    A dataset callable that wraps ``load`` can return this from a ``source_files()``
    method, so ``load_shared`` notices when those files change. Raises as ``resolve``.
    """
    directory = resolve(name, data_dir, download=download)  # ValueError unless built in
    return BUILTIN[name].files(directory)


def locate(name: str, data_dir: str | None = None) -> str | None:
    """The directory ``load(name, data_dir, download=False)`` would read, or None.

    Useful to hand trainers an explicit ``data_dir`` when their environment (another
    ``DDLF_CACHE_DIR`` or ``HOME``) differs from the driver's.
    """
    if name not in BUILTIN:
        raise ValueError(f"locate() knows the built-in datasets only ({', '.join(BUILTIN)}), "
                         f"not {name!r}")
    try:
        return resolve(name, data_dir, download=False)
    except DatasetNotFoundError:
        return None


def ensure(name: str, data_dir: str | None = None) -> None:
    """Make sure dataset ``name`` is on this machine before trainers look for it.

    Without ``data_dir``: looks it up without downloading (``load``'s order) and, if it
    is missing, ``fetch``es it into the cache (URLs, then for Fashion-MNIST the Debian
    package). With ``data_dir``: the files must be there (or in ``data_dir/<name>``); a
    user who names a folder means that folder, so no other copy is silently used.
    Raises ``DatasetNotFoundError`` with how to get the files.
    """
    if data_dir is not None:
        base = os.path.abspath(os.path.expanduser(data_dir))
        found = locate(name, data_dir)
        if found is None or os.path.commonpath([base, os.path.abspath(found)]) != base:
            raise not_found_error(name, [f"{base} (the data_dir given): no {name} files"])
        return
    try:
        load(name, download=False)
    except DatasetNotFoundError:
        print(f"ddlf: {name} is not on this machine; fetching it ...", file=sys.stderr)
        fetch(name)


def normalise_images(images: np.ndarray) -> np.ndarray:
    """uint8 pixels -> float32 ``x / 255 - 0.5`` (the DDLF paper's scaling), a new array."""
    out = np.asarray(images).astype(np.float32)
    out /= np.float32(255)  # in place: the float copy of CIFAR's train set is 600 MB
    out -= np.float32(0.5)
    return out


def _places(name: str, data_dir: str | None, package: str | None = None):
    """(directory, label) pairs for lookup steps 1-3, in order (``package``: the Debian
    package of the system copy, when ``name`` is not a built-in that names its own)."""
    base: str | None
    if data_dir is not None:
        base, label = os.path.abspath(os.path.expanduser(data_dir)), "data_dir argument"
    else:
        base, label = data_dir_from_env(), "$DDLF_DATA_DIR"
    if base:
        # The subfolder first: it is unambiguous, while files directly in the folder
        # could be any MNIST-format dataset (fashion-mnist and mnist share file names).
        yield os.path.join(base, name), label
        yield base, label
    yield os.path.join(cache_root(), name), "cache"
    system = SYSTEM_DIRS.get(name)
    if system:
        package = BUILTIN[name].apt_package if name in BUILTIN else package
        yield system, f"system copy, Debian package {package}" if package else "system copy"


def _normalised(raw):
    (x, y), (x_test, y_test) = raw
    return (normalise_images(x), y), (normalise_images(x_test), y_test)
