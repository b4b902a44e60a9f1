"""Linux inotify through ctypes: one descriptor that becomes readable when files in a
watched folder are written, so a reader sleeps until there is something to read.

``Watch(path)`` raises ``OSError`` where inotify is missing (another OS) or refused (the
per-user limit of instances, ``fs.inotify.max_user_instances``); callers fall back to
polling then.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys

__all__ = ["Watch", "IN_MODIFY", "IN_Q_OVERFLOW"]

IN_MODIFY = 0x00000002       # a file in the folder was written
IN_Q_OVERFLOW = 0x00004000   # the kernel dropped events: anything may have changed
# Each event is wd (int), mask, cookie, len (uint32s), then len bytes of NUL-padded name.
# An overflow event: watch descriptor -1, mask IN_Q_OVERFLOW (names never hold 0xff bytes).
_OVERFLOW = struct.pack("iI", -1, IN_Q_OVERFLOW)

_libc = None


def _lib():
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            raise OSError("inotify is Linux only")
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


class Watch:
    """A non-blocking inotify descriptor watching one folder for ``mask`` events."""

    def __init__(self, path: str, mask: int = IN_MODIFY):
        libc = _lib()
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        if libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch({path!r}): {os.strerror(err)}")
        self.fd = fd

    def read(self) -> tuple[list, bool]:
        """The raw events read since the last call (bytes, possibly several reads), and
        whether events were lost (then treat every file as changed). Never blocks.

        Events are left unparsed: a folder written a few thousand times a second gives
        as many events, and :func:`names` finds what a caller needs in one C-level scan.
        """
        chunks = []
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data)
        return chunks, any(_OVERFLOW in c for c in chunks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
