"""``fuzz_wire.py``'s cases, before and after the handshake, with their weights
(:data:`KINDS`), and one case run from (seed, index) alone (:func:`run_case`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct

from benchmarks.chaos.fuzz_messages import PREFIX, frame_bytes, rand_bytes, random_message
from benchmarks.chaos.fuzz_peer import DROP_DEADLINE_S, Case, Peer, end_connection
from ddlf_actors.runtime import config
from ddlf_actors.runtime.wire import auth, protocol
from ddlf_actors.runtime.wire.serialization import dumps, loads

# Upper bound for a whole case; a case that takes longer counts as a client timeout.
CASE_TIMEOUT_S = config.HANDSHAKE_TIMEOUT_S + 8.0


# -- cases: before the handshake ---------------------------------------------------------------
_TLS_HELLO = bytes.fromhex("160301") + b"\x00\xc8\x01\x00\x00\xc4\x03\x03" + bytes(32)


async def case_pre_garbage(c, rng, peer, token, ctx):
    if rng.random() < 0.7:
        await peer.challenge()
    payload = rng.choice([
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * rng.randint(1, 4),
        _TLS_HELLO + rand_bytes(rng, 200),
        b"SSH-2.0-OpenSSH_9.6\r\n" + rand_bytes(rng, 60),
        frame_bytes([protocol.header(protocol.REQUEST, 1), *dumps(("nodes", ()))]),
        rand_bytes(rng, rng.randint(0, 63)),
        rand_bytes(rng, rng.randint(64, 4096)),
        b"\x00" * rng.choice([1, 63, 64, 65, 1000]),
    ])
    ok = await peer.send(payload)
    if ok and len(payload) >= auth.RESPONSE_SIZE and rng.random() < 0.5:
        # 64 bytes or more is a (wrong) handshake response: the server must drop us.
        if not await peer.closed_by_peer():
            c.fail("oracle_failure", f"still open after {len(payload)} garbage bytes")
    await end_connection(peer, rng)


def _wrong_token(rng, token: str):
    return rng.choice([
        "", "wrong-token", "".join(rng.choice("0123456789abcdef") for _ in range(64)),
        token[:-1], token + "x",
        token[:10] + ("0" if token[10] != "0" else "1") + token[11:], token.upper(),
        rand_bytes(rng, 32),
    ])


async def case_wrong_token(c, rng, peer, token, ctx):
    bad = _wrong_token(rng, token)
    ch = await peer.challenge()
    if ch is None:
        return c.fail("oracle_failure", "no challenge")
    response, _cn = auth.answer_challenge(bad, ch)
    extra = b""
    if rng.random() < 0.5:  # pipelined: a request right behind the wrong response
        extra = frame_bytes([protocol.header(protocol.REQUEST, 1), *dumps(("nodes", ()))])
    await peer.send(response + extra)
    reply = await peer.recv_exact(auth.REPLY_SIZE)
    if reply is not None and reply[0] != 0:
        return c.fail("oracle_failure", f"accepted a wrong token {bad!r}")
    if not await peer.closed_by_peer():
        c.fail("oracle_failure", "still open after a refused handshake")
    peer.close()


async def case_replay(c, rng, peer, token, ctx):
    # Record a genuine response on a throw-away connection, replay it on this one.
    other = await Peer.open(*ctx["addr"])
    try:
        ch = await other.challenge()
        recorded, _ = auth.answer_challenge(token, ch) if ch else (b"\x00" * 64, b"")
    finally:
        other.close()
    await peer.challenge()
    await peer.send(recorded)
    reply = await peer.recv_exact(auth.REPLY_SIZE)
    if reply is not None and reply[0] != 0:
        return c.fail("oracle_failure", "accepted a replayed handshake response")
    if not await peer.closed_by_peer():
        c.fail("oracle_failure", "still open after a replayed response")
    peer.close()


async def case_short_response(c, rng, peer, token, ctx):
    if rng.random() < 0.8:
        await peer.challenge()
    await peer.send(rand_bytes(rng, rng.randint(1, auth.RESPONSE_SIZE - 1)))
    await end_connection(peer, rng)


async def case_slowloris_pre(c, rng, peer, token, ctx):
    ch = await peer.challenge()
    if ch is None:
        return c.fail("oracle_failure", "no challenge")
    good = rng.random() < 0.5
    response, _ = auth.answer_challenge(token if good else _wrong_token(rng, token), ch)
    upto = rng.randint(1, auth.RESPONSE_SIZE - 1)
    for i in range(upto):
        if not await peer.send(response[i:i + 1]):
            break
        await asyncio.sleep(rng.uniform(0.001, 0.02))
    if rng.random() < 0.05:
        # Stall for good: the server must drop us by its handshake timeout.
        if not await peer.closed_by_peer(config.HANDSHAKE_TIMEOUT_S + DROP_DEADLINE_S):
            c.fail("oracle_failure", f"a stalled handshake was kept beyond "
                   f"{config.HANDSHAKE_TIMEOUT_S + DROP_DEADLINE_S:g} s")
    else:
        await asyncio.sleep(rng.uniform(0, 0.5))
    await end_connection(peer, rng)


async def case_reset_pre(c, rng, peer, token, ctx):
    step = rng.randrange(3)
    if step >= 1:
        ch = await peer.challenge()
        if step == 2 and ch is not None:
            response, _ = auth.answer_challenge(token, ch)
            await peer.send(response[: rng.randint(0, auth.RESPONSE_SIZE)])
    peer.reset()


# -- cases: after a handshake with the right token ---------------------------------------------
def _bad_prefix(rng):
    which = rng.randrange(6)
    if which == 0:
        magic = rng.choice([b"XX", b"FD", b"df", b"\x00\x00", rand_bytes(rng, 2)])
        if magic == b"DF":
            magic = b"XX"
        return f"magic {magic!r}", PREFIX.pack(magic, 1, 3) + struct.pack("!Q", 3) + b"abc"
    if which == 1:
        return "zero segments", PREFIX.pack(b"DF", 0, rng.choice([0, 9]))
    if which == 2:
        n = rng.randint(config.MAX_SEGMENTS + 1, 65535)
        return f"{n} segments", PREFIX.pack(b"DF", n, 9) + rand_bytes(rng, 64)
    if which == 3:
        size = rng.choice([config.MAX_FRAME_BYTES + 1, 1 << 50, 2**64 - 1,
                           rng.randint(config.MAX_FRAME_BYTES + 1, 2**64 - 1)])
        return f"body {size}", PREFIX.pack(b"DF", 1, size) + struct.pack("!Q", size)
    if which == 4:
        n = rng.randint(1, 8)
        lengths = [rng.randint(0, 1000) for _ in range(n)]
        body = max(0, sum(lengths) + rng.choice([-1, 1, 1000]))
        if body == sum(lengths):
            body += 1
        return "lengths mismatch", (PREFIX.pack(b"DF", n, body) + struct.pack(f"!{n}Q", *lengths)
                                    + rand_bytes(rng, 32))
    # Segment lengths that overflow 64 bits when summed but wrap to the declared size.
    return "length overflow", (PREFIX.pack(b"DF", 2, 8) + struct.pack("!QQ", 2**64 - 8, 16)
                               + rand_bytes(rng, 24))


async def case_bad_prefix(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    what, data = _bad_prefix(rng)
    lead = frame_bytes(random_message(rng, c.target)) if rng.random() < 0.3 else b""
    await peer.send(lead + data)
    if not await peer.closed_by_peer():
        c.fail("oracle_failure", f"still open after a bad prefix ({what})")
    peer.close()


async def case_truncated(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    data = frame_bytes(random_message(rng, c.target))
    await peer.send(data[: rng.randint(0, len(data) - 1)])
    await end_connection(peer, rng)


async def case_huge_declared(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    limit = min(config.MAX_FRAME_BYTES, 512 << 20)
    nseg = rng.choice([1, 1, 2, rng.randint(3, 64)])
    sizes = [rng.randint(256 << 10, limit // nseg) for _ in range(nseg)]
    data = PREFIX.pack(b"DF", nseg, sum(sizes)) + struct.pack(f"!{nseg}Q", *sizes)
    await peer.send(data + rand_bytes(rng, rng.randint(0, 8192)))
    await end_connection(peer, rng)


async def case_bad_header(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    n = rng.choice([0, 1, 8, 10, 17, rng.randint(0, 64)])
    if n == protocol.HEADER.size:
        n += 1
    extra = [rand_bytes(rng, rng.randint(0, 50)) for _ in range(rng.randint(0, 3))]
    await peer.send(frame_bytes([rand_bytes(rng, n), *extra]))
    if not await peer.closed_by_peer():
        c.fail("oracle_failure", f"still open after a {n}-byte header")
    peer.close()


async def case_bad_kind(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    kind = rng.choice([0, 11, 12, 100, 255, rng.randint(0, 255)])
    segs = [protocol.header(kind, rng.getrandbits(64))]
    segs += [rand_bytes(rng, rng.randint(0, 100)) for _ in range(rng.randint(0, 5))]
    await peer.send(frame_bytes(segs))
    await peer.read_frames(0.05)
    await end_connection(peer, rng)


async def case_wrong_segcount(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    segs = random_message(rng, c.target)
    if rng.random() < 0.5:
        segs = segs[:1]  # a header and nothing else
    else:
        segs = segs + [rand_bytes(rng, rng.randint(0, 64)) for _ in range(rng.randint(1, 40))]
    await peer.send(frame_bytes(segs))
    await peer.read_frames(0.05)
    await end_connection(peer, rng)


async def case_random_pickle(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    data = b"".join(frame_bytes(random_message(rng, c.target)) for _ in range(rng.randint(1, 5)))
    if rng.random() < 0.3:  # split across many writes to exercise partial parsing
        i = 0
        while i < len(data):
            j = i + rng.randint(1, 200)
            if not await peer.send(data[i:j]):
                break
            i = j
    else:
        await peer.send(data)
    await peer.read_frames(0.05)
    await end_connection(peer, rng)


async def case_many_segments(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    n = rng.choice([config.MAX_SEGMENTS, rng.randint(2, config.MAX_SEGMENTS)])
    segs = [protocol.header(rng.choice([protocol.CALL, protocol.OBJ, protocol.PUSH]), 1)]
    segs += [b""] * (n - 1)
    await peer.send(frame_bytes(segs))
    await peer.read_frames(0.05)
    await end_connection(peer, rng)


async def _control(c, rng, peer, token) -> bytes:
    """A well-formed request and the check of its answer (a positive control)."""
    msg_id = rng.randint(1, 2**63)
    if c.target == "worker":
        a, b = rng.randint(-1000, 1000), rng.randint(-1000, 1000)
        segs = [protocol.header(protocol.CALL, msg_id), *dumps(("add", (a, b), {}))]
        return frame_bytes(segs), msg_id, protocol.RESULT_OK, a + b
    # Harmless requests with a known answer: the head's node list; on a node's port, which
    # answers only its workers' worker_ready, a request it does not know (an error reply
    # naming it, and the connection kept).
    if c.target == "head":
        segs = [protocol.header(protocol.REQUEST, msg_id), *dumps(("nodes", ()))]
        return frame_bytes(segs), msg_id, protocol.REPLY_OK, None
    segs = [protocol.header(protocol.REQUEST, msg_id), *dumps(("no_such_request", ()))]
    return frame_bytes(segs), msg_id, protocol.REPLY_ERR, "unknown request 'no_such_request'"


def _answer_is(value, want) -> bool:
    """A control's answer matches: equal to ``want``, or an error whose text contains it."""
    if want is None:
        return True
    if isinstance(value, BaseException):
        return isinstance(want, str) and want in str(value)
    return value == want


