"""Tunable limits, read once from the environment so every process of a host agrees."""

from __future__ import annotations

import os

__all__ = ["MAX_FRAME_BYTES", "MAX_SEGMENTS", "HEARTBEAT_INTERVAL_S", "NODE_DEAD_AFTER_S",
           "HANDSHAKE_TIMEOUT_S", "session_root"]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


# Largest frame a peer may declare. Checked before anything is allocated for it, so a
# hostile or corrupt length cannot make a process allocate gigabytes. 1 GiB by default:
# a 100 MB array passes with room to spare.
MAX_FRAME_BYTES = _env_int("DDLF_MAX_FRAME_BYTES", 1 << 30)
# Segments (pickle payload plus out-of-band buffers) one frame may carry.
MAX_SEGMENTS = _env_int("DDLF_MAX_SEGMENTS", 4096)
HEARTBEAT_INTERVAL_S = _env_float("DDLF_HEARTBEAT_INTERVAL_S", 1.0)
NODE_DEAD_AFTER_S = _env_float("DDLF_NODE_DEAD_AFTER_S", 10.0)
# A server drops a peer that has not finished the handshake by then.
HANDSHAKE_TIMEOUT_S = _env_float("DDLF_HANDSHAKE_TIMEOUT_S", 5.0)


def session_root() -> str:
    """Per-user folder for token files and session records (mode 0700)."""
    root = os.environ.get("DDLF_TEMP_DIR") or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"ddlf-{os.getuid()}"
    )
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root
