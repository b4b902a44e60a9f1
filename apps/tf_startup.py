"""Import TensorFlow without its start-up noise on the driver's terminal.

What prints what (TensorFlow 2.21, tensorflow-cpu from PyPI), in each process that
imports TF (every trainer, whose stderr the node forwards to the driver, and the driver
itself when it builds ``result.model`` or writes TensorBoard logs):

* ``cpu_feature_guard.cc ... This TensorFlow binary is optimized to use ...``: TF's own
  logger, INFO. ``TF_CPP_MIN_LOG_LEVEL=1`` or more hides it.
* ``port.cc:153] oneDNN custom operations are on ...`` (INFO) and, before it, absl's
  ``WARNING: All log messages before absl::InitializeLog() is called are written to
  STDERR``: logged through absl while the shared libraries load. Two libraries of the
  wheel hold their own copy of absl and of that check (``libtensorflow_framework.so.2``
  and the profiler plugin), so both lines come twice. ``TF_CPP_MIN_LOG_LEVEL`` does not
  reach them (absl reads no environment variable for its level, and they are logged
  before any code could set it), nor does ``TF_ENABLE_ONEDNN_OPTS=1``; only
  ``TF_ENABLE_ONEDNN_OPTS=0`` does, by turning oneDNN off, which changes the numerics.
  DDLF leaves oneDNN on.

So :func:`quiet_startup` (and :func:`import_tensorflow`, which uses it) sets
``TF_CPP_MIN_LOG_LEVEL`` (default ``"2"``: errors only, unless already set) and applies
that same level to what is written to stderr while TF loads: fd 2 goes to a temporary
file meanwhile, then every line is written back except absl/TF log lines below the
level and absl's banner. Nothing else is dropped: what other threads wrote in that
window comes out late, not never, and if the block raises, all of it is shown.
``TF_CPP_MIN_LOG_LEVEL=0`` (``ddlf-train run --verbose``) shows everything.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

__all__ = ["LEVEL_ENV", "DEFAULT_LEVEL", "quiet_startup", "import_tensorflow",
           "filter_startup_lines"]

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "2"   # TF's meaning: 1 hides INFO, 2 also WARNING, 3 also ERROR

# absl's format ("I0000 00:00:1795547173.250856   12738 port.cc:153] ..."; before absl is
# initialised, the seconds are counted from the epoch) and TF's older one
# ("2025-09-17 14:44:05.157831: I external/.../cudart_stub.cc:32] ...").
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+\s+[^\]\s]+:\d+\] ")
_TSL_LINE = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) [^\]\s]+:\d+\] ")
_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}

_lock = threading.Lock()


def _level() -> int:
    try:
        return int(os.environ.get(LEVEL_ENV, "0"))
    except ValueError:   # TF reads a value it cannot parse as 0
        return 0


def filter_startup_lines(data: bytes, level: int) -> bytes:
    """``data`` without the log lines below ``level`` (0 INFO ... 3 FATAL) and absl's
    banner (when ``level`` hides anything). Only lines in a log format are dropped, never
    the lines after them: a multi-line message keeps its tail, but output that other
    threads wrote meanwhile is never taken for one. (The one multi-line start-up message,
    ``cpu_feature_guard``'s, is TF's own logger's and already hidden by the level.)"""
    if level <= 0:
        return data
    out = []
    for line in data.splitlines(keepends=True):
        m = _ABSL_LINE.match(line) or _TSL_LINE.match(line)
        if m is not None and _SEVERITY[m.group(1)] < level:
            continue
        if line.rstrip(b"\r\n") == _BANNER:
            continue   # one line, announcing the log lines that follow
        out.append(line)
    return b"".join(out)


@contextlib.contextmanager
def _stderr_to_file():
    """Point fd 2 at a temporary file; yield it; restore fd 2 (always)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield tmp
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def quiet_startup():
    """A block that may load TensorFlow (``import tensorflow``, a ``model_fn`` that
    imports keras): its start-up lines below ``TF_CPP_MIN_LOG_LEVEL`` (default 2) are
    kept off stderr, the rest of what the block writes to stderr comes out after it (all
    of it if the block raises). A no-op once TF is loaded, or at level 0."""
    if "tensorflow" in sys.modules:
        yield
        return
    os.environ.setdefault(LEVEL_ENV, DEFAULT_LEVEL)
    level = _level()
    if level <= 0:
        yield
        return
    with _lock:
        data = b""
        try:
            with _stderr_to_file() as captured:
                try:
                    yield
                finally:
                    captured.seek(0)
                    data = captured.read()
        except BaseException:
            _write_stderr(data)   # fd 2 is back: all of it, the reason may be in there
            raise
        _write_stderr(filter_startup_lines(data, level))


def import_tensorflow():
    """``import tensorflow`` inside :func:`quiet_startup`; return the module."""
    with quiet_startup():
        import tensorflow
    return tensorflow


def _write_stderr(data: bytes) -> None:
    while data:
        try:
            data = data[os.write(2, data):]
        except OSError:
            return
