"""What ``fuzz_wire.py`` sends: random plain values, mutated bytes, frames, pickles with
their calling opcodes defused, and random messages of every kind with the requests,
events and methods a fuzzing peer may name.
"""

from __future__ import annotations

import io
import pickletools
import random
import struct

from ddlf_actors.runtime.client.refs import ArgRef
from ddlf_actors.runtime.wire import protocol
from ddlf_actors.runtime.wire.serialization import dumps

PREFIX = struct.Struct("!2sHQ")


# Requests and events a fuzzing peer may send with the right token. Read-only or scoped to
# the fuzzing connection itself (e.g. hello_driver registers the connection, which goes
# away with it). Never shutdown, register_node, create_actor, kill_*, lease_worker.
SAFE_REQUESTS = {
    "head": ["nodes", "list_actors", "cluster_resources", "available_resources", "get_actor",
             "wait_actor", "return_lease", "hello_driver", "rpc_nodes", "no_such_request"],
    "node": ["worker_ready", "release_worker", "no_such_request"],
    "worker": ["no_such_request"],
}
SAFE_EVENTS = ["heartbeat", "worker_died", "release_name", "hello", "no_such_event"]
SAFE_METHODS = ["add", "pid", "no_such_method", "__len__"]


# -- random values -----------------------------------------------------------------------------
def rand_bytes(rng: random.Random, n: int) -> bytes:
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def rand_str(rng: random.Random, n: int | None = None) -> str:
    n = rng.randint(0, 24) if n is None else n
    alphabet = rng.choice(["abcdefghijklmnopqrstuvwxyz_", "\x00\n:/. ", None])
    if alphabet is None:  # any code point, lone surrogates included
        return "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(n))
    return "".join(rng.choice(alphabet) for _ in range(n))


def rand_value(rng: random.Random, depth: int = 0):
    """A random value made of plain data only (what a trusted peer might pickle)."""
    choices = ["int", "bigint", "float", "str", "bytes", "none", "bool"]
    if depth < 3:
        choices += ["tuple", "list", "dict", "set"]
    c = rng.choice(choices)
    if c == "int":
        return rng.randint(-(2**63), 2**64)
    if c == "bigint":
        return rng.getrandbits(rng.randint(64, 4096)) * rng.choice([-1, 1])
    if c == "float":
        return rng.choice([rng.random(), float("nan"), float("inf"), -0.0, 1e308])
    if c == "str":
        return rand_str(rng)
    if c == "bytes":
        return rand_bytes(rng, rng.randint(0, 64))
    if c == "none":
        return None
    if c == "bool":
        return rng.random() < 0.5
    n = rng.randint(0, 5)
    if c == "tuple":
        return tuple(rand_value(rng, depth + 1) for _ in range(n))
    if c == "list":
        return [rand_value(rng, depth + 1) for _ in range(n)]
    if c == "dict":
        return {rand_str(rng, 6): rand_value(rng, depth + 1) for _ in range(n)}
    return {rng.randint(0, 100) for _ in range(n)}


