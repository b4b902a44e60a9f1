"""Write a file so that readers see either nothing or the whole file.

Several processes on a node may fetch or build the same file at once, and a crash
mid-write must not leave a half file that a later run mistakes for a good one. So we
write to a unique temporary name in the same directory and ``os.replace`` it into
place, which is atomic on POSIX file systems.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import IO, Iterator

__all__ = ["atomic_write", "temp_name"]


def temp_name(path: str) -> str:
    """A hidden, unique sibling name for ``path`` (same directory, so rename is atomic)."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[IO[bytes]]:
    """Yield a binary file; on a clean exit it replaces ``path``, on an error it is deleted.

    Opened with ``open(..., "xb")`` rather than ``mkstemp`` so the file gets the usual
    umask-based permissions (mkstemp would make shared cache files owner-only).
    """
    tmp = temp_name(path)
    try:
        with open(tmp, "xb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
