"""A dataset pre-split into K partition files, one per trainer (the DDLF paper's Figure 3.2).

Directory layout::

    part-00000.npz   arrays x (float32 NHWC, already normalised) and y (labels)
    part-00001.npz
    ...
    test.npz         optional: x and y of the test set

A ``PartitionedDataset`` stores only its path, so it pickles to a few bytes when it is
shipped to remote trainers; each one then reads just its own file. The path must
exist where the data is read (a shared file system, or the same path on every node).
"""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass

import numpy as np

from .atomic import atomic_write
from .errors import DatasetFormatError

__all__ = ["PartitionedDataset", "Partition", "partitioned", "write_partitions"]

_PART_RE = re.compile(r"^part-(\d{5,})\.npz$")
TEST_FILE = "test.npz"


def part_name(k: int) -> str:
    return f"part-{k:05d}.npz"


class PartitionedDataset:
    """A directory of ``part-NNNNN.npz`` files (see the module docstring).

    Nothing is read on construction (the directory may exist only on the nodes that
    train); errors surface when a property or loader first touches the files.
    """

    def __init__(self, path):
        self._path = os.path.abspath(os.fspath(path))

    @property
    def path(self) -> str:
        """The absolute directory path."""
        return self._path

    @property
    def num_partitions(self) -> int:
        """K, the number of partition files. Raises as ``part_files`` does."""
        return len(self.part_files())

    @property
    def test_path(self) -> str:
        """Where the test set is (or would be): ``<path>/test.npz``."""
        return os.path.join(self._path, TEST_FILE)

    @property
    def has_test(self) -> bool:
        """True if the directory holds ``test.npz``."""
        return os.path.isfile(self.test_path)

    def part_files(self) -> list:
        """Paths of ``part-00000.npz`` .. ``part-<K-1>.npz`` in order.

        Raises ``FileNotFoundError`` if the directory is missing or has no part files,
        ``DatasetFormatError`` if the numbering has a gap (a file went missing).
        """
        if not os.path.isdir(self._path):
            raise FileNotFoundError(f"partitioned dataset directory {self._path} does not exist")
        indices = sorted(int(m.group(1)) for m in map(_PART_RE.match, os.listdir(self._path)) if m)
        if not indices:
            raise FileNotFoundError(
                f"{self._path} has no partition files (expected part-00000.npz, part-00001.npz, "
                "...; write them with datasets.write_partitions)"
            )
        if indices != list(range(len(indices))):
            gaps = sorted(set(range(indices[-1] + 1)) - set(indices))
            raise DatasetFormatError(
                f"{self._path}: partition files are not numbered 0..K-1; missing "
                + ", ".join(part_name(k) for k in gaps[:5])
            )
        return [os.path.join(self._path, part_name(k)) for k in indices]

    def part_path(self, k: int) -> str:
        """The file of partition ``k``. Raises ``IndexError`` if ``k`` is out of range."""
        k = _index(k)
        files = self.part_files()
        if not 0 <= k < len(files):
            raise IndexError(
                f"partition {k} out of range: {self._path} has {len(files)} partitions "
                f"(0..{len(files) - 1})"
            )
        return files[k]

    def load_partition(self, k: int):
        """``(x, y)`` of partition ``k``, reading only that file.

        Raises ``IndexError`` for a bad ``k``, ``FileNotFoundError`` / ``DatasetFormatError``
        as ``part_files`` does or if the file lacks ``x`` / ``y``.
        """
        return _read_xy(self.part_path(k))

    def load_test(self):
        """``(x_test, y_test)`` from ``test.npz``. Raises ``FileNotFoundError`` if absent."""
        if not self.has_test:
            raise FileNotFoundError(f"{self._path} has no {TEST_FILE} (no test set was written)")
        return _read_xy(self.test_path)

    def partition(self, k: int) -> Partition:
        """A picklable handle on partition ``k`` (for ``load_shared``). Checks ``k`` now."""
        self.part_path(k)
        return Partition(self, _index(k))

    def __len__(self) -> int:
        return self.num_partitions

    def __eq__(self, other) -> bool:
        return isinstance(other, PartitionedDataset) and other._path == self._path

    def __hash__(self) -> int:
        return hash(self._path)

    def __repr__(self) -> str:
        return f"PartitionedDataset({self._path!r})"


@dataclass(frozen=True)
class Partition:
    """Partition ``index`` of ``dataset``; what ``load_shared`` takes for one trainer's share."""

    dataset: PartitionedDataset
    index: int

    def load(self):
        """``((x, y), (x_test, y_test))``; the test pair is ``(None, None)`` without test.npz."""
        train = self.dataset.load_partition(self.index)
        test = self.dataset.load_test() if self.dataset.has_test else (None, None)
        return train, test


def partitioned(path) -> PartitionedDataset:
    """A ``PartitionedDataset`` for directory ``path`` (not read until used)."""
    return PartitionedDataset(path)


def write_partitions(path, x, y, k: int, x_test=None, y_test=None, *,
                     overwrite: bool = False) -> PartitionedDataset:
    """Split ``x``, ``y`` into ``k`` contiguous files under ``path`` and return the dataset.

    Sizes differ by at most one (``numpy.array_split``); shuffle first if the order is
    sorted by class. ``x_test`` / ``y_test`` (both or neither) go to ``test.npz``.
    Arrays are stored as given (normalise them first, e.g. with ``normalise_images``).

    Raises ``ValueError`` for mismatched lengths or ``k`` outside 1..len(x), and
    ``FileExistsError`` if ``path`` already holds partition files, unless ``overwrite``
    (then the old part files and test.npz are removed first, so K stays right).
    """
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
    k = _index(k)
    if not 1 <= k <= len(x):
        raise ValueError(f"k must be in 1..{len(x)} (one row per partition at least), got {k}")
    if (x_test is None) != (y_test is None):
        raise ValueError("pass both x_test and y_test, or neither")
    if x_test is not None and len(x_test) != len(y_test):
        raise ValueError(f"x_test has {len(x_test)} rows but y_test has {len(y_test)}")
    path = os.path.abspath(os.fspath(path))
    os.makedirs(path, exist_ok=True)
    old = [f for f in os.listdir(path) if _PART_RE.match(f) or f == TEST_FILE]
    if old and not overwrite:
        raise FileExistsError(f"{path} already holds {len(old)} partition file(s); "
                              "pass overwrite=True to replace them")
    for f in old:
        os.unlink(os.path.join(path, f))
    for i, (xs, ys) in enumerate(zip(np.array_split(x, k), np.array_split(y, k))):
        _write_xy(os.path.join(path, part_name(i)), xs, ys)
    if x_test is not None:
        _write_xy(os.path.join(path, TEST_FILE), np.asarray(x_test), np.asarray(y_test))
    return PartitionedDataset(path)


def _index(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"partition index must be an int, got {type(k).__name__}")
    return int(k)


def _write_xy(path: str, x: np.ndarray, y: np.ndarray) -> None:
    # Uncompressed: float pixels barely compress, and np.load then reads at disk speed.
    with atomic_write(path) as f:
        np.savez(f, x=x, y=y)


def _read_xy(path: str):
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "x" not in npz.files or "y" not in npz.files:
                raise DatasetFormatError(f"{path}: has arrays {npz.files}, expected x and y")
            x, y = npz["x"], npz["y"]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, (DatasetFormatError, FileNotFoundError)):
            raise
        raise DatasetFormatError(f"{path}: not a readable .npz file ({e})") from e
    if len(x) != len(y):
        raise DatasetFormatError(f"{path}: x has {len(x)} rows but y has {len(y)}")
    return x, y
