"""``ddlf.init(address=...)`` where no head answers: an error that names the address and
the fix, catchable as ``ConnectionError``; nothing left running."""

from __future__ import annotations

import logging
import pickle
import socket

import pytest
from helpers_modules.clusters import no_leaked_processes

import ddlf_actors as ddlf
from ddlf_actors.errors import DDLFError, HeadUnreachableError


def _closed_port() -> int:
    """A port nothing listens on (bound once to pick it, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_address_names_itself_and_how_to_start_a_head(caplog):
    port = _closed_port()
    caplog.set_level(logging.WARNING)
    with no_leaked_processes():
        with pytest.raises(HeadUnreachableError) as info:
            ddlf.init(address=f"127.0.0.1:{port}", token="t" * 64)
    e = info.value
    assert isinstance(e, ConnectionError) and isinstance(e, DDLFError)
    assert e.address == f"127.0.0.1:{port}"
    assert f"127.0.0.1:{port}" in str(e) and "refused" in str(e)
    assert f"ddlf-node start --head --port {port}" in str(e)
    assert isinstance(e.__cause__, ConnectionRefusedError)
    assert not ddlf.is_initialized()
    # The failed connect is reported once, as the error, not also as a lost head link.
    assert "lost the connection" not in caplog.text


def test_old_except_clauses_still_catch_it():
    try:
        ddlf.init(address=f"127.0.0.1:{_closed_port()}", token="t" * 64)
    except ConnectionError as e:   # what callers wrote for the bare ConnectionRefusedError
        assert "could not reach a DDLF head" in str(e)
    else:
        pytest.fail("init reached a head on a closed port")
    assert not ddlf.is_initialized()


def test_an_unknown_host_says_it_cannot_be_resolved():
    with pytest.raises(HeadUnreachableError, match="cannot be resolved") as info:
        ddlf.init(address="no-such-ddlf-head.invalid:6380", token="t" * 64)
    assert "--host no-such-ddlf-head.invalid --port 6380" in str(info.value)


def test_the_error_pickles_with_its_address():
    e = HeadUnreachableError("could not reach a DDLF head at h:1: ...", "h:1")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is HeadUnreachableError and back.address == "h:1"
    assert str(back) == str(e)


def test_auto_without_a_head_on_this_host(tmp_path, monkeypatch):
    session = tmp_path / "session"
    session.mkdir(mode=0o700)
    monkeypatch.setenv("DDLF_TEMP_DIR", str(session))   # no head.json: no head started here
    with pytest.raises(HeadUnreachableError, match="found no DDLF head started on this host"):
        ddlf.init(address="auto")


def test_a_cluster_file_whose_hosts_do_not_answer(tmp_path):
    ports = [_closed_port(), _closed_port()]
    toml = tmp_path / "cluster.toml"
    toml.write_text(f'hosts = ["127.0.0.1:{ports[0]}", "127.0.0.1:{ports[1]}"]\n')
    with pytest.raises(HeadUnreachableError, match="none of the hosts") as info:
        ddlf.init(address=str(toml), token="t" * 64)
    assert f"127.0.0.1:{ports[1]}" in str(info.value) and "ddlf-node start --head" in str(info.value)
