"""Interrupting a running sync task (``ddlf.cancel``), and ending the process at once
(``ddlf.cancel(force=True)``)."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

from ..context import CallContext
from ..states import CallState

__all__ = ["interrupt", "settle", "exit_now"]

log = logging.getLogger("ddlf.worker")

# Held while a cancel decides to interrupt a thread and while that thread marks its call
# done, so an interrupt never reaches the next call that thread runs.
_interrupt_lock = threading.Lock()
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
# The same C function, typed to pass NULL (clear) where py_object would pass None.
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


def interrupt(call: CallContext) -> None:
    """Raise KeyboardInterrupt in the thread running ``call``, as Ray does for a task.

    It lands at the thread's next Python instruction: a thread blocked in a C call
    (``time.sleep``, a socket read) sees it when that call returns.
    """
    with _interrupt_lock:
        if call.state is CallState.RUNNING and not call.interrupted:
            call.interrupted = True
            _set_async_exc(call.thread, KeyboardInterrupt)


def settle(call: CallContext) -> None:
    """On the call's own thread: mark it done, and withdraw an interrupt not yet raised.

    Lock-free unless cancelled: cancel() sets ``.cancelled`` before it reads ``.state``,
    so if we read ``.cancelled`` False after writing DONE, it will read DONE.
    """
    call.state = CallState.DONE
    if call.cancelled:
        with _interrupt_lock:   # waits out a cancel() that is sending the interrupt now
            if call.interrupted:
                _clear_async_exc(call.thread, None)


def exit_now(status: int) -> None:
    """ddlf.cancel(force=True) of a running task: end this worker, as Ray does."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception as e:
            # Whatever the stream (closed, or replaced by user code), the process must
            # reach os._exit: only unflushed output is lost.
            log.debug("flushing %r before exiting: %r", stream, e)
    os._exit(status)