async def case_valid_call(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    data, msg_id, want_kind, want = await _control(c, rng, peer, token)
    await peer.send(data)
    frames = await peer.read_frames(10.0)
    if not frames:
        return c.fail("control_failure", "no answer to a well-formed request")
    kind, got_id = protocol.parse_header(bytes(frames[0][0]))
    value = loads(frames[0][1:])
    if kind != want_kind or got_id != msg_id or not _answer_is(value, want):
        return c.fail("control_failure", f"answer {kind}/{got_id}/{value!r:.80}")
    await end_connection(peer, rng)


async def case_pipelined(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    data, *_ = await _control(c, rng, peer, token)
    what, bad = _bad_prefix(rng)
    await peer.send(data + bad)
    if not await peer.closed_by_peer():
        c.fail("oracle_failure", f"still open after a good frame then a bad prefix ({what})")
    peer.close()


async def case_slowloris_post(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    data = frame_bytes(random_message(rng, c.target))
    upto = rng.randint(1, len(data))
    for i in range(min(upto, 60)):
        if not await peer.send(data[i:i + 1]):
            break
        await asyncio.sleep(rng.uniform(0.001, 0.02))
    await asyncio.sleep(rng.uniform(0, 0.5))
    await end_connection(peer, rng)


async def case_reset_post(c, rng, peer, token, ctx):
    if not await peer.handshake(token):
        return c.fail("control_failure", "right token refused")
    if rng.random() < 0.5:
        data, *_ = await _control(c, rng, peer, token)  # the server's reply finds an RST
    else:
        data = frame_bytes(random_message(rng, c.target))
        data = data[: rng.randint(0, len(data))]
    await peer.send(data)
    if rng.random() < 0.5:
        await asyncio.sleep(rng.uniform(0, 0.01))
    peer.reset()


# kind -> (function, weight)
KINDS = {
    "pre_garbage": (case_pre_garbage, 10),
    "wrong_token": (case_wrong_token, 10),
    "replay": (case_replay, 2),
    "short_response": (case_short_response, 4),
    "slowloris_pre": (case_slowloris_pre, 2),
    "reset_pre": (case_reset_pre, 6),
    "bad_prefix": (case_bad_prefix, 10),
    "truncated": (case_truncated, 6),
    "huge_declared": (case_huge_declared, 4),
    "bad_header": (case_bad_header, 5),
    "bad_kind": (case_bad_kind, 5),
    "wrong_segcount": (case_wrong_segcount, 5),
    "random_pickle": (case_random_pickle, 16),
    "many_segments": (case_many_segments, 1),
    "valid_call": (case_valid_call, 5),
    "pipelined": (case_pipelined, 3),
    "slowloris_post": (case_slowloris_post, 2),
    "reset_post": (case_reset_post, 6),
}
KIND_NAMES = list(KINDS)
KIND_WEIGHTS = [KINDS[k][1] for k in KIND_NAMES]


def plan(seed: int, index: int, targets) -> tuple[random.Random, str, str]:
    """The generator, kind and target of case ``index``: a function of (seed, index) only."""
    rng = random.Random(seed * 10**9 + index)
    kind = rng.choices(KIND_NAMES, KIND_WEIGHTS)[0]
    target = targets[rng.randrange(len(targets))]
    return rng, kind, target


async def run_case(seed: int, index: int, targets: dict, token: str) -> Case:
    rng, kind, target = plan(seed, index, sorted(targets))
    c = Case(index, kind, target)
    host, port = targets[target]["host"], targets[target]["port"]
    peer = None

    async def go():
        nonlocal peer
        peer = await Peer.open(host, port)
        await KINDS[kind][0](c, rng, peer, token, {"addr": (host, port)})

    try:
        await asyncio.wait_for(go(), CASE_TIMEOUT_S)
    except ConnectionRefusedError as e:
        c.fail("refused", repr(e))
    except (asyncio.TimeoutError, TimeoutError):
        c.fail("client_timeout", f"case took over {CASE_TIMEOUT_S:g} s")
    except (ConnectionError, OSError):
        pass  # the server dropped us mid-case: allowed for hostile input
    except Exception as e:  # a bug in this fuzzer, not in a server: count it, go on
        c.fail("client_error", f"{type(e).__name__}: {e}")
    finally:
        if peer is not None:
            with contextlib.suppress(Exception):
                peer.close()
    return c
