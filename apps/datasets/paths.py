"""Where datasets live on a node: the user's data directory and DDLF's cache.

Two environment variables steer everything, so a cluster operator can point every
node at a shared or pre-filled directory without touching code:

- ``DDLF_DATA_DIR``: a directory the user filled by hand (looked at first).
- ``DDLF_CACHE_DIR``: overrides ``~/.cache/ddlf`` (downloads and the array cache).
"""

from __future__ import annotations

import os

__all__ = ["DATA_DIR_ENV", "CACHE_DIR_ENV", "cache_root", "data_dir_from_env"]

DATA_DIR_ENV = "DDLF_DATA_DIR"
CACHE_DIR_ENV = "DDLF_CACHE_DIR"


def cache_root() -> str:
    """``$DDLF_CACHE_DIR`` if set, else ``~/.cache/ddlf`` (``~`` follows ``$HOME``). Not created."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return os.path.abspath(os.path.expanduser(override))
    return os.path.join(os.path.expanduser("~"), ".cache", "ddlf")


def data_dir_from_env() -> str | None:
    """``$DDLF_DATA_DIR`` as an absolute path, or None when unset or empty."""
    value = os.environ.get(DATA_DIR_ENV)
    return os.path.abspath(os.path.expanduser(value)) if value else None
