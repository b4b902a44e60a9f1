"""The mutual HMAC handshake in runtime/wire/auth.py, as pure functions (no sockets)."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlf_actors.runtime.errors import AuthenticationError
from ddlf_actors.runtime.wire import auth

FUZZ = settings(max_examples=200, deadline=None)
TOKEN = "a3f1" * 16


def handshake(client_token, server_token):
    """Run the three steps; return (server_ok, client_error or None)."""
    challenge, server_nonce = auth.make_challenge()
    response, client_nonce = auth.answer_challenge(client_token, challenge)
    ok, reply = auth.check_answer(server_token, server_nonce, response)
    try:
        auth.check_reply(client_token, server_nonce, client_nonce, reply)
    except AuthenticationError as e:
        return ok, e
    return ok, None


# -- sizes -----------------------------------------------------------------------------------
def test_message_sizes_match_the_documented_protocol():
    challenge, nonce = auth.make_challenge()
    assert len(challenge) == auth.CHALLENGE_SIZE == 41
    assert challenge.startswith(b"DDLFAUTH")
    assert challenge[8] == 1
    assert challenge[9:] == nonce and len(nonce) == 32
    response, client_nonce = auth.answer_challenge(TOKEN, challenge)
    assert len(response) == auth.RESPONSE_SIZE == 64
    assert response[:32] == client_nonce
    ok, reply = auth.check_answer(TOKEN, nonce, response)
    assert ok
    assert len(reply) == auth.REPLY_SIZE == 33
    assert reply[0] == 1


def test_macs_are_hmac_sha256_as_documented():
    """Step 2 and 3 MACs, recomputed independently from the module's docstring."""
    challenge, sn = auth.make_challenge()
    response, cn = auth.answer_challenge(TOKEN, challenge)
    key = TOKEN.encode()
    assert response[32:] == hmac.new(key, b"C" + sn + cn, hashlib.sha256).digest()
    _, reply = auth.check_answer(TOKEN, sn, response)
    assert reply[1:] == hmac.new(key, b"S" + cn + sn, hashlib.sha256).digest()


def test_nonces_are_fresh():
    challenges = {auth.make_challenge()[1] for _ in range(50)}
    assert len(challenges) == 50
    challenge, _ = auth.make_challenge()
    client_nonces = {auth.answer_challenge(TOKEN, challenge)[1] for _ in range(50)}
    assert len(client_nonces) == 50


# -- success and failure ---------------------------------------------------------------------
def test_correct_token_both_ways_succeeds():
    ok, err = handshake(TOKEN, TOKEN)
    assert ok is True
    assert err is None


def test_bytes_and_str_token_are_the_same_key():
    ok, err = handshake(TOKEN, TOKEN.encode())
    assert ok and err is None


def test_wrong_client_token_is_refused_by_server_and_client_raises():
    challenge, sn = auth.make_challenge()
    response, cn = auth.answer_challenge("wrong-token", challenge)
    ok, reply = auth.check_answer(TOKEN, sn, response)
    assert ok is False
    assert len(reply) == auth.REPLY_SIZE
    assert reply[0] == 0
    # A refusal must not leak a MAC computed with the real token.
    assert reply[1:] != hmac.new(TOKEN.encode(), b"S" + cn + sn, hashlib.sha256).digest()
    with pytest.raises(AuthenticationError):
        auth.check_reply("wrong-token", sn, cn, reply)


@pytest.mark.parametrize("client_token", ["", None, TOKEN[:-1], TOKEN + "x", TOKEN.upper()])
def test_near_miss_and_missing_tokens_are_refused(client_token):
    ok, err = handshake(client_token, TOKEN)
    assert ok is False
    assert isinstance(err, AuthenticationError)


def test_impostor_server_without_token_is_detected():
    """A server that does not know the token cannot produce a reply the client accepts."""
    challenge, sn = auth.make_challenge()
    response, cn = auth.answer_challenge(TOKEN, challenge)
    # The impostor claims success, with a MAC under some other key...
    _, fake = auth.check_answer("impostor", sn, b"\x00" * 32 + b"\x00" * 32)
    assert fake[0] == 0
    forged = b"\x01" + hmac.new(b"impostor", b"S" + cn + sn, hashlib.sha256).digest()
    with pytest.raises(AuthenticationError):
        auth.check_reply(TOKEN, sn, cn, forged)
    # ... or with random bytes, or by echoing the client's own MAC back.
    with pytest.raises(AuthenticationError):
        auth.check_reply(TOKEN, sn, cn, b"\x01" + os.urandom(32))
    with pytest.raises(AuthenticationError):
        auth.check_reply(TOKEN, sn, cn, b"\x01" + response[32:])


def test_impostor_server_running_check_answer_with_its_own_token():
    """The impostor runs the real server code, but with a token it guessed."""
    ok, err = handshake(TOKEN, "guessed-token")
    assert ok is False
    assert isinstance(err, AuthenticationError)


def test_reply_for_another_client_nonce_is_rejected():
    """A real server reply recorded for one connection cannot be replayed to another."""
    challenge, sn = auth.make_challenge()
    response, cn = auth.answer_challenge(TOKEN, challenge)
    ok, reply = auth.check_answer(TOKEN, sn, response)
    assert ok
    auth.check_reply(TOKEN, sn, cn, reply)  # genuine
    # Same server nonce (the impostor replays the old challenge), fresh client nonce:
    _, cn2 = auth.answer_challenge(TOKEN, challenge)
    with pytest.raises(AuthenticationError):
        auth.check_reply(TOKEN, sn, cn2, reply)


