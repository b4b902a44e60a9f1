"""The built-in datasets: which files make each one, where to download them, how to read them.

Pure description plus the readers; the lookup order lives in ``registry`` and the
network in ``fetch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import cifar
from .errors import DatasetFormatError, DatasetNotFoundError
from .idx import find_idx, idx_names, read_idx

__all__ = ["IdxSource", "CifarSource", "BUILTIN", "FORMAT_VERSION", "not_found_error"]

# Part of every array-cache key: bump it when what ``load`` returns changes (e.g. the
# normalisation), so nodes rebuild their caches instead of serving stale arrays.
FORMAT_VERSION = "v1"

# (stem, kind) of the four IDX files, in (x, y, x_test, y_test) order.
_MNIST_FILES = (
    ("train-images", "idx3-ubyte"),
    ("train-labels", "idx1-ubyte"),
    ("t10k-images", "idx3-ubyte"),
    ("t10k-labels", "idx1-ubyte"),
)


@dataclass(frozen=True)
class IdxSource:
    """MNIST-style dataset: four IDX files, downloadable from any of ``mirrors``."""

    name: str
    mirrors: tuple  # base URLs; a file's URL is base + "<stem>-<kind>.gz"
    apt_package: str | None = None  # Debian package shipping the .gz files, if any

    def download_names(self) -> list:
        """The canonical file names we download and cache (``train-images-idx3-ubyte.gz`` ...)."""
        return [idx_names(stem, kind)[0] for stem, kind in _MNIST_FILES]

    def probe(self, directory: str):
        """``(directory, "")`` if it holds all four files, else ``(None, why not)``."""
        missing = [f"{stem}-{kind}[.gz]" for stem, kind in _MNIST_FILES
                   if find_idx(directory, stem, kind) is None]
        if missing:
            return None, "missing " + ", ".join(missing)
        return directory, ""

    def files(self, directory: str) -> list:
        """The four files ``read(directory)`` reads, in (x, y, x_test, y_test) order.

        Raises ``DatasetNotFoundError`` if one is missing (``probe`` says which).
        """
        paths = [find_idx(directory, stem, kind) for stem, kind in _MNIST_FILES]
        if None in paths:
            raise DatasetNotFoundError(f"{directory}: {self.probe(directory)[1]}")
        return paths

    def read(self, directory: str):
        """``((x, y), (x_test, y_test))`` as uint8 (N, 28, 28, 1) images and int64 labels."""
        paths = self.files(directory)   # DatasetNotFoundError naming a missing one
        x, y, x_test, y_test = (read_idx(p) for p in paths)
        for images, labels, ip, lp in ((x, y, paths[0], paths[1]),
                                       (x_test, y_test, paths[2], paths[3])):
            if images.dtype != np.uint8 or images.ndim != 3:
                raise DatasetFormatError(f"{ip}: expected uint8 (N, rows, cols) images, "
                                         f"got {images.dtype} {images.shape}")
            if labels.ndim != 1 or len(labels) != len(images):
                raise DatasetFormatError(f"{lp}: {labels.shape} labels for "
                                         f"{len(images)} images in {ip}")
        # Keras' Conv2D wants a channel axis: (N, 28, 28) -> (N, 28, 28, 1).
        return ((x[..., None], y.astype(np.int64)),
                (x_test[..., None], y_test.astype(np.int64)))


@dataclass(frozen=True)
class CifarSource:
    """CIFAR-10, python version: one tarball holding ``cifar-10-batches-py/``."""

    name: str
    url: str
    archive_name: str = "cifar-10-python.tar.gz"
    apt_package: str | None = None

    def probe(self, directory: str):
        found = cifar.find_cifar10(directory)
        if found is None:
            sub = os.path.join(directory, cifar.CIFAR10_DIRNAME)
            where = sub if os.path.isdir(sub) else directory
            return None, "missing " + ", ".join(cifar.missing_cifar10(where))
        return found, ""

    def files(self, directory: str) -> list:
        """The six batch files ``read(directory)`` reads (``directory`` as ``probe`` returns
        it). Raises ``DatasetNotFoundError`` if one is missing."""
        missing = cifar.missing_cifar10(directory)
        if missing:
            raise DatasetNotFoundError(f"{directory}: missing {', '.join(missing)}")
        return [os.path.join(directory, b) for b in cifar.CIFAR10_BATCHES]

    def read(self, directory: str):
        return cifar.read_cifar10(directory)


BUILTIN: dict[str, IdxSource | CifarSource] = {
    "fashion-mnist": IdxSource(
        "fashion-mnist",
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        apt_package="dataset-fashion-mnist",
    ),
    "mnist": IdxSource(
        "mnist",
        mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/",
                 "https://storage.googleapis.com/cvdf-datasets/mnist/"),
    ),
    "cifar10": CifarSource(
        "cifar10", url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    ),
}


def _howto(name: str) -> list:
    """Ways for a person to get ``name`` onto this node, most direct first."""
    fetch = (f"ddlf-train fetch {name}   (or: python -c \"from ddlf_actors.apps import "
             f"datasets; datasets.fetch('{name}')\") on a machine with internet; it fills "
             f"~/.cache/ddlf/{name} (or $DDLF_CACHE_DIR/{name}), which you can copy to other nodes")
    source = BUILTIN.get(name)
    lines = [fetch]
    if isinstance(source, IdxSource):
        files = ", ".join(source.download_names())
        if source.apt_package:
            pkg = source.apt_package
            lines.append(
                f"apt-get download {pkg} && dpkg-deb -x {pkg}_*.deb x && "
                f"export DDLF_DATA_DIR=$PWD/x/usr/share/datasets/{name}   (no root needed; "
                f"or, as root, apt-get install {pkg} puts it in /usr/share/datasets/{name})"
            )
        lines.append(f"put the 4 IDX files ({files}, gzipped or not) in $DDLF_DATA_DIR "
                     f"or $DDLF_DATA_DIR/{name}")
    elif isinstance(source, CifarSource):
        lines.append(f"download {source.url}, extract it and put the "
                     f"{cifar.CIFAR10_DIRNAME} folder in $DDLF_DATA_DIR or $DDLF_DATA_DIR/{name}")
    return lines


def not_found_error(name: str, tried: list) -> DatasetNotFoundError:
    """The error for "``name`` is nowhere": every place tried (with why) and how to get it."""
    lines = [f"dataset {name!r} not found. Tried, in order:"]
    lines += [f"  - {t}" for t in tried]
    lines.append("To get it, do one of:")
    lines += [f"  - {h}" for h in _howto(name)]
    return DatasetNotFoundError("\n".join(lines))
