"""CIFAR-10 in its "python version" format: pickled batches in ``cifar-10-batches-py/``.

Each of ``data_batch_1`` .. ``data_batch_5`` (training) and ``test_batch`` is a pickled
dict with ``b"data"``, a (N, 3072) uint8 array holding each image channel-first
(1024 red, 1024 green, 1024 blue values, rows of 32), and ``b"labels"``, N ints 0..9.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tarfile
import zlib

import numpy as np

from .atomic import atomic_write
from .errors import DatasetFormatError

__all__ = ["CIFAR10_BATCHES", "CIFAR10_DIRNAME", "find_cifar10", "read_cifar10",
           "read_cifar_batch", "extract_cifar10"]

CIFAR10_DIRNAME = "cifar-10-batches-py"  # the folder inside the official tarball
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = "test_batch"
CIFAR10_BATCHES = CIFAR10_TRAIN + (CIFAR10_TEST,)

# Unpickling runs code named in the file. The batches only need numpy's array
# reconstruction, so anything else (a tampered download) is refused.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),  # arrays at pickle protocol 5
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 writes bytes at protocol 2 (re-pickled batches)
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def find_cifar10(directory: str) -> str | None:
    """The directory holding all six batch files: ``directory`` itself or its
    ``cifar-10-batches-py`` subfolder; None if neither has them all."""
    for candidate in (directory, os.path.join(directory, CIFAR10_DIRNAME)):
        if all(os.path.isfile(os.path.join(candidate, b)) for b in CIFAR10_BATCHES):
            return candidate
    return None


def missing_cifar10(directory: str) -> list:
    """The batch file names absent from ``directory`` (for error messages)."""
    return [b for b in CIFAR10_BATCHES if not os.path.isfile(os.path.join(directory, b))]


def read_cifar_batch(path: str):
    """One batch file as ``(images, labels)``: uint8 (N, 32, 32, 3) NHWC and int64 (N,).

    Raises ``DatasetFormatError`` if the file is not a CIFAR-10 batch.
    """
    try:
        with open(path, "rb") as f:
            # encoding="bytes": the official files were pickled by Python 2.
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise DatasetFormatError(f"{path}: not a CIFAR-10 batch ({e})") from e
    if not isinstance(batch, dict):
        raise DatasetFormatError(f"{path}: not a CIFAR-10 batch (a {type(batch).__name__})")
    # Official files have bytes keys; accept str keys from batches re-pickled in Python 3.
    batch = {k.decode("latin-1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DatasetFormatError(f"{path}: CIFAR-10 batch lacks b'data' / b'labels'")
    data = np.asarray(batch["data"])
    try:
        labels = np.asarray(batch["labels"], dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise DatasetFormatError(f"{path}: b'labels' are not integers ({e})") from e
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DatasetFormatError(
            f"{path}: b'data' is {data.dtype} {data.shape}, expected uint8 (N, 3072)"
        )
    if labels.shape != (data.shape[0],):
        raise DatasetFormatError(
            f"{path}: {labels.shape[0]} labels for {data.shape[0]} images"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DatasetFormatError(f"{path}: labels outside 0..9")
    # Stored channel-first per image; Keras' Conv2D wants channels last (NHWC).
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def read_cifar10(directory: str):
    """All of CIFAR-10 from a ``cifar-10-batches-py`` directory (or its parent).

    Returns ``((x, y), (x_test, y_test))``: uint8 NHWC images (N, 32, 32, 3), int64
    labels; 50000 / 10000 for the real dataset. Not normalised (``load`` does that).
    Raises ``FileNotFoundError`` naming missing batches, ``DatasetFormatError`` for bad ones.
    """
    found = find_cifar10(directory)
    if found is None:
        raise FileNotFoundError(
            f"{directory}: no CIFAR-10 batches (missing {', '.join(missing_cifar10(directory))})"
        )
    train = [read_cifar_batch(os.path.join(found, b)) for b in CIFAR10_TRAIN]
    x = np.concatenate([images for images, _ in train])
    y = np.concatenate([labels for _, labels in train])
    x_test, y_test = read_cifar_batch(os.path.join(found, CIFAR10_TEST))
    return (x, y), (x_test, y_test)


def extract_cifar10(tar_path: str, dest: str) -> str:
    """Extract the batch files of the official tarball into ``dest/cifar-10-batches-py``.

    Only regular files directly inside ``cifar-10-batches-py/`` are written (never a
    path from the archive as is), each atomically. Returns that directory. Raises
    ``DatasetFormatError`` if the archive is unreadable or lacks a batch.
    """
    out_dir = os.path.join(dest, CIFAR10_DIRNAME)
    os.makedirs(out_dir, exist_ok=True)
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            for member in tar.getmembers():
                parent, base = os.path.split(member.name.lstrip("./"))
                if not member.isfile() or parent != CIFAR10_DIRNAME or base in ("", "..", "."):
                    continue
                src = tar.extractfile(member)
                if src is None:
                    continue
                with src, atomic_write(os.path.join(out_dir, base)) as out:
                    shutil.copyfileobj(src, out)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        # OSErrors (missing archive, full disk) pass through: they are not corruption.
        raise DatasetFormatError(f"{tar_path}: corrupt CIFAR-10 archive ({e})") from e
    missing = missing_cifar10(out_dir)
    if missing:
        raise DatasetFormatError(f"{tar_path}: archive lacks {', '.join(missing)}")
    return out_dir
