"""A call's return value as the frame that carries it back (``RESULT_*``, runtime/wire/protocol.py).

Everything here is pure: a value in, ``(frame kind, segments)`` out. Sync calls encode on
their execution thread, so a large result is pickled off the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import sys

from ..client.object_store import PENDING, bundle_refs, dumps_with_refs
from ..errors import SerializationError
from ..wire import protocol
from ..wire.remote_error import encode_error

__all__ = ["encode", "encode_result", "encode_yielded", "as_iterator"]


def encode(value, nret, where: str, can_block: bool = True):
    """The reply to a call declared with ``num_returns=nret`` (an int) that returned
    ``value``; None when ``can_block`` is false and the value holds refs still pending."""
    if nret == 1:
        return encode_result(value, where, can_block)
    return _encode_returns(value, nret, where, can_block)


def encode_result(value, where: str, can_block: bool = True):
    """(frame kind, segments) for one return value; a value that cannot be pickled,
    whatever pickling raises, becomes a ``SerializationError`` reply.

    A value holding ObjectRefs carries their objects along (RESULT_REFS), so the refs
    outlive this worker. Refs still pending are waited for first; with ``can_block``
    false (on the event loop) that returns None instead, and the caller retries on a
    thread.
    """
    try:
        segs, refs = dumps_with_refs(value)
        if not refs:
            return protocol.RESULT_OK, segs
        pending = [r for r in refs if _is_pending(r)]
        if pending:
            if not can_block:
                return None
            for r in pending:
                r._core.wait([r], 1, None)
        return protocol.RESULT_REFS, bundle_refs(refs, segs)
    except SerializationError as e:
        return protocol.RESULT_ERR, encode_error(e, where)
    except BaseException as e:
        err = SerializationError(f"the return value of {where} could not be pickled: "
                                 f"{type(e).__name__}: {e}")
        return protocol.RESULT_ERR, encode_error(err, where)


def _encode_returns(value, nret: int, where: str, can_block: bool = True):
    """RESULT_MULTI for a call declared with ``num_returns=nret`` (> 1): each value is
    encoded on its own, so each of the caller's refs gets its own object (or error)."""
    try:
        items = list(value)
    except TypeError:
        items = None
    if items is None or len(items) != nret:
        got = f"{len(items)} values" if items is not None else f"a {type(value).__name__}"
        err = ValueError(f"{where} was declared with num_returns={nret} but returned {got}; "
                         f"return a tuple or list of exactly {nret} values")
        return protocol.RESULT_ERR, encode_error(err, where)
    parts = []
    for item in items:
        part = encode_result(item, where, can_block)
        if part is None:
            return None
        parts.append(part)
    return _multi(parts)


def _multi(parts):
    index = [(kind, len(segs)) for kind, segs in parts]
    return protocol.RESULT_MULTI, [pickle.dumps(index, protocol=5),
                                   *(seg for _, segs in parts for seg in segs)]


def encode_yielded(gen, nret: int, where: str):
    """A generator called with ``num_returns=k``: its k yielded values are the k returns,
    as in Ray. An exception raised before the k-th value becomes the error of each
    return still missing. Runs on an execution thread; ``SystemExit`` propagates."""
    parts: list = []
    error, extra = None, 0
    try:
        for item in gen:
            if len(parts) < nret:
                parts.append(encode_result(item, where))
            else:
                extra += 1   # still run to the end: code after the last yield runs in Ray too
    except SystemExit:
        raise
    except BaseException as e:
        error = e
    if len(parts) < nret:
        if error is None:
            error = ValueError(f"{where} was declared with num_returns={nret} but its generator "
                               f"yielded {len(parts)} values; yield exactly {nret}")
        parts += [(protocol.RESULT_ERR, encode_error(error, where))] * (nret - len(parts))
    elif extra or error is not None:
        # As in Ray, the returns already made stand and the surplus is only reported.
        what = (f"yielded {extra} more values than that (ignored)" if extra
                else f"raised after its last value: {error!r}")
        print(f"ddlf: {where} was declared with num_returns={nret} but its generator {what}",
              file=sys.stderr, flush=True)
    return parts[0] if nret == 1 else _multi(parts)


def as_iterator(value, where: str):
    """The sync iterator over what a generator call returned (an async generator, e.g. a
    task defined with ``async def ... yield``, is driven on a private event loop)."""
    if inspect.isgenerator(value):
        return value
    if inspect.isasyncgen(value):
        return _drive_async(value)
    raise TypeError(f"{where} was called with num_returns='streaming' or 'dynamic' but returned "
                    f"a {type(value).__name__}, not a generator; make it yield its values, or "
                    "call it with an int num_returns")


def _drive_async(agen):
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()


def _is_pending(ref) -> bool:
    e = ref._core.objects.get(ref.id) if ref._core is not None else None
    return e is not None and e.state == PENDING
