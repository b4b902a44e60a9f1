"""Datasets for DDLF training: MNIST, Fashion-MNIST and CIFAR-10 as normalised numpy arrays,
and text for language models.

    from ddlf_actors.apps import datasets
    (x, y), (x_test, y_test) = datasets.load("fashion-mnist")

- ``load`` finds a copy on this node (``$DDLF_DATA_DIR``, the cache, a system copy)
  or downloads one; ``fetch`` only downloads; ``source_files`` names the files ``load``
  would read.
- ``load_shared`` gives the same arrays as read-only memory maps of a node-local cache,
  so every trainer process on a host shares one copy. Its entries are keyed by what
  they were built from (``source_files``: the files ``load`` reads), so a changed
  source is never served from an old entry.
- ``partitioned`` / ``write_partitions``: a dataset pre-split into per-trainer files.
- ``read_idx`` / ``write_idx`` and ``read_cifar10``: the on-disk formats.
- ``corpus("fortunes")`` / ``text("corpus/*.txt")``: text as tokens stored once per node
  and served as windows by offset (``text_dataset.py``, ``tokenizer.py``, ``corpora.py``).

numpy and the standard library only (no TensorFlow), so importing this is cheap and
safe in a forked process.
"""

from . import download, tokenizer
from .cache import load_shared
from .cifar import read_cifar10
from .corpora import CORPORA, fetch_corpus
from .errors import DatasetFormatError, DatasetNotFoundError
from .idx import read_idx, write_idx
from .partitions import Partition, PartitionedDataset, partitioned, write_partitions
from .registry import ensure, load, locate, names, normalise_images, register, source_files
from .text_dataset import TextDataset, TokenWindows, corpus, text


def fetch(name: str, *, force: bool = False) -> str:
    """Download dataset ``name`` into ``<cache>/<name>`` and return that path: a built-in
    image dataset by ``download.fetch`` (its URLs, for Fashion-MNIST Debian's package), a
    text corpus (``"fortunes"``) from its Debian packages (``corpora.fetch_corpus``).
    Raises ``ValueError`` for another name, ``DatasetNotFoundError`` saying what failed."""
    if name in CORPORA:
        return fetch_corpus(name)
    return download.fetch(name, force=force)


__all__ = [
    "load",
    "locate",
    "source_files",
    "load_shared",
    "fetch",
    "ensure",
    "register",
    "names",
    "normalise_images",
    "read_idx",
    "write_idx",
    "read_cifar10",
    "partitioned",
    "write_partitions",
    "PartitionedDataset",
    "Partition",
    "DatasetNotFoundError",
    "DatasetFormatError",
    "TextDataset",
    "TokenWindows",
    "text",
    "corpus",
    "tokenizer",
]
