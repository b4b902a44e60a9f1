"""Fill the node's dataset cache from the network.

The network is reached only through ``_download`` (one URL to one file) and, for
Fashion-MNIST, ``_apt_fetch_fashion_mnist`` (the Debian package). Everything else here
is bookkeeping, so tests replace exactly those two functions.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import subprocess
import tempfile
import urllib.request
from typing import Callable, Iterator

from .atomic import atomic_write
from .cifar import extract_cifar10
from .errors import DatasetFormatError
from .idx import read_idx
from .paths import cache_root
from .sources import BUILTIN, CifarSource, IdxSource, not_found_error

__all__ = ["fetch", "DOWNLOAD_TIMEOUT_S", "APT_TIMEOUT_S"]

# Per socket operation, not for the whole file: fail fast on a node with no internet
# (the usual case on a cluster) while a slow but live link still finishes.
DOWNLOAD_TIMEOUT_S = 20.0
APT_TIMEOUT_S = 300.0
_USER_AGENT = "ddlf-datasets/1"  # some CDNs refuse urllib's default agent


def fetch(name: str, *, force: bool = False) -> str:
    """Download built-in dataset ``name`` into ``<cache>/<name>`` and return that path.

    ``<cache>`` is ``$DDLF_CACHE_DIR`` or ``~/.cache/ddlf``. Files already there are
    kept unless ``force``. Tries the official URLs (each mirror in turn); for
    Fashion-MNIST, if they fail, the Debian package via ``apt-get download`` and
    ``dpkg-deb -x`` (no root needed). Downloads are checked by parsing them.

    Raises ``ValueError`` for a name that is not built in (registered datasets have no
    download), ``DatasetNotFoundError`` listing every attempt and how to get the files.
    """
    path, tried = _fetch(name, force=force)
    if path is None:
        raise not_found_error(name, tried)
    return path


def _fetch(name: str, *, force: bool = False):
    """``(cache path, tried)`` on success, ``(None, tried)`` when every way failed."""
    source = BUILTIN.get(name)
    if source is None:
        raise ValueError(f"no download known for dataset {name!r}; built-in: {sorted(BUILTIN)}")
    dest = os.path.join(cache_root(), name)
    if not force and source.probe(dest)[0] is not None:
        return dest, []
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as e:
        return None, [f"create cache directory {dest}: {e}"]
    with _fetch_lock(name):
        # Another process may have fetched it while we waited for the lock.
        if not force and source.probe(dest)[0] is not None:
            return dest, []
        tried: list = []
        fetchers: list[Callable[..., bool]] = [
            _fetch_idx_urls if isinstance(source, IdxSource) else _fetch_cifar_url]
        if source.name == "fashion-mnist":  # the one dataset Debian packages
            fetchers.append(_fetch_apt)
        for fetcher in fetchers:
            if fetcher(source, dest, tried, force) and source.probe(dest)[0] is not None:
                return dest, tried
        return None, tried


@contextlib.contextmanager
def _fetch_lock(name: str) -> Iterator[None]:
    """Hold ``<cache>/.<name>.fetch.lock``: one process per node downloads a dataset.

    Every trainer on a node resolves its dataset (and fetches it when missing) before
    ``load_shared`` can name the cache entry, so without this K trainers would download
    K copies, and one finishing early would see the others' files still in flight and
    report the dataset missing. Without a writable lock file, fetch unlocked (the
    downloads are atomic, so the result is still whole).
    """
    try:
        fd = os.open(os.path.join(cache_root(), f".{name}.fetch.lock"),
                     os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits while another process fetches
        yield
    finally:
        os.close(fd)  # releases the flock


def _fetch_idx_urls(source: IdxSource, dest: str, tried: list, force: bool) -> bool:
    ok = True
    for fname in source.download_names():
        target = os.path.join(dest, fname)
        if not force and os.path.isfile(target):
            continue
        for base in source.mirrors:
            url = base + fname
            try:
                _download(url, target)
                read_idx(target)  # an HTML error page or a cut-off file fails here
                break
            except (OSError, DatasetFormatError) as e:
                with contextlib.suppress(OSError):
                    os.unlink(target)
                tried.append(f"download {url}: {_short(e)}")
        else:
            ok = False
            break  # a file no mirror has: the rest would fail the same way
    return ok


def _fetch_cifar_url(source: CifarSource, dest: str, tried: list, force: bool) -> bool:
    archive = os.path.join(dest, source.archive_name)
    try:
        _download(source.url, archive)
        extract_cifar10(archive, dest)
        return True
    except (OSError, DatasetFormatError) as e:
        tried.append(f"download {source.url}: {_short(e)}")
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(archive)  # 160 MB we no longer need once extracted


def _fetch_apt(source: IdxSource, dest: str, tried: list, force: bool) -> bool:
    try:
        _apt_fetch_fashion_mnist(dest)
        return True
    except (OSError, subprocess.SubprocessError, DatasetFormatError) as e:
        tried.append(f"apt-get download {source.apt_package} + dpkg-deb -x: {_short(e)}")
        return False


def _download(url: str, dest: str) -> None:
    """Copy ``url`` to the file ``dest`` (atomically). Raises ``OSError`` on any failure.

    The one place this package touches the internet.
    """
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
        with atomic_write(dest) as out:
            shutil.copyfileobj(response, out, length=1 << 20)


def _apt_fetch_fashion_mnist(dest: str) -> None:
    """Put the four Fashion-MNIST ``.gz`` files from Debian's ``dataset-fashion-mnist`` in ``dest``.

    Runs ``apt-get download`` (fetches the .deb into the current directory, no root)
    and ``dpkg-deb -x`` in a temporary directory, so nothing is installed. Raises
    ``OSError`` (e.g. no apt-get), ``subprocess.SubprocessError`` (command failed or
    timed out; the message carries apt's stderr) or ``DatasetFormatError``.
    """
    package = "dataset-fashion-mnist"
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} not found (not a Debian/Ubuntu system?)")
    with tempfile.TemporaryDirectory(prefix="ddlf-apt-") as tmp:
        _run(["apt-get", "download", package], cwd=tmp)
        debs = glob.glob(os.path.join(tmp, f"{package}_*.deb"))
        if not debs:
            raise FileNotFoundError(f"apt-get download {package} produced no .deb")
        root = os.path.join(tmp, "x")
        _run(["dpkg-deb", "-x", debs[0], root], cwd=tmp)
        src = os.path.join(root, "usr", "share", "datasets", "fashion-mnist")
        fashion = BUILTIN["fashion-mnist"]
        assert isinstance(fashion, IdxSource)
        for fname in fashion.download_names():
            read_idx(os.path.join(src, fname))  # refuse to cache a broken package
            with open(os.path.join(src, fname), "rb") as fin, \
                    atomic_write(os.path.join(dest, fname)) as fout:
                shutil.copyfileobj(fin, fout)


def _run(cmd: list, cwd: str) -> None:
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True,
                       timeout=APT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or e.stdout or "").strip().splitlines()[-3:]
        raise subprocess.SubprocessError(
            f"{' '.join(cmd)} exited {e.returncode}: {' | '.join(tail)}"
        ) from e


def _short(error: BaseException) -> str:
    """One line for the "tried" list (urllib nests the real reason in ``.reason``)."""
    reason = getattr(error, "reason", None)
    text = f"{type(error).__name__}: {reason if reason is not None else error}"
    return " ".join(text.split())[:300]

