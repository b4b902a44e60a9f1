"""Rejected connections are logged once per source, then summed up once per interval."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time

from helpers_modules.util import wait_for

from ddlf_actors.runtime import config
from ddlf_actors.runtime.process import start_child as _start
from ddlf_actors.runtime.wire.address import split_address
from ddlf_actors.runtime.wire.connection import RejectionLog

_SUMMARY = re.compile(r"(\d+) more connection\(s\) from (\S+) rejected in the last")


def _garbage(port: int, source: str, payload: bytes | None) -> None:
    """One unauthenticated connection: 64 random bytes (a wrong token), or silence."""
    with socket.create_connection(("127.0.0.1", port), timeout=10,
                                  source_address=(source, 0)) as s:
        if payload is not None:
            s.sendall(payload)
        while s.recv(4096):  # until the server closes it: then it has been judged
            pass


def _accounted(text: str, source: str) -> tuple[int, int]:
    """(log lines about ``source``, rejections they account for)."""
    lines = [ln for ln in text.splitlines() if f"from {source}" in ln or f"('{source}'," in ln]
    total = 0
    for ln in lines:
        m = _SUMMARY.search(ln)
        total += int(m.group(1)) if m else 1
    return len(lines), total


def test_a_burst_of_garbage_connections_logs_a_few_lines(tmp_path, no_leaks):
    log_path = tmp_path / "head.err"
    interval = 1.5
    with open(log_path, "wb") as err:
        head, info = _start(["ddlf_actors.runtime.head", "--port", "0", "--stdin-lifeline"], "head",
                            stderr=err, new_session=False,
                            env={"DDLF_REJECT_LOG_INTERVAL_S": str(interval),
                                 "DDLF_HANDSHAKE_TIMEOUT_S": "0.5"})
    try:
        _, port = split_address(info["address"])
        t0 = time.monotonic()
        for _ in range(200):
            _garbage(port, "127.0.0.1", os.urandom(64))
        for _ in range(5):
            _garbage(port, "127.0.0.1", None)   # dropped by the handshake timeout
        for _ in range(30):
            _garbage(port, "127.0.0.2", os.urandom(100))  # another source: its own first line
        burst_s = time.monotonic() - t0

        def all_accounted():
            text = log_path.read_text()
            return (_accounted(text, "127.0.0.1")[1] == 205
                    and _accounted(text, "127.0.0.2")[1] == 30)

        assert wait_for(all_accounted, timeout=2 * interval + 10), log_path.read_text()[-3000:]
        text = log_path.read_text()
        # One full line per source, then at most one summary per interval while it lasts.
        most = 2 + int(burst_s / interval) + 1
        for source in ("127.0.0.1", "127.0.0.2"):
            lines, _ = _accounted(text, source)
            assert lines <= most, f"{lines} lines about {source} in {burst_s:.1f} s:\n{text[-3000:]}"
        assert "wrong or missing token" in text
    finally:
        head.stdin.close()
        head.wait(15)
        head.stdout.close()


def test_rejection_log_forgets_a_quiet_source(monkeypatch, caplog):
    monkeypatch.setattr(config, "REJECT_LOG_INTERVAL_S", 0.2)
    logger = logging.getLogger("ddlf.test-rejections")
    rejections = RejectionLog(logger)
    peer = ("10.1.2.3", 4242)

    async def scenario():
        for _ in range(50):
            rejections.rejected(peer, "rejected %s", peer)
        await asyncio.sleep(0.3)    # the window ends: one summary, a new window opens
        rejections.rejected(peer, "rejected %s", peer)
        await asyncio.sleep(0.3)    # one more summary; then a window with nothing ends
        await asyncio.sleep(0.3)
        rejections.rejected(peer, "rejected %s", peer)  # quiet for a while: logged in full

    with caplog.at_level(logging.WARNING, logger="ddlf.test-rejections"):
        asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "rejected ('10.1.2.3', 4242)",
        "49 more connection(s) from 10.1.2.3 rejected in the last 0.2 s",
        "1 more connection(s) from 10.1.2.3 rejected in the last 0.2 s",
        "rejected ('10.1.2.3', 4242)",
    ]
