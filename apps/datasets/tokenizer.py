"""Tokenizers for text datasets: bytes (the default, no dependency) or a trained BPE.

    tok = tokenizer.make("byte")                  # 256 ids: a text's UTF-8 bytes
    tok = tokenizer.make("bpe:2048").trained_on(texts)   # Hugging Face ``tokenizers``
    ids = tok.encode("Hello")                     # numpy array of ids
    tok.decode(ids)                               # back to text

Documents are separated by one id, :attr:`Tokenizer.separator` (0 in both): the byte NUL,
which valid text never holds (the readers refuse it), or BPE's ``<|endoftext|>``. A
stream is ``sep doc sep doc ...``, so the separator alone is the prompt that starts a
new document.

A tokenizer is saved with its run (:meth:`Tokenizer.save`, ``tokenizer.json``) and read
back by :func:`load`. A BPE tokenizer pickles as its JSON, so trainers get the driver's
trained tokenizer, never one trained again.
"""

from __future__ import annotations

import json
import re
from typing import Iterable

import numpy as np

__all__ = ["Tokenizer", "ByteTokenizer", "BpeTokenizer", "make", "load", "from_json",
           "TokenizerUnavailableError", "MAX_VOCAB", "SEPARATOR_TEXT"]

# Ids are stored as uint16 in the cache (uint8 when the vocabulary fits a byte).
MAX_VOCAB = 1 << 16
# The BPE separator's text (GPT-2's).
SEPARATOR_TEXT = "<|endoftext|>"
_SPEC = re.compile(r"^(byte|bpe:(\d+))$")


class TokenizerUnavailableError(ImportError, ValueError):
    """``bpe`` needs Hugging Face's ``tokenizers``, which is not installed (the message
    names the pip command). Both an ``ImportError`` and a ``ValueError``, as the codecs'."""


