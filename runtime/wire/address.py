"""``host:port`` addresses: the one place that takes them apart."""

from __future__ import annotations

__all__ = ["split_address", "host_of"]


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``"host:port"``; the port is split at the last colon.

    Raises ``ValueError`` naming the address if it has no ``:PORT`` with a numeric port.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not 'host:port' (e.g. '10.0.0.5:6380')")
    return host, int(port)


def host_of(address: str) -> str:
    """The host part of ``"host:port"`` (the whole string if it has no colon)."""
    return address.rpartition(":")[0] or address
