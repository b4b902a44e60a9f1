"""Message kinds and the fixed header that starts every frame (segment 0)."""

from __future__ import annotations

import struct

__all__ = ["HEADER", "REQUEST", "REPLY_OK", "REPLY_ERR", "PUSH", "CALL", "RESULT_OK", "RESULT_ERR",
           "OBJ", "FREE", "FUNC", "RESULT_REFS", "RESULT_MULTI", "RESULT_SHM", "OBJ_SHM",
           "SHM_ACK", "STREAM_ITEM", "STREAM_END", "STREAM_ITEM_HEAD", "STREAM_CREDIT",
           "STREAM_COUNT", "CANCEL", "CANCEL_FORCE", "CANCEL_RECURSIVE", "FETCH", "FETCH_REPLY",
           "header", "parse_header"]

# kind (u8) | message id (u64)
HEADER = struct.Struct("!BQ")

REQUEST = 1      # control RPC: body = (method, args)
REPLY_OK = 2     # body = result
REPLY_ERR = 3    # body = exception
PUSH = 4         # one-way event: body = (event, data)
CALL = 5         # actor method call / task: body = (target, args, kwargs)
RESULT_OK = 6    # segments 1.. = serialized return value
RESULT_ERR = 7   # body = (exception or None, type name, traceback text, where)
OBJ = 8          # an object shipped once per connection: seg1 = object id, seg2.. = value
FREE = 9         # the owner dropped these objects: seg1 = concatenated 16-byte ids
FUNC = 10        # a task function shipped once per connection: seg1 = function id, seg2.. = code
RESULT_REFS = 11  # a return value that contains ObjectRefs: seg1 = pickled [(id, state, n)],
                  # then each contained object's n segments, then the value's segments
RESULT_MULTI = 12  # num_returns=k: seg1 = pickled [(kind, n)] (kind: RESULT_OK/_REFS/_ERR),
                   # then each return value's n segments, in order
# Same-host shared memory (shm_store): descriptors instead of bytes.
RESULT_SHM = 13  # seg1 = pickle payload, seg2 = descriptor (segment name, pin id, layout)
OBJ_SHM = 14     # seg1 = object id, seg2 = pickle payload, seg3 = descriptor
SHM_ACK = 15     # the receiver has mapped a descriptor: seg1 = its pin id
# Generator calls (num_returns="streaming"/"dynamic"); message id = the CALL's.
STREAM_ITEM = 16  # worker -> caller: one yielded value. seg1 = STREAM_ITEM_HEAD (index, kind),
                  # kind one of RESULT_OK/_REFS/_ERR/_SHM, then that result frame's segments.
                  # caller -> worker: a backpressure credit. seg1 = STREAM_CREDIT: how many
                  # items the caller has consumed (-1: no limit any more, it dropped the stream)
STREAM_END = 17   # worker -> caller: the generator finished. seg1 = STREAM_COUNT: items sent
STREAM_ITEM_HEAD = struct.Struct("!QB")
STREAM_CREDIT = struct.Struct("!q")
STREAM_COUNT = struct.Struct("!Q")
# A ref pickled out of band, fetched from the worker that pinned it (runtime/client/oob.py).
FETCH = 24        # seg1 = object id
FETCH_REPLY = 25  # seg1 = outcome byte (oob.VALUE/REFS/ERROR/MISSING), then the object's segments
CANCEL = 18      # cancel the CALL with this message id: seg1 = one byte of CANCEL_* flags
CANCEL_FORCE = 1
CANCEL_RECURSIVE = 2

_pack = HEADER.pack
_unpack = HEADER.unpack


def header(kind: int, msg_id: int = 0) -> bytes:
    return _pack(kind, msg_id)


def parse_header(seg) -> tuple[int, int]:
    return _unpack(seg)
