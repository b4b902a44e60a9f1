"""The two ways getting a dataset fails: it is nowhere to be found, or a file is corrupt."""

from __future__ import annotations

__all__ = ["DatasetNotFoundError", "DatasetFormatError"]


class DatasetNotFoundError(FileNotFoundError):
    """No copy of the dataset anywhere we looked, and fetching it failed too.

    The message lists every place tried (with why each failed) and how to get the files.
    A subclass of ``FileNotFoundError`` so ``except FileNotFoundError`` / ``OSError`` work.
    """


class DatasetFormatError(ValueError):
    """A dataset file exists but is not in the expected format (corrupt, truncated, wrong kind).

    The message names the file. We raise this rather than falling back to another copy:
    a silently skipped corrupt file would hide a real problem on that node.
    """