def test_replayed_client_response_fails_against_new_challenge():
    challenge1, sn1 = auth.make_challenge()
    recorded, _ = auth.answer_challenge(TOKEN, challenge1)
    assert auth.check_answer(TOKEN, sn1, recorded)[0] is True
    _, sn2 = auth.make_challenge()
    ok, reply = auth.check_answer(TOKEN, sn2, recorded)
    assert ok is False
    assert reply[0] == 0


def test_client_mac_is_bound_to_its_nonce():
    """Swapping in another client nonce while keeping the MAC fails."""
    challenge, sn = auth.make_challenge()
    response, _ = auth.answer_challenge(TOKEN, challenge)
    tampered = os.urandom(32) + response[32:]
    assert auth.check_answer(TOKEN, sn, tampered)[0] is False


@pytest.mark.parametrize("index", [0, 31, 32, 63])
def test_any_flipped_bit_in_response_fails(index):
    challenge, sn = auth.make_challenge()
    response, _ = auth.answer_challenge(TOKEN, challenge)
    bad = bytearray(response)
    bad[index] ^= 0x01
    assert auth.check_answer(TOKEN, sn, bytes(bad))[0] is False


@pytest.mark.parametrize("length", [0, 1, 63, 65, 128])
def test_wrong_length_response_is_refused(length):
    _, sn = auth.make_challenge()
    ok, reply = auth.check_answer(TOKEN, sn, b"\x00" * length)
    assert ok is False
    assert reply[0] == 0


@pytest.mark.parametrize("reply", [b"", b"\x01", b"\x01" + b"\x00" * 31, b"\x01" + b"\x00" * 33,
                                   b"\x00" * 33, b"\x02" + b"\x00" * 32])
def test_malformed_reply_raises(reply):
    challenge, sn = auth.make_challenge()
    _, cn = auth.answer_challenge(TOKEN, challenge)
    with pytest.raises(AuthenticationError):
        auth.check_reply(TOKEN, sn, cn, reply)


def test_refused_status_with_valid_mac_still_raises():
    challenge, sn = auth.make_challenge()
    response, cn = auth.answer_challenge(TOKEN, challenge)
    _, reply = auth.check_answer(TOKEN, sn, response)
    with pytest.raises(AuthenticationError):
        auth.check_reply(TOKEN, sn, cn, b"\x00" + reply[1:])


# -- malformed challenges --------------------------------------------------------------------
def _good_challenge() -> bytes:
    return auth.make_challenge()[0]


# ids= keeps collection identical across pytest-xdist workers: a good challenge holds a
# random nonce, which would otherwise become part of the test id.
@pytest.mark.parametrize("challenge", [
    b"",
    b"DDLFAUTH",
    _good_challenge()[:-1],
    _good_challenge() + b"\x00",
    b"XDLFAUTH" + b"\x01" + b"\x00" * 32,
    b"ddlfauth" + b"\x01" + b"\x00" * 32,
    b"DDLFAUTH" + b"\x02" + b"\x00" * 32,   # unknown version
    b"DDLFAUTH" + b"\x00" + b"\x00" * 32,
    b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\x00" * 14,
    b"\x00" * 41,
], ids=lambda c: f"{len(c)}B-{c[:9]!r}")
def test_malformed_challenge_raises(challenge):
    with pytest.raises(AuthenticationError):
        auth.answer_challenge(TOKEN, challenge)


@FUZZ
@given(st.binary(max_size=100))
def test_fuzz_challenge_raises_only_authentication_error(data):
    try:
        response, cn = auth.answer_challenge(TOKEN, data)
    except AuthenticationError:
        return
    # Only a well-formed challenge is answered.
    assert len(data) == auth.CHALLENGE_SIZE and data[:9] == b"DDLFAUTH\x01"
    assert len(response) == auth.RESPONSE_SIZE


@FUZZ
@given(st.binary(max_size=100))
def test_fuzz_response_never_accepted(data):
    _, sn = auth.make_challenge()
    ok, reply = auth.check_answer(TOKEN, sn, data)
    assert ok is False
    assert reply[0] == 0


@FUZZ
@given(st.binary(max_size=100))
def test_fuzz_reply_never_accepted(data):
    challenge, sn = auth.make_challenge()
    _, cn = auth.answer_challenge(TOKEN, challenge)
    with pytest.raises(AuthenticationError):
        auth.check_reply(TOKEN, sn, cn, data)


@FUZZ
@given(a=st.text(min_size=1, max_size=80), b=st.text(min_size=1, max_size=80))
def test_handshake_succeeds_iff_tokens_match(a, b):
    ok, err = handshake(a, b)
    if a == b:
        assert ok and err is None
    else:
        assert not ok and isinstance(err, AuthenticationError)


# -- tokens and token files ------------------------------------------------------------------
def test_generate_token_is_random_and_long():
    tokens = {auth.generate_token() for _ in range(20)}
    assert len(tokens) == 20
    for t in tokens:
        assert len(t) >= 32
        int(t, 16)  # hex


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_token_file_mode_0600(tmp_path):
    path = tmp_path / "token"
    auth.write_token_file(str(path), TOKEN)
    assert _mode(path) == 0o600
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert auth.read_token_file(str(path)) == TOKEN


def test_token_file_mode_0600_even_with_permissive_umask(tmp_path):
    path = tmp_path / "token"
    old = os.umask(0)
    try:
        auth.write_token_file(str(path), TOKEN)
    finally:
        os.umask(old)
    assert _mode(path) == 0o600


def test_token_file_rewrite_tightens_existing_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("old-token-that-is-longer-than-the-new-one" * 3)
    os.chmod(path, 0o644)
    auth.write_token_file(str(path), "new")
    assert _mode(path) == 0o600
    assert auth.read_token_file(str(path)) == "new"
