"""Text corpora: where their files are, how to fetch them, and the documents they hold.

Two kinds of source feed a :class:`~.text.TextDataset`:

- :class:`CorpusSource`, a named corpus found as Fashion-MNIST is (``registry``'s
  order): ``data_dir`` or ``$DDLF_DATA_DIR`` (``<dir>/<name>``, then ``<dir>``), the
  cache ``~/.cache/ddlf/<name>``, Debian's install path, else fetched from Debian's
  packages with ``apt-get download`` and ``dpkg-deb -x`` (no root needed) into the cache.
  The one built in is ``fortunes``: the cookie files of Debian's ``fortunes`` and
  ``fortunes-min`` (fortune-mod 1.99.1, BSD licence; about 2.7 MB of English quotations,
  jokes and verse, cookies separated by ``%`` lines).
- :class:`FileSource`, a user's own text files (a glob, a path, or a list of them), one
  document per file.

Every file is read as UTF-8 text. An empty file, one holding NUL bytes (binary data) or
one that is not UTF-8 is refused with a :class:`DatasetFormatError` naming the file and
the fix, before anything is trained.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

from .atomic import atomic_write
from .download import _fetch_lock, _run, _short
from .errors import DatasetFormatError, DatasetNotFoundError
from .paths import cache_root, data_dir_from_env
from .registry import SYSTEM_DIRS, _places

__all__ = ["CorpusSource", "FileSource", "Corpus", "CORPORA", "read_text", "fetch_corpus"]


@dataclass(frozen=True)
class Corpus:
    """A named corpus shipped by Debian packages."""

    name: str
    packages: tuple          # Debian packages holding its files, installed together
    subdir: str              # where a package puts them, under its root (and the system)
    required: tuple          # files whose absence means the copy is incomplete
    licence: str
    description: str
    seed: int = 0            # the documents' shuffle: a fixed order, part of the cache key

    def cookie_files(self, directory: str) -> list:
        """The corpus's text files in ``directory``, sorted: regular files, not the
        ``.dat`` indexes ``strfile`` made, not the ``.u8`` links to the same files."""
        out = []
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name.startswith(".") or name.endswith((".dat", ".u8")) or os.path.islink(path):
                continue
            if os.path.isfile(path):
                out.append(path)
        return out

    def probe(self, directory: str):
        """``(directory, "")`` if it holds the whole corpus, else ``(None, why not)``."""
        missing = [f for f in self.required if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            return None, f"missing {', '.join(missing)} (of packages {', '.join(self.packages)})"
        return directory, ""

    def documents(self, files: list) -> list:
        """The cookies of ``files``: each file split at its ``%`` lines, the terminal's
        overstriking (``x<BS>x``, bold in a pager) removed, empty cookies dropped, then
        shuffled in a fixed order (``seed``) so that contiguous splits of the stream are
        not one file's topic each."""
        docs = []
        for path in files:
            text = _OVERSTRIKE.sub("", read_text(path))
            for cookie in _COOKIE_SEP.split(text):
                cookie = cookie.strip("\n").rstrip()
                if cookie:
                    docs.append(cookie)
        order = np.random.default_rng(self.seed).permutation(len(docs))
        return [docs[i] for i in order]


_COOKIE_SEP = re.compile(r"^%\s*$", re.MULTILINE)
_OVERSTRIKE = re.compile(r".\x08", re.DOTALL)

CORPORA: dict[str, Corpus] = {
    "fortunes": Corpus(
        "fortunes", packages=("fortunes-min", "fortunes"), subdir="usr/share/games/fortunes",
        required=("fortunes", "riddles", "computers", "science"),
        licence="BSD (fortune-mod's licence, /usr/share/doc/fortunes/copyright); Debian main",
        description="the cookie files of Debian's fortunes and fortunes-min packages "
                    "(fortune-mod 1.99.1): about 2.7 MB of English quotations, jokes and verse"),
}


def read_text(path: str) -> str:
    """``path``'s text. ``DatasetFormatError`` naming the file for an empty file, NUL bytes
    (binary data) or bytes that are not UTF-8; ``DatasetNotFoundError`` if it is gone."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DatasetNotFoundError(f"{path}: no such file on this node") from None
    except IsADirectoryError:
        raise DatasetFormatError(f"{path} is a directory: name its text files "
                                 f"(datasets.text('{path}/*.txt'))") from None
    if not raw.strip():
        raise DatasetFormatError(f"{path} is empty (or only whitespace): a text dataset "
                                 "needs text; leave the file out")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise DatasetFormatError(f"{path} holds a NUL byte at offset {nul}: it is binary "
                                 "data, not a text file; leave it out")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetFormatError(
            f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): "
            f"convert it, e.g. iconv -f latin1 -t utf-8 {path} > {path}.utf8, or leave it "
            "out") from None


class FileSource:
    """A user's text files: one path, a glob (``"corpus/*.txt"``) or a list of either,
    each file one document, in the order given (a glob's matches sorted)."""

    def __init__(self, paths):
        self.patterns = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) \
            else [os.fspath(p) for p in paths]
        if not self.patterns:
            raise ValueError("datasets.text() needs at least one file or glob")
        self.label = ",".join(self.patterns)
        self.seed = None

    def resolve(self, download: bool = True) -> list:
        """The files, absolute. ``DatasetNotFoundError`` naming a pattern that matches none."""
        files = []
        for pattern in self.patterns:
            expanded = os.path.abspath(os.path.expanduser(pattern))
            if glob.has_magic(expanded):
                found = sorted(p for p in glob.glob(expanded) if os.path.isfile(p))
                if not found:
                    raise DatasetNotFoundError(f"text dataset: {pattern!r} matches no file "
                                               f"on this node (cwd {os.getcwd()})")
                files += found
            elif os.path.isdir(expanded):
                raise DatasetFormatError(f"text dataset: {pattern} is a directory; name its "
                                         f"files, e.g. datasets.text('{pattern}/*.txt')")
            elif not os.path.isfile(expanded):
                raise DatasetNotFoundError(f"text dataset: {pattern}: no such file on this "
                                           f"node (cwd {os.getcwd()})")
            else:
                files.append(expanded)
        return files

    def documents(self, files: list) -> list:
        return [read_text(p) for p in files]

    def __repr__(self) -> str:
        return f"FileSource({self.patterns!r})"


