"""The head's store of ``runtime_env`` packages: uploaded once by a caller (a zipped
``working_dir`` or ``py_modules`` folder, named by its content hash), fetched once by
each node that runs work needing it. Pure state, no I/O."""

from __future__ import annotations

from ..runtime_env import check_package

__all__ = ["PackageStore"]


class PackageStore:
    def __init__(self):
        self._packages: dict[str, bytes] = {}

    def __contains__(self, pkg_id) -> bool:
        return pkg_id in self._packages

    def put(self, pkg_id: str, data: bytes) -> None:
        """Keep ``data`` as ``pkg_id``; ``ValueError`` unless the bytes match its hash."""
        check_package(pkg_id, data)
        self._packages[pkg_id] = bytes(data)

    def get(self, pkg_id: str) -> bytes | None:
        return self._packages.get(pkg_id)

    def __len__(self) -> int:
        return len(self._packages)
