"""The IDX file format of MNIST and Fashion-MNIST: read, write and find the files.

Layout (all big-endian): two zero bytes, a dtype code, the number of dimensions ``n``,
then ``n`` uint32 sizes, then the data. Files are often gzipped (``.gz``).
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from .atomic import atomic_write
from .errors import DatasetFormatError

__all__ = ["read_idx", "write_idx", "find_idx", "idx_names"]

# IDX dtype code -> big-endian numpy dtype (the format's full table).
_CODE_TO_DTYPE: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_KIND_TO_CODE = {(dt.kind, dt.itemsize): code for code, dt in _CODE_TO_DTYPE.items()}


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (gzipped when the name ends in ``.gz``) into a native-endian array.

    Returns a writable array with the file's dtype (uint8 for MNIST) and shape.
    Raises ``FileNotFoundError`` if the file is missing and ``DatasetFormatError`` if it
    is not valid IDX: bad gzip stream, bad magic, unknown dtype code, or a data size
    that does not match the header (truncated file or trailing bytes).
    """
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DatasetFormatError(f"{path}: not an IDX file ({len(raw)} bytes, header needs 4)")
    if raw[0] != 0 or raw[1] != 0:
        raise DatasetFormatError(
            f"{path}: not an IDX file (magic starts {raw[:2].hex()}, expected 0000)"
            + (" - is it gzipped without a .gz name?" if raw[:2] == b"\x1f\x8b" else "")
        )
    code, ndim = raw[2], raw[3]
    if code not in _CODE_TO_DTYPE:
        raise DatasetFormatError(f"{path}: unknown IDX dtype code 0x{code:02x}")
    if ndim == 0:
        raise DatasetFormatError(f"{path}: IDX header says 0 dimensions")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DatasetFormatError(f"{path}: truncated IDX header ({len(raw)} of {header_len} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _CODE_TO_DTYPE[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(raw) - header_len
    if got != expected:
        what = "truncated" if got < expected else "has trailing bytes"
        raise DatasetFormatError(
            f"{path}: IDX file {what}: header {shape} x {dtype.itemsize} B needs "
            f"{expected} data bytes, file has {got}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    return data.astype(dtype.newbyteorder("="))  # a native-endian, writable copy


def write_idx(path: str, array) -> None:
    """Write ``array`` as an IDX file, gzipped when ``path`` ends in ``.gz``.

    Supported dtypes are IDX's own: uint8, int8, int16, int32, float32, float64 (any
    byte order). The file appears atomically (temp file, then rename). Raises
    ``ValueError`` for other dtypes (cast first, e.g. labels to uint8) or 0-d arrays.
    """
    arr = np.asarray(array)
    code = _KIND_TO_CODE.get((arr.dtype.kind, arr.dtype.itemsize))
    if code is None:
        raise ValueError(
            f"IDX cannot store dtype {arr.dtype}; use one of uint8, int8, int16, int32, "
            "float32, float64"
        )
    if arr.ndim == 0 or arr.ndim > 255:
        raise ValueError(f"IDX needs 1 to 255 dimensions, got {arr.ndim}")
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    body = np.ascontiguousarray(arr, dtype=_CODE_TO_DTYPE[code]).tobytes()
    with atomic_write(path) as raw_file:
        if path.endswith(".gz"):
            # mtime=0 keeps the output byte-identical for identical arrays.
            with gzip.GzipFile(fileobj=raw_file, mode="wb", compresslevel=6, mtime=0) as gz:
                gz.write(header)
                gz.write(body)
        else:
            raw_file.write(header)
            raw_file.write(body)


def idx_names(stem: str, kind: str) -> list:
    """The file names one IDX file goes by, in the order we prefer them.

    ``idx_names("train-images", "idx3-ubyte")`` gives ``train-images-idx3-ubyte.gz``,
    ``train-images-idx3-ubyte``, ``train-images.idx3-ubyte.gz``, ``train-images.idx3-ubyte``
    (the dotted spelling is what some unpackers and the original site produce).
    """
    bases = [f"{stem}-{kind}", f"{stem}.{kind}"]
    return [name for base in bases for name in (base + ".gz", base)]


def find_idx(directory: str, stem: str, kind: str) -> str | None:
    """The path of the first existing spelling of an IDX file in ``directory``, or None."""
    for name in idx_names(stem, kind):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:  # a missing or unreadable file raises its own OSError
        if not path.endswith(".gz"):
            return f.read()
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as gz:
                return gz.read()
        except (OSError, EOFError, zlib.error) as e:
            # gzip says "Compressed file ended before the end-of-stream marker" for a
            # truncated download, BadGzipFile for a non-gzip file (e.g. an HTML error page).
            raise DatasetFormatError(f"{path}: corrupt or truncated gzip file ({e})") from e