def mutate(rng: random.Random, data: bytes) -> bytes:
    """Bit flips, truncation, insertion or duplication of a byte string."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if op == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            i = rng.randint(0, len(b))
            b[i:i] = rand_bytes(rng, rng.randint(1, 8))
        elif b:
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 16)]
    return bytes(b)


def frame_bytes(segments) -> bytes:
    lengths = [len(s) for s in segments]
    return (PREFIX.pack(b"DF", len(lengths), sum(lengths))
            + struct.pack(f"!{len(lengths)}Q", *lengths) + b"".join(segments))


# Opcodes that call or look up code (a mutated pickle must stay plain data) ...
_CALLING = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD",
            "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}
# ... and memo stores: the unpickler grows its memo table to twice the index and zeroes
# it, so a 10-byte pickle storing at index 2**30 makes the receiver touch 16 GiB. A
# trusted peer can do that (pickle is not a safe format); a fuzzer on a shared machine
# must not.
_MEMO = {"PUT", "BINPUT", "LONG_BINPUT"}
_MAX_MEMO_INDEX = 1 << 16


def defuse(data: bytes) -> bytes:
    """``data`` cut before its first calling opcode or far memo store.

    The unpickler runs opcodes in order and stops at the first error, as ``genops``
    parses them. Where ``genops`` gives up (an unknown opcode, an argument cut short),
    only that opcode's byte is kept, so the unpickler fails at the same place and never
    reads an argument ``genops`` could not check.
    """
    f = io.BytesIO(data)
    ops = pickletools.genops(f)
    end = 0
    while True:
        try:
            op, arg, pos = next(ops)
        except StopIteration:
            return data
        except Exception:
            return data[: end + 1]
        if op.name in _CALLING or (op.name in _MEMO and not (
                isinstance(arg, int) and 0 <= arg <= _MAX_MEMO_INDEX)):
            return data[:pos]
        end = f.tell()


def body_segments(rng: random.Random, msg) -> list:
    """A message body: its real pickle, a mutated one, or bytes that only look like one."""
    r = rng.random()
    if r < 0.5:
        return [bytes(s) for s in dumps(msg)]
    if r < 0.85:
        return [defuse(mutate(rng, bytes(dumps(msg)[0])))]
    return [defuse(b"\x80\x05" + rand_bytes(rng, rng.randint(0, 200)))]


def random_message(rng: random.Random, target: str) -> list:
    """One well-framed message of a plausible kind with a random (often broken) body."""
    kind = rng.choice([protocol.REQUEST, protocol.REPLY_OK, protocol.REPLY_ERR, protocol.PUSH,
                       protocol.CALL, protocol.RESULT_OK, protocol.RESULT_ERR, protocol.OBJ,
                       protocol.FREE, protocol.FUNC])
    msg_id = rng.choice([0, 1, rng.getrandbits(64)])
    head = protocol.header(kind, msg_id)
    if kind == protocol.REQUEST:
        method = rng.choice(SAFE_REQUESTS[target] + [None])
        if method is None:
            method = rand_value(rng) if rng.random() < 0.5 else rand_str(rng)
        args = tuple(rand_value(rng) for _ in range(rng.randint(0, 3)))
        if method == "hello_driver" and args and not isinstance(args[0], dict):
            args = ({"version": rand_str(rng), "python": "0.0"},)
        return [head, *body_segments(rng, (method, args))]
    if kind == protocol.PUSH:
        event = rng.choice(SAFE_EVENTS)
        data = rand_value(rng)
        if rng.random() < 0.5:
            data = {"node_id": rand_str(rng), "worker_id": rand_str(rng),
                    "actor_id": rand_str(rng), "sys_path": [rand_str(rng)], "cwd": rand_str(rng)}
        return [head, *body_segments(rng, (event, data))]
    if kind == protocol.CALL:
        method = rng.choice(SAFE_METHODS + [None])
        if method is None:
            method = rand_value(rng)
        args = tuple(rand_value(rng) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.2:
            args = (ArgRef(rand_bytes(rng, 16)), *args)
        if rng.random() < 0.2:  # what a task call looks like: (fn_id, name, job, args, kwargs)
            return [head, *body_segments(rng, (rand_bytes(rng, 16), "f", None, args, {}))]
        return [head, *body_segments(rng, (method, args, {}))]
    if kind in (protocol.OBJ, protocol.FUNC):
        segs = [rand_bytes(rng, rng.choice([16, 16, 0, 3]))]
        segs += body_segments(rng, rand_value(rng))
        return [head, *segs[: rng.randint(0, len(segs))]] if rng.random() < 0.2 else [head, *segs]
    if kind == protocol.FREE:
        return [head, rand_bytes(rng, rng.choice([0, 15, 16, 32, 100]))]
    return [head, *body_segments(rng, rand_value(rng))]