class CorpusSource:
    """A named corpus of :data:`CORPORA`, found on each node by the lookup order (the
    module docstring), ``data_dir`` first when given."""

    def __init__(self, name: str, data_dir: str | None = None):
        if name not in CORPORA:
            raise ValueError(f"unknown text corpus {name!r}; known: {', '.join(CORPORA)} (or "
                             "your own files: datasets.text('corpus/*.txt'))")
        self.corpus = CORPORA[name]
        self.name = name
        self.data_dir = data_dir
        self.label = name
        self.seed = self.corpus.seed

    def resolve(self, download: bool = True) -> list:
        """The corpus's files on this node, fetched into the cache if it has none (unless
        ``download=False``). ``DatasetNotFoundError`` listing every place tried and how to
        get the files."""
        corpus, tried = self.corpus, []
        if self.data_dir is None and data_dir_from_env() is None:
            tried.append("$DDLF_DATA_DIR: not set")
        for directory, label in _places(self.name, self.data_dir, corpus.packages[-1]):
            if not os.path.isdir(directory):
                tried.append(f"{directory} ({label}): no such directory")
                continue
            found, why = corpus.probe(directory)
            if found is not None:
                return corpus.cookie_files(found)
            tried.append(f"{directory} ({label}): {why}")
        if not download:
            tried.append("download: skipped (download=False)")
            raise _not_found(corpus, tried)
        path, more = _fetch(corpus)
        if path is None:
            raise _not_found(corpus, tried + more)
        return corpus.cookie_files(path)

    def documents(self, files: list) -> list:
        return self.corpus.documents(files)

    def __repr__(self) -> str:
        return f"CorpusSource({self.name!r})"


def fetch_corpus(name: str) -> str:
    """Fetch corpus ``name`` into ``<cache>/<name>`` from Debian's packages; its path.
    ``DatasetNotFoundError`` naming what failed and how to get the files by hand."""
    corpus = CORPORA[name]
    path, tried = _fetch(corpus)
    if path is None:
        raise _not_found(corpus, tried)
    return path


def _fetch(corpus: Corpus):
    """``(cache path, [])`` or ``(None, what was tried)``."""
    dest = os.path.join(cache_root(), corpus.name)
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as e:
        return None, [f"create cache directory {dest}: {e}"]
    with _fetch_lock(corpus.name):
        if corpus.probe(dest)[0] is not None:   # fetched while we waited for the lock
            return dest, []
        try:
            _apt_fetch_corpus(corpus, dest)
        except (OSError, subprocess.SubprocessError, DatasetFormatError) as e:
            return None, [f"apt-get download {' '.join(corpus.packages)} + dpkg-deb -x: "
                          f"{_short(e)}"]
        if corpus.probe(dest)[0] is None:
            return None, [f"the packages {', '.join(corpus.packages)} did not hold "
                          f"{', '.join(corpus.required)}"]
        return dest, []


def _apt_fetch_corpus(corpus: Corpus, dest: str) -> None:
    """Copy the corpus's files out of its Debian packages into ``dest``: ``apt-get
    download`` and ``dpkg-deb -x`` in a temporary directory, nothing installed. The one
    place this module reaches the network (tests replace it)."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} not found (not a Debian/Ubuntu system?)")
    with tempfile.TemporaryDirectory(prefix="ddlf-apt-") as tmp:
        _run(["apt-get", "download", *corpus.packages], cwd=tmp)
        root = os.path.join(tmp, "x")
        for package in corpus.packages:
            debs = glob.glob(os.path.join(tmp, f"{package}_*.deb"))
            if not debs:
                raise FileNotFoundError(f"apt-get download {package} produced no .deb")
            _run(["dpkg-deb", "-x", debs[0], root], cwd=tmp)
        src = os.path.join(root, corpus.subdir)
        for path in corpus.cookie_files(src):
            read_text(path)   # refuse to cache a broken package
            with open(path, "rb") as fin, \
                    atomic_write(os.path.join(dest, os.path.basename(path))) as fout:
                shutil.copyfileobj(fin, fout)


def _not_found(corpus: Corpus, tried: list) -> DatasetNotFoundError:
    pkgs = " ".join(corpus.packages)
    system = SYSTEM_DIRS.get(corpus.name, "/" + corpus.subdir)
    lines = [f"text corpus {corpus.name!r} not found. Tried, in order:"]
    lines += [f"  - {t}" for t in tried]
    lines += ["To get it, do one of:",
              f"  - as root: apt-get install {pkgs}   (puts it in {system})",
              f"  - apt-get download {pkgs} && for d in *.deb; do dpkg-deb -x $d x; done && "
              f"export DDLF_DATA_DIR=$PWD/x/{corpus.subdir}   (no root needed)",
              f"  - ddlf-train fetch {corpus.name} on a machine that reaches Debian's "
              f"archive; it fills ~/.cache/ddlf/{corpus.name}, which you can copy to other "
              "nodes"]
    return DatasetNotFoundError("\n".join(lines))
