"""Text served the paper's way: tokens stored once per node, windows sent by offset.

    ds = datasets.corpus("fortunes", context=128)          # or datasets.text("corpus/*.txt")
    ds.prepare()                                           # the driver: find, tokenize, check
    (x, y), (x_val, y_val) = ds.load_shared()              # a trainer: windows of its node's copy
    x[np.array([7, 3])]                # int32 (2, 128): the windows at 7*128 and 3*128

**The stream.** A source's documents (fortune cookies, or one per file) are joined into
one byte stream, each preceded by a separator (NUL), then cut into train, validation and
test as contiguous ranges (``split=(validation, test)`` fractions, each cut moved to the
next document boundary) and tokenized (:mod:`.tokenizer`). The tokens go to the node's
dataset cache once (``cache._shared``: ``<cache>/arrays/text-...``, a ``uint8`` array for
the byte tokenizer, ``uint16`` for a BPE) and every trainer on the node maps them.

**Index partitions.** A trainer's ``x`` and ``y`` are :class:`TokenWindows`, views of its
mapped array: sample ``i`` is the window of ``context`` tokens at offset
``start + i * stride`` (``y`` the same window one token on). The driver shuffles and
partitions window numbers, exactly as it does image indices, and never sends text; a
trainer's ``self.x[idx]`` gathers the windows from its map. Evaluation windows do not
overlap (stride = context), so each token of a split is scored once.

**The driver's part** (:meth:`TextDataset.prepare`, called by ``train`` before any
trainer starts): finds the files (fetching a named corpus if the node has none), trains
a BPE tokenizer on the training split when one is asked for, builds the driver node's
cache entry and checks the splits hold a window each. Bad input fails here, with the
file and the fix: an empty or binary file, a context longer than a split, a missing
corpus with no way to fetch it. It records a digest of the stream; a trainer whose node
holds other text (another version of the corpus) refuses to train on it.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from . import tokenizer as tokenizers
from .cache import _Key, _key, _shared
from .corpora import CorpusSource, FileSource
from .errors import DatasetFormatError
from .identity import files_stamp

__all__ = ["TextDataset", "TokenWindows", "text", "corpus", "bits_per_byte", "SPLITS"]

SPLITS = ("train", "validation", "test")
# Part of every text entry's key: bump it when the stream's making changes.
TEXT_FORMAT = "text-v1"
SEP = b"\0"


class TokenWindows:
    """Windows of a token array, by number: ``self[i]`` is ``tokens[s : s + context]``
    with ``s = start + shift + i * stride`` (``shift`` 1 for the targets). Indexing with
    an int array or a slice gathers ``int32`` rows; ``len`` is the number of windows."""

    def __init__(self, tokens: np.ndarray, start: int, stop: int, context: int, stride: int,
                 shift: int = 0):
        self.tokens = tokens
        self.start, self.stop = int(start), int(stop)
        self.context, self.stride, self.shift = int(context), int(stride), int(shift)
        span = self.stop - self.start - self.context - 1   # x and y both fit
        self.count = 0 if span < 0 else span // self.stride + 1
        self._offsets = np.arange(self.context, dtype=np.int64)

    def __len__(self) -> int:
        return self.count

    @property
    def shape(self) -> tuple:
        return (self.count, self.context)

    ndim = 2
    dtype = np.dtype(np.int32)

    def offsets(self, idx) -> np.ndarray:
        """Where windows ``idx`` start in the token array (what an index stands for)."""
        return self.start + self.shift + np.asarray(idx, dtype=np.int64) * self.stride

    def __getitem__(self, idx) -> np.ndarray:
        if isinstance(idx, slice):
            idx = np.arange(self.count)[idx]
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"windows are indexed by ints, got {idx.dtype}")
        flat = idx.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= self.count):
            raise IndexError(f"window index out of range 0..{self.count - 1}")
        rows = self.tokens[self.offsets(flat)[:, None] + self._offsets]
        return rows.astype(np.int32).reshape(idx.shape + (self.context,))

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return (f"TokenWindows({self.count} windows of {self.context}, tokens "
                f"{self.start}..{self.stop}, stride {self.stride}, shift {self.shift})")


class TextDataset:
    """A text source tokenized and served as windows of ``context`` tokens.

    ``source``: a :class:`~.corpora.CorpusSource` or :class:`~.corpora.FileSource` (use
    :func:`corpus` and :func:`text`). ``tokenizer``: ``"byte"`` (default) or ``"bpe:N"``.
    ``split``: the validation and test fractions of the stream (the rest trains).
    ``stride``: between training windows (default ``context``: each token once per
    epoch). ``eval_split``: the split history rows are evaluated on (``test_loss`` and
    ``test_accuracy`` of a text run are of this split; the validation one by default,
    so that choices made on it leave the test split unseen). ``eval_windows``: evaluate
    on the split's first N windows only (faster rows; default: all of it).
    """

    def __init__(self, source, *, context: int = 128, tokenizer="byte",
                 split: tuple = (0.05, 0.05), stride: int | None = None,
                 eval_split: str = "validation", eval_windows: int | None = None):
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise ValueError(f"context must be an int >= 1, got {context!r}")
        if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int)
                                   or stride < 1):
            raise ValueError(f"stride must be an int >= 1, got {stride!r}")
        val, test = (float(f) for f in split)
        if not (0 < val < 1 and 0 <= test < 1 and val + test < 1):
            raise ValueError(f"split=(validation, test) must be fractions with validation > 0 "
                             f"and validation + test < 1, got {split!r}")
        if eval_split not in ("validation", "test"):
            raise ValueError(f"eval_split must be 'validation' or 'test', got {eval_split!r}")
        if eval_windows is not None and (isinstance(eval_windows, bool)
                                         or not isinstance(eval_windows, int)
                                         or eval_windows < 1):
            raise ValueError(f"eval_windows must be an int >= 1, got {eval_windows!r}")
        self.source = source
        self.context = context
        self.stride = stride or context
        self.split = (val, test)
        self.eval_split = eval_split
        self.eval_windows = eval_windows
        self.tokenizer = tokenizers.make(tokenizer)
        self.info: dict | None = None        # after prepare(): sizes, bytes, digest
        self.__name__ = (f"text:{source.label}/{self.tokenizer.spec}/context={context}"
                         + (f"/stride={self.stride}" if self.stride != context else "")
                         + (f"/eval_windows={eval_windows}" if eval_windows else ""))

    # -- what the driver and the callbacks read -------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def tokens_per_byte(self, split: str | None = None) -> float:
        """Tokens per byte of text in ``split`` (the evaluation split by default): what
        turns a loss per token into bits per byte. Needs :meth:`prepare`."""
        info = self._prepared()
        split = split or self.eval_split
        return info["tokens"][split] / max(1, info["bytes"][split])

    def windows(self, split: str = "train") -> int:
        """How many windows ``split`` serves (training ones at ``stride``)."""
        return self._prepared()["windows"][split]

    def _prepared(self) -> dict:
        if self.info is None:
            raise RuntimeError("call prepare() first (train() does, on the driver)")
        return self.info

    # -- the driver ------------------------------------------------------------------------------
    def prepare(self) -> TextDataset:
        """On the driver, before trainers start: find the files (fetching a named corpus
        this node lacks), train the tokenizer if it is a BPE, build this node's cache entry
        and check each split holds a window. Returns self. Raises
        ``DatasetNotFoundError``, ``DatasetFormatError`` (a bad file, a split too short)."""
        files = self.source.resolve()
        if isinstance(self.tokenizer, tokenizers.BpeTokenizer) and not self.tokenizer.trained:
            stream, cuts = self._stream(files)
            train = stream[:cuts[0]].decode("utf-8")
            self.tokenizer = self.tokenizer.trained_on(d for d in train.split("\0") if d)
        arrays = self._entry(files)
        self.info = _describe(arrays, self.context, self.stride)
        self._check_sizes()
        return self

    def _check_sizes(self) -> None:
        info = self._prepared()
        need = self.context + 1
        for split in ("train", self.eval_split):
            have = info["tokens"][split]
            if have < need:
                raise DatasetFormatError(
                    f"the {split} split of {self.__name__} has {have} tokens, fewer than "
                    f"context + 1 = {need}: use a shorter context, a larger split (now "
                    f"validation, test = {self.split}), or more text")

    def check_model(self, info: dict) -> None:
        """``ValueError`` when the model a trainer built cannot take this dataset's ids:
        its first weight, the token embedding of ``gpt_tiny`` (and of nanoGPT-style
        models), has fewer rows than the tokenizer has ids. ``info`` is the trainer's
        ``describe()``; a model whose first weight is not a matrix is not checked."""
        weights = info.get("weights") or []
        shape = weights[0][0] if weights else []
        if len(shape) == 2 and shape[0] < self.vocab_size:
            raise ValueError(
                f"the model's token embedding (its first weight, {tuple(shape)}) has "
                f"{shape[0]} rows for the {self.vocab_size} ids of {self.tokenizer.spec}: "
                f"build the model with vocab_size=dataset.vocab_size ({self.vocab_size}), "
                "e.g. lm.GptModelFn(dataset)")

    # -- the trainers ----------------------------------------------------------------------------
    def load_shared(self):
        """``((x, y), (x_eval, y_eval))`` as :class:`TokenWindows` over this node's mapped
        tokens: the training windows and those of ``eval_split``. A trainer's
        ``load_data`` gets this from ``datasets.load_shared(ds)``. Raises
        ``DatasetFormatError`` if this node's text differs from the driver's."""
        arrays = self._entry(self.source.resolve())
        digest = bytes(np.asarray(arrays["digest"])).hex()
        if self.info is not None and digest != self.info["digest"]:
            raise DatasetFormatError(
                f"this node's copy of {self.source.label} is not the driver's (its token "
                f"stream's sha256 is {digest[:12]}..., the driver's {self.info['digest'][:12]}"
                "...): give every node the same files (e.g. the same Debian package version, "
                "or one DDLF_DATA_DIR copy)")
        tokens, bounds = arrays["tokens"], [int(b) for b in arrays["bounds"]]
        train = (TokenWindows(tokens, bounds[0], bounds[1], self.context, self.stride),
                 TokenWindows(tokens, bounds[0], bounds[1], self.context, self.stride, 1))
        k = SPLITS.index(self.eval_split)
        lo, hi = bounds[k], bounds[k + 1]
        if self.eval_windows:
            hi = min(hi, lo + self.eval_windows * self.context + 1)
        if hi - lo < self.context + 1:
            return train, (None, None)
        evals = (TokenWindows(tokens, lo, hi, self.context, self.context),
                 TokenWindows(tokens, lo, hi, self.context, self.context, 1))
        return train, evals

    def split_windows(self, split: str):
        """``(x, y)`` windows of any split (stride = context), e.g. the test split for a
        final evaluation the run never saw."""
        arrays = self._entry(self.source.resolve())
        k = SPLITS.index(split)
        lo, hi = (int(b) for b in arrays["bounds"][k:k + 2])
        stride = self.stride if split == "train" else self.context
        return (TokenWindows(arrays["tokens"], lo, hi, self.context, stride),
                TokenWindows(arrays["tokens"], lo, hi, self.context, stride, 1))

    # -- the cache entry -------------------------------------------------------------------------
    def _key(self, files: list) -> _Key:
        where = [TEXT_FORMAT, *files, self.tokenizer.spec, *self.split, self.source.seed]
        stamp = [TEXT_FORMAT, files_stamp(files), self.tokenizer.digest]
        return _key("text", where, stamp)

    def _entry(self, files: list) -> dict:
        if isinstance(self.tokenizer, tokenizers.BpeTokenizer) and not self.tokenizer.trained:
            raise RuntimeError(f"{self.__name__}: the BPE tokenizer is not trained; call "
                               "prepare() on the driver first (train() does)")
        return _shared(self._key(files), lambda: self._build(files))

    def _stream(self, files: list) -> tuple[bytes, tuple[int, int]]:
        docs = self.source.documents(files)
        stream = b"".join(SEP + d.encode("utf-8") for d in docs)
        n = len(stream)
        val, test = self.split
        first = _cut(stream, int(n * (1 - val - test)))
        second = max(first, _cut(stream, int(n * (1 - test)))) if test else n
        return stream, (first, second)

    def _build(self, files: list) -> dict:
        stream, (a, b) = self._stream(files)
        parts = [stream[:a], stream[a:b], stream[b:]]
        ids = [self.tokenizer.encode_stream(p) for p in parts]
        dtype = np.uint8 if self.tokenizer.vocab_size <= 256 else np.uint16
        tokens = np.concatenate([i.astype(dtype) for i in ids]) if ids else np.zeros(0, dtype)
        bounds = np.cumsum([0] + [len(i) for i in ids]).astype(np.int64)
        return {"tokens": tokens, "bounds": bounds,
                "bytes": np.asarray([len(p) for p in parts], np.int64),
                "digest": np.frombuffer(hashlib.sha256(stream).digest(), np.uint8).copy()}

    def __repr__(self) -> str:
        return f"TextDataset({self.__name__!r})"


def _cut(stream: bytes, at: int) -> int:
    """A cut at or after byte ``at``: the next document start, else the next line, else
    the next UTF-8 character; the end of the stream if none is left."""
    n = len(stream)
    if at >= n:
        return n
    for mark in (SEP, b"\n"):
        i = stream.find(mark, at)
        if i >= 0:
            return i if mark == SEP else i + 1
    while at < n and (stream[at] & 0xC0) == 0x80:   # a UTF-8 continuation byte
        at += 1
    return at


def _describe(arrays: dict, context: int, stride: int) -> dict:
    bounds = [int(b) for b in arrays["bounds"]]
    tokens = {s: bounds[i + 1] - bounds[i] for i, s in enumerate(SPLITS)}
    nbytes = {s: int(arrays["bytes"][i]) for i, s in enumerate(SPLITS)}

    def count(n, step):
        return 0 if n < context + 1 else (n - context - 1) // step + 1

    windows = {s: count(tokens[s], stride if s == "train" else context) for s in SPLITS}
    return {"tokens": tokens, "bytes": nbytes, "windows": windows,
            "digest": bytes(np.asarray(arrays["digest"])).hex()}


def text(paths, **options) -> TextDataset:
    """A :class:`TextDataset` of your own UTF-8 text files: a path, a glob
    (``"corpus/*.txt"``) or a list of them, one document per file. ``options`` as
    :class:`TextDataset` (``context=``, ``tokenizer=``, ``split=`` ...). The files must be
    at the same paths on every node (as ``data_dir`` is)."""
    return TextDataset(FileSource(paths), **options)


def corpus(name: str = "fortunes", data_dir: str | None = None, **options) -> TextDataset:
    """A :class:`TextDataset` of a named corpus (``"fortunes"``), found on each node as
    Fashion-MNIST is (``data_dir``, ``$DDLF_DATA_DIR``, the cache, Debian's install path,
    else fetched from Debian's packages)."""
    return TextDataset(CorpusSource(name, data_dir), **options)


def bits_per_byte(loss: float, tokens_per_byte: float) -> float:
    """A mean loss per token (nats) as bits per byte of text."""
    return loss * tokens_per_byte / math.log(2)
