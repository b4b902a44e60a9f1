"""runtime/process.py and runtime/wire/address.py: the plumbing heads, nodes and their parents share."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from ddlf_actors.runtime import process
from ddlf_actors.runtime.errors import DDLFError, VersionMismatchError
from ddlf_actors.runtime.wire.address import host_of, split_address


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:6380", ("127.0.0.1", 6380)),
    ("head.example:0", ("head.example", 0)),
    ("[::1]:80", ("[::1]", 80)),
])
def test_split_address(address, expected):
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["127.0.0.1", "host:", "host:port", ""])
def test_split_address_names_a_bad_address(address):
    with pytest.raises(ValueError, match="is not 'host:port'"):
        split_address(address)


def test_host_of():
    assert host_of("10.0.0.5:6380") == "10.0.0.5"
    assert host_of("[::1]:80") == "[::1]"
    assert host_of("justahost") == "justahost"


def test_resolve_token_order(tmp_path, monkeypatch):
    f = tmp_path / "token"
    f.write_text("from-file\n")
    monkeypatch.delenv(process.TOKEN_ENV, raising=False)
    assert process.resolve_token() is None
    assert process.resolve_token(None, str(f)) == "from-file"
    monkeypatch.setenv(process.TOKEN_ENV, "from-env")
    assert process.resolve_token(None, str(f)) == "from-env"
    assert process.resolve_token("explicit", str(f)) == "explicit"


def test_versions_match_and_mismatch(monkeypatch):
    ours = process.versions()
    process.check_versions(ours, "this peer")   # no error
    with pytest.raises(VersionMismatchError, match="0.0.0-old.*same DDLF"):
        process.check_versions({**ours, "version": "0.0.0-old"}, "node x")
    with pytest.raises(VersionMismatchError, match="Python 2.7"):
        process.check_versions({**ours, "python": "2.7"}, "node x")
    # Read when called: a test (or a stale install) can pose as another version.
    import ddlf_actors.runtime as runtime

    monkeypatch.setattr(runtime, "__version__", "9.9.9")
    assert process.versions()["version"] == "9.9.9"


def test_announce_ready_writes_one_parsable_line(monkeypatch):
    out = io.StringIO()
    dups = []
    monkeypatch.setattr(os, "dup2", lambda a, b: dups.append((a, b)))
    process.announce_ready(out, {"address": "127.0.0.1:1", "pid": 7})
    assert out.getvalue() == 'DDLF_READY {"address": "127.0.0.1:1", "pid": 7}\n'
    assert dups == [(2, 1)]   # later output goes to stderr, never to an unread pipe


def test_start_child_reports_a_child_that_dies():
    with pytest.raises(DDLFError, match="failed to start .exit code 2"):
        process.start_child(["ddlf_actors.runtime.node", "--no-such-flag"], "node",
                            stderr=subprocess.DEVNULL, new_session=False)


def test_start_child_then_stop_children_ends_a_head(no_leaks):
    head, info = process.start_child(["ddlf_actors.runtime.head", "--port", "0",
                                      "--stdin-lifeline"], "head", new_session=False)
    try:
        assert split_address(info["address"])[1] > 0 and info["pid"] == head.pid
    finally:
        process.stop_children([head], 15)
    # It stopped because its lifeline closed, not because it was killed.
    assert head.returncode == 0
    assert head.stdin.closed and head.stdout.closed


def test_stop_children_kills_one_that_ignores_its_lifeline():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    process.stop_children([p], 0.5)
    assert p.returncode == -9


_HOARD = """
import sys, numpy as np, psutil
from ddlf_actors.runtime import process
pinned = sys.argv[1] == "pin" and process.pin_malloc_mmap_threshold()
p = psutil.Process()
before = p.memory_info().rss
big = np.empty(20 << 20, dtype=np.uint8)   # a large frame segment (under 32 MiB), freed
big[:4096] = 1
del big
buffers, kept = [], []
for _ in range(200):   # 200 connections' 256 KiB receive buffers, and 100 KB kept between
    buffers.append(bytearray(256 * 1024))
    kept.append(bytearray(100_000))
del buffers            # the connections closed: what is resident beyond the 20 MB kept?
print(pinned, (p.memory_info().rss - before - 200 * 100_000) / 1e6)
"""


def _held_after_free(mode: str):
    out = subprocess.run([sys.executable, "-c", _HOARD, mode], capture_output=True, text=True,
                         timeout=60, env=process.child_env(), check=True).stdout.split()
    return out[0] == "True", float(out[1])


def test_a_pinned_mmap_threshold_gives_freed_receive_buffers_back():
    _, hoarded = _held_after_free("default")
    if hoarded < 25:
        pytest.skip(f"this malloc gives freed buffers back by itself ({hoarded:.1f} MB held)")
    pinned, held = _held_after_free("pin")
    assert pinned, "mallopt(M_MMAP_THRESHOLD) was refused on a malloc that hoards"
    assert held < 10, f"{held:.1f} MB of 52 MB of freed buffers still resident"
