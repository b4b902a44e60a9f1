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

A GPU build of TensorFlow (the ``tensorflow`` package, not ``tensorflow-cpu``; pip
installs it beside PyTorch's CUDA wheels as often as not) on a host without a usable
CUDA driver logs, at ERROR level, when it first sets up its devices (the first op or
``tf.config.list_physical_devices``, after the import):

    E0000 00:00:1795734627.465977   22432 cuda_platform.cc:52] failed call to cuInit:
    INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)

(303: no ``libcuda.so.1``; ``CUDA_ERROR_NO_DEVICE`` where the driver is there but no GPU
is visible). It is not an error for a run that trains on the CPU, and each trainer
printed it to the driver's terminal. So :func:`import_tensorflow` also sets up TF's
devices inside the quiet window (``list_physical_devices`` is cheap and leaves the
thread pools settable), and at any level above 0 a ``failed call to cuInit`` line is kept
off stderr and remembered instead: :func:`cuda_failure` gives its reason, for the driver
to say once for the run (:func:`gpu_note`), not once per process.
:func:`hide_gpus_unless_requested` keeps GPUs away from a trainer that asked for none.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

__all__ = ["LEVEL_ENV", "DEFAULT_LEVEL", "quiet_startup", "import_tensorflow",
           "filter_startup_lines", "split_cuda_failure", "cuda_failure", "gpu_note",
           "hide_gpus_unless_requested"]

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "2"   # TF's meaning: 1 hides INFO, 2 also WARNING, 3 also ERROR

# absl's format ("I0000 00:00:1795547173.250856   12738 port.cc:153] ..."; before absl is
# initialised, the seconds are counted from the epoch) and TF's older one
# ("2025-09-17 14:44:05.157831: I external/.../cudart_stub.cc:32] ...").
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+\s+[^\]\s]+:\d+\] ")
_TSL_LINE = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) [^\]\s]+:\d+\] ")
_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
_CUINIT = b"failed call to cuInit"

_lock = threading.Lock()
_cuda_failure: str | None = None   # what TF said when CUDA would not start, in this process


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
        global _cuda_failure
        data, reason = split_cuda_failure(data)
        if reason is not None:
            _cuda_failure = reason
        _write_stderr(filter_startup_lines(data, level))


def import_tensorflow():
    """``import tensorflow`` and the set-up of its devices inside :func:`quiet_startup`;
    return the module. The thread pools can still be set afterwards (no op has run)."""
    with quiet_startup():
        import tensorflow

        # Where a GPU build looks for CUDA and, without a driver, logs its failure:
        # inside the window, so that line is kept off the terminal too.
        tensorflow.config.list_physical_devices()
    return tensorflow


def split_cuda_failure(data: bytes) -> tuple[bytes, str | None]:
    """``(data without TF's "failed call to cuInit" log lines, the reason of the last one
    or None)``. The reason is the text after ``failed call to cuInit:``, e.g. ``"INTERNAL:
    CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"``. Only lines in a TF/absl
    log format are taken."""
    out, reason = [], None
    for line in data.splitlines(keepends=True):
        if (_CUINIT in line) and (_ABSL_LINE.match(line) or _TSL_LINE.match(line)):
            tail = line.split(_CUINIT, 1)[1].strip().lstrip(b":").strip()
            reason = tail.decode("utf-8", "replace") or "no reason given"
            continue
        out.append(line)
    return b"".join(out), reason


def cuda_failure() -> str | None:
    """Why TensorFlow could not start CUDA in this process (the hidden ``failed call to
    cuInit`` line's reason), or None if it did not say so (a CPU-only build, or a GPU)."""
    return _cuda_failure


def gpu_note(num_gpus: float, failures) -> str | None:
    """The one line a driver prints for a run whose trainers reported ``failures`` (each
    trainer's :func:`cuda_failure`), or None when there is nothing to say.

    With ``num_gpus`` 0 a failure is expected (the trainer asked for no GPU, and
    :func:`hide_gpus_unless_requested` hid them): the line says the run trains on the
    CPU. With ``num_gpus`` > 0 it says that GPUs were asked for but CUDA did not start,
    with TF's reason: those trainers train on the CPU, slowly."""
    reasons = sorted({f for f in failures if f})
    if not reasons:
        return None
    if not num_gpus:
        return ("trainers run on the CPU: no GPU requested (num_gpus=0); TensorFlow's "
                "CUDA start-up message is hidden (--verbose shows it)")
    return (f"num_gpus={num_gpus:g}, but TensorFlow could not start CUDA on "
            f"{'a trainer' if len(reasons) == 1 else 'trainers'} ({'; '.join(reasons)}): "
            "they train on the CPU. Check the GPU driver (nvidia-smi) on those hosts")


def hide_gpus_unless_requested(num_gpus: float) -> None:
    """In a trainer that asked for no GPU, ``CUDA_VISIBLE_DEVICES=""`` before a framework
    starts, unless the variable is set already (the node sets it for a trainer it gave
    GPUs to). On a host with GPUs, TensorFlow would otherwise claim every GPU's memory
    from every trainer, and torch would start a CUDA context if asked. Call it before
    TensorFlow, torch or JAX is imported."""
    if not num_gpus and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _write_stderr(data: bytes) -> None:
    while data:
        try:
            data = data[os.write(2, data):]
        except OSError:
            return
