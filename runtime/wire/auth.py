"""Mutual HMAC challenge-response, run on every connection before any frame is read.

Nothing a peer sends is unpickled until both sides have proved they hold the cluster
token. Every message has a fixed size, so a handshake read is bounded (at most 64 bytes).

    step  direction          bytes  content
    ----  -----------------  -----  -------------------------------------------------
    1     server -> client   41     b"DDLFAUTH" | version (1) | server_nonce (32)
    2     client -> server   64     client_nonce (32) | HMAC(token, "C" | sn | cn)
    3     server -> client   33     status (1: ok, 0: refused) | HMAC(token, "S" | cn | sn)

The server checks step 2 with ``hmac.compare_digest`` and closes on a mismatch; the
client checks the server's MAC in step 3, so a server that does not know the token
cannot impersonate the cluster either. Nonces are fresh per connection, which defeats
replaying a recorded handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from ..errors import AuthenticationError

__all__ = [
    "CHALLENGE_SIZE",
    "RESPONSE_SIZE",
    "REPLY_SIZE",
    "make_challenge",
    "answer_challenge",
    "check_answer",
    "check_reply",
    "generate_token",
    "write_token_file",
    "read_token_file",
]

_MAGIC = b"DDLFAUTH"
_VERSION = 1
_NONCE = 32
CHALLENGE_SIZE = len(_MAGIC) + 1 + _NONCE
RESPONSE_SIZE = 2 * _NONCE
REPLY_SIZE = 1 + _NONCE


def _key(token) -> bytes:
    return token.encode() if isinstance(token, str) else bytes(token or b"")


def _mac(token, tag: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(_key(token), tag + a + b, hashlib.sha256).digest()


def make_challenge() -> tuple[bytes, bytes]:
    """Server step 1: return ``(message, server_nonce)``."""
    nonce = os.urandom(_NONCE)
    return _MAGIC + bytes([_VERSION]) + nonce, nonce


def answer_challenge(token, challenge: bytes) -> tuple[bytes, bytes]:
    """Client step 2: return ``(response, client_nonce)``; raise if the challenge is malformed."""
    if len(challenge) != CHALLENGE_SIZE or not challenge.startswith(_MAGIC):
        raise AuthenticationError("the peer did not start a DDLF handshake: is this a DDLF port?")
    if challenge[len(_MAGIC)] != _VERSION:
        raise AuthenticationError(
            f"the peer speaks handshake version {challenge[len(_MAGIC)]}, we speak {_VERSION}"
        )
    server_nonce = bytes(challenge[len(_MAGIC) + 1 :])
    client_nonce = os.urandom(_NONCE)
    return client_nonce + _mac(token, b"C", server_nonce, client_nonce), client_nonce


def check_answer(token, server_nonce: bytes, response: bytes) -> tuple[bool, bytes]:
    """Server step 3: return ``(ok, reply)``. The reply says "refused" when ``ok`` is false."""
    if len(response) != RESPONSE_SIZE:
        return False, b"\x00" + bytes(_NONCE)
    client_nonce = bytes(response[:_NONCE])
    expected = _mac(token, b"C", server_nonce, client_nonce)
    if not hmac.compare_digest(expected, bytes(response[_NONCE:])):
        return False, b"\x00" + bytes(_NONCE)
    return True, b"\x01" + _mac(token, b"S", client_nonce, server_nonce)


def check_reply(token, server_nonce: bytes, client_nonce: bytes, reply: bytes) -> None:
    """Client: verify step 3; raise :class:`AuthenticationError` unless the server proved the token."""
    if len(reply) != REPLY_SIZE or reply[0] != 1:
        raise AuthenticationError(
            "the cluster rejected our token: pass the head's token with ddlf.init(token=...) "
            "or the DDLF_AUTH_TOKEN environment variable"
        )
    expected = _mac(token, b"S", client_nonce, server_nonce)
    if not hmac.compare_digest(expected, bytes(reply[1:])):
        raise AuthenticationError("the peer could not prove it knows the cluster token")


def generate_token() -> str:
    return secrets.token_hex(32)


def write_token_file(path: str, token: str) -> None:
    """Write ``token`` readable by its owner only (mode 0600, set before the bytes land)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode())
    finally:
        os.close(fd)


def read_token_file(path: str) -> str:
    with open(path) as f:
        return f.read().strip()