class Tokenizer:
    """Text to ids and back. ``spec`` names it (``"byte"``, ``"bpe:2048"``)."""

    spec: str = ""
    vocab_size: int = 0
    separator: int = 0

    def encode_stream(self, stream: bytes) -> np.ndarray:
        """Ids of ``stream``: UTF-8 text whose documents are separated by NUL bytes, each
        NUL becoming :attr:`separator`."""
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text`` (one document, no separator added)."""
        return self.encode_stream(text.encode("utf-8"))

    def decode(self, ids) -> str:
        """The text of ``ids``; a separator becomes a blank line, bytes that do not make
        UTF-8 (a cut mid-character) become U+FFFD."""
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    def save(self, path: str) -> None:
        """Write the tokenizer as JSON to ``path`` (``tokenizer.json`` in a run's folder)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @property
    def digest(self) -> str:
        """What the cache keys tokens by: a sha256 of the JSON."""
        import hashlib

        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(Tokenizer):
    """A text's UTF-8 bytes are its ids: 256 of them, no training, nothing to install."""

    spec = "byte"
    vocab_size = 256
    separator = 0

    def encode_stream(self, stream: bytes) -> np.ndarray:
        return np.frombuffer(bytes(stream), dtype=np.uint8).copy()

    def decode(self, ids) -> str:
        raw = np.asarray(ids, dtype=np.int64)
        if raw.size and (raw.min() < 0 or raw.max() > 255):
            raise ValueError(f"byte ids must be in 0..255, got {int(raw.min())}..{int(raw.max())}")
        return bytes(raw.astype(np.uint8)).replace(b"\0", b"\n\n").decode("utf-8", "replace")

    def to_json(self) -> str:
        return json.dumps({"ddlf_tokenizer": "byte", "vocab_size": 256, "separator": 0})


class BpeTokenizer(Tokenizer):
    """A byte-level BPE of Hugging Face ``tokenizers`` (GPT-2's kind), ``<|endoftext|>`` as
    id 0. Make one with :meth:`trained_on`; it pickles as its JSON."""

    def __init__(self, vocab_size: int, json_text: str | None = None):
        self.spec = f"bpe:{int(vocab_size)}"
        self.separator = 0
        self._json = json_text
        self._tok = None
        # Trained: the ids it has (a small text has fewer merges to learn than asked for).
        self.vocab_size = int(vocab_size) if json_text is None else \
            self._tokenizer().get_vocab_size()

    @property
    def trained(self) -> bool:
        return self._json is not None

    def _tokenizer(self):
        if self._json is None:
            raise RuntimeError(f"{self.spec} is not trained yet: the dataset's prepare() "
                               "trains it on the driver (datasets.TextDataset.prepare)")
        if self._tok is None:
            self._tok = _hf().Tokenizer.from_str(self._json)
        return self._tok

    def trained_on(self, texts: Iterable[str]) -> BpeTokenizer:
        """A tokenizer of this size trained on ``texts`` (deterministic for the same texts)."""
        hf = _hf()
        tok = hf.Tokenizer(hf.models.BPE())
        tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = hf.decoders.ByteLevel()
        trainer = hf.trainers.BpeTrainer(
            vocab_size=self.vocab_size, special_tokens=[SEPARATOR_TEXT], show_progress=False,
            initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        return BpeTokenizer(int(self.spec.split(":")[1]), tok.to_str())

    def encode_stream(self, stream: bytes) -> np.ndarray:
        text = bytes(stream).decode("utf-8").replace("\0", SEPARATOR_TEXT)
        ids = self._tokenizer().encode(text).ids
        return np.asarray(ids, dtype=np.uint16)

    def decode(self, ids) -> str:
        tok = self._tokenizer()
        out: list[str] = []
        part: list[int] = []
        for i in np.asarray(ids, dtype=np.int64).tolist():
            if i == self.separator:
                out.append(tok.decode(part))
                part = []
            else:
                part.append(int(i))
        out.append(tok.decode(part))
        return "\n\n".join(out)

    def to_json(self) -> str:
        if self._json is None:
            return json.dumps({"ddlf_tokenizer": self.spec, "trained": False})
        return self._json

    def __getstate__(self):
        return {"spec": self.spec, "json_text": self._json}

    def __setstate__(self, state):
        BpeTokenizer.__init__(self, int(state["spec"].split(":")[1]), state["json_text"])


def _hf():
    try:
        import tokenizers
    except ImportError:
        raise TokenizerUnavailableError(
            "tokenizer 'bpe:N' needs Hugging Face's tokenizers: pip install "
            "'ddlf-actors[text]' (on every machine of the cluster), or use tokenizer='byte'"
        ) from None
    return tokenizers


def make(spec) -> Tokenizer:
    """A tokenizer from ``spec``: ``"byte"``, ``"bpe:N"`` (untrained: a text dataset's
    ``prepare`` trains it) or a :class:`Tokenizer` itself. ``ValueError`` for anything
    else, :class:`TokenizerUnavailableError` for ``bpe`` without ``tokenizers``."""
    if isinstance(spec, Tokenizer):
        return spec
    m = _SPEC.match(str(spec).strip()) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"tokenizer {spec!r}: use 'byte' (256 ids, the default) or 'bpe:N' "
                         "(a byte-level BPE of N ids trained on the training split)")
    if m.group(1) == "byte":
        return ByteTokenizer()
    size = int(m.group(2))
    if not 257 <= size <= MAX_VOCAB:
        raise ValueError(f"tokenizer {spec!r}: a BPE vocabulary must be 257..{MAX_VOCAB} "
                         "(its 256 bytes, the separator and the merges)")
    _hf()
    return BpeTokenizer(size)


def from_json(text: str) -> Tokenizer:
    """The tokenizer :meth:`Tokenizer.to_json` wrote. ``ValueError`` if it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a tokenizer's JSON: {e}") from None
    kind = data.get("ddlf_tokenizer") if isinstance(data, dict) else None
    if kind == "byte":
        return ByteTokenizer()
    if isinstance(data, dict) and isinstance(data.get("model"), dict) \
            and data["model"].get("type") == "BPE":
        _hf()
        tok = BpeTokenizer(257, text)
        tok.spec = f"bpe:{tok.vocab_size}"
        return tok
    raise ValueError("not a tokenizer DDLF wrote (no 'ddlf_tokenizer' key and no BPE model)")


def load(path: str) -> Tokenizer:
    """The tokenizer saved at ``path`` (``tokenizer.json`` of a run)."""
    with open(path, encoding="utf-8") as f:
        return from_json(f.read())
