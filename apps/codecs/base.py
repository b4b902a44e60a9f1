"""What every codec shares: the ``Codec`` base class and the ``Encoded`` payload.

A codec turns a list of numpy arrays (a model's weights, or a delta) into an
:class:`Encoded` payload and back. A payload is a small ``header`` (per tensor: shape,
dtype, method, segment count and one optional scalar) plus ``segments``, numpy arrays
that hold the bulk. Pickled with protocol 5, each large segment travels as its own
out-of-band buffer, uncopied, exactly as a raw array would; so ``payload.nbytes``, the
segments' bytes, is what crosses the wire, and for the ``none`` codec it equals the
arrays' own ``nbytes``.

A subclass implements two per-tensor hooks, :meth:`Codec.encode_tensor` and
:meth:`Codec.decode_tensor`; the loop over tensors, the checks on input and payload,
and tensors sent as they are ("raw") live here once.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

from .arrays import as_arrays
from .feedback import Encoder, ErrorFeedback

__all__ = ["Codec", "Encoded", "CodecUnavailableError", "RAW", "raw", "require",
           "segment", "check_finite", "is_lossy_float"]

# The method name of a tensor sent as it is: one segment, the array itself.
RAW = "raw"


class CodecUnavailableError(ImportError, ValueError):
    """A codec's library is not installed in this process.

    The message names the codec, the missing package and the pip command. It is an
    ``ImportError`` (a module is missing) and a ``ValueError`` (the spec cannot be used
    here), so code that checks either kind of error for a bad option catches it.
    """


def require(codec: str, module: str, pip_name: str):
    """Import ``module`` for ``codec``, or raise :class:`CodecUnavailableError` with the fix."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise CodecUnavailableError(
            f"codec {codec!r} needs the Python package {pip_name!r}, which cannot be imported "
            f"in this process ({sys.executable}: {e}). Install it on every machine that runs "
            f"the driver or a trainer: pip install {pip_name}  (or pip install "
            f"'ddlf-actors[compress]' for lz4 and zstandard), or pick another codec.") from e


class Encoded:
    """An encoded list of tensors: what one encoder call sends over the wire.

    ``codec`` is the name of the codec that made it, ``header`` holds one small tuple per
    tensor ``(shape, dtype_str, method, n_segments, scalar)`` and ``segments`` the numpy
    arrays with the data. Picklable (protocol 5 ships large segments out of band).
    """

    __slots__ = ("codec", "header", "segments")

    def __init__(self, codec: str, header: tuple, segments: tuple):
        self.codec = codec
        self.header = header
        self.segments = segments

    @property
    def nbytes(self) -> int:
        """Bytes of the segments: the data that crosses the wire.

        The header (shape, dtype and at most one scalar per tensor, a few tens of bytes
        each) is not counted, just as a raw array's own pickled shape and dtype are not.
        """
        return int(sum(s.nbytes for s in self.segments))

    def __len__(self) -> int:
        return len(self.header)

    def __reduce__(self):
        return Encoded, (self.codec, self.header, self.segments)

    def __repr__(self) -> str:
        return (f"Encoded(codec={self.codec!r}, tensors={len(self.header)}, "
                f"nbytes={self.nbytes})")


class Codec:
    """Encodes a list of arrays into an :class:`Encoded` payload and decodes it back.

    Subclasses set ``name`` (the registry key), ``form`` (how a spec string for it
    looks, for error messages) and ``lossless``, and implement :meth:`encode_tensor` and
    :meth:`decode_tensor`. A codec object holds only its parameters: it is stateless,
    picklable and may be shared by threads. State that spans calls (error feedback)
    lives in the :class:`~.feedback.Encoder` that :meth:`encoder` returns, one per stream.
    """

    name = ""
    form = ""
    lossless = True
    # Lossy codecs: whether encoder() keeps an error-feedback residual unless told.
    default_feedback = False
    # True when one decoded payload is far from its input and only the running sum of a
    # stream (with error feedback) tracks the inputs' sum: top-k. A scheme must send such
    # a codec quantities that the receiver adds up (deltas, weight changes), never whole
    # weights, which it would zero all but a fraction of.
    needs_summing = False

    def __init__(self, *, error_feedback: bool | None = None):
        if error_feedback and self.lossless:
            raise ValueError(f"codec {self.name!r} is lossless: error feedback does not "
                             "apply (there is no error to feed back)")
        self.error_feedback = (self.default_feedback if error_feedback is None
                               else bool(error_feedback))

    # -- spec strings -----------------------------------------------------------------------
    @classmethod
    def from_param(cls, text: str | None, error_feedback: bool | None) -> Codec:
        """Build from the text after ``name:`` in a spec (None if there is none).

        Raises ValueError for a parameter this codec does not take or cannot use.
        """
        if text is not None:
            raise ValueError(f"codec {cls.name!r} takes no parameter, got {text!r}")
        return cls(error_feedback=error_feedback)

    @classmethod
    def decoder(cls) -> Codec:
        """An instance that decodes any payload of this codec, whatever parameters encoded
        it (decoding reads all it needs from the payload)."""
        return cls.from_param(None, None)

    def param_text(self) -> str | None:
        """The parameter as it appears in :attr:`spec` (None for none)."""
        return None

    @property
    def spec(self) -> str:
        """The canonical spec string: ``get(codec.spec)`` gives an equal codec."""
        parts = [self.name]
        p = self.param_text()
        if p is not None:
            parts.append(p)
        if self.error_feedback != self.default_feedback:
            parts.append("ef" if self.error_feedback else "noef")
        return ":".join(parts)

    def predicted_nbytes(self, size: int, dtype) -> int | None:
        """The bytes one tensor of ``size`` elements of ``dtype`` takes once encoded, when
        that does not depend on its values; None when it does (a compressor's output).

        It assumes the codec's usual method: the rare tensors a codec sends as they are
        because of their values (int8's subnormal scales, fp16's tensors at the ends of
        float32's range) take their raw bytes instead. What a ring collective can foretell
        it will send (``ring.ring_send_bytes``).
        """
        return None

    @classmethod
    def available(cls) -> None:
        """Raise :class:`CodecUnavailableError` if this codec's library is missing."""

    def __repr__(self) -> str:
        return f"codecs.get({self.spec!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Codec) and type(other) is type(self) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash((type(self), self.spec))

    # -- streams ----------------------------------------------------------------------------
    def encoder(self, error_feedback: bool | None = None):
        """A new encoder for one stream (e.g. one trainer's deltas).

        With error feedback (``error_feedback``, default this codec's setting) it keeps
        what the codec dropped and adds it to the stream's next input; only meaningful
        when the receiver sums what it decodes (deltas, not whole weights).
        """
        ef = self.error_feedback if error_feedback is None else bool(error_feedback)
        if ef and self.lossless:
            raise ValueError(f"codec {self.name!r} is lossless: error feedback does not apply")
        return ErrorFeedback(self) if ef else Encoder(self)

    # -- whole lists ------------------------------------------------------------------------
    def encode(self, arrays) -> Encoded:
        """Encode a list of arrays. Raises TypeError for non-numeric input, ValueError for
        values this codec cannot represent (see the codec's docstring)."""
        header: list = []
        segments: list = []
        for i, a in enumerate(as_arrays(arrays)):
            method, segs, scalar = self.encode_tensor(i, a)
            header.append((a.shape, a.dtype.str, method, len(segs), scalar))
            segments.extend(segs)
        return Encoded(self.name, tuple(header), tuple(segments))

    def decode(self, payload: Encoded) -> list:
        """The arrays, with their original shapes and dtypes.

        They may be read-only views of the payload's buffers: copy before writing in place.
        Raises ValueError for a payload of another codec or one that is malformed.
        """
        self.check_payload(payload)
        out, pos = [], 0
        for shape, dtype, method, nseg, scalar in payload.header:
            segs = payload.segments[pos:pos + nseg]
            pos += nseg
            dtype = np.dtype(dtype)
            if method == RAW:
                out.append(decode_raw(segs, shape, dtype))
            else:
                out.append(self.decode_tensor(method, segs, scalar, tuple(shape), dtype))
        return out

    def encode_with_error(self, arrays) -> tuple[Encoded, list]:
        """``(payload, errors)``: errors[i] = arrays[i] − decoded[i], or None where the
        tensor went through exactly. What an error-feedback encoder keeps."""
        arrays = as_arrays(arrays)
        payload = self.encode(arrays)
        errors: list = []
        pos = 0
        for a, (_shape, _dtype, method, nseg, scalar) in zip(arrays, payload.header):
            segs = payload.segments[pos:pos + nseg]
            pos += nseg
            if method == RAW or self.lossless:
                errors.append(None)
            else:
                errors.append(self.tensor_error(a, method, segs, scalar))
        return payload, errors

    def check_payload(self, payload) -> None:
        """ValueError unless ``payload`` is an :class:`Encoded` of this codec, well formed."""
        if not isinstance(payload, Encoded):
            raise ValueError(f"codec {self.name!r} decodes an Encoded payload (what its "
                             f"encode returns), got {type(payload).__name__}")
        if payload.codec != self.name:
            raise ValueError(f"payload was encoded with codec {payload.codec!r}, not "
                             f"{self.name!r}: decode it with codecs.get({payload.codec!r}) "
                             "or codecs.decode(payload)")
        if sum(h[3] for h in payload.header) != len(payload.segments):
            raise ValueError(f"malformed {self.name!r} payload: its header names "
                             f"{sum(h[3] for h in payload.header)} segments, it holds "
                             f"{len(payload.segments)}")

    # -- per tensor: what a subclass implements ---------------------------------------------
    def encode_tensor(self, index: int, a: np.ndarray) -> tuple[str, tuple, object]:
        """Encode tensor ``index``: return ``(method, segments, scalar)``.

        ``segments`` is a tuple of numpy arrays; ``scalar`` a small Python value (or
        None) kept in the header. Return :func:`raw` ``(a)`` to send the tensor as it is.
        """
        raise NotImplementedError

    def decode_tensor(self, method: str, segments: tuple, scalar, shape: tuple,
                      dtype: np.dtype) -> np.ndarray:
        """Decode one tensor that :meth:`encode_tensor` encoded with ``method``."""
        raise NotImplementedError

    def tensor_error(self, a: np.ndarray, method: str, segments: tuple, scalar) -> np.ndarray:
        """``a`` minus its decoding (override where there is a cheaper way)."""
        return a - self.decode_tensor(method, segments, scalar, a.shape, a.dtype)


def raw(a: np.ndarray) -> tuple[str, tuple, None]:
    """The encoding of a tensor sent as it is (no copy when ``a`` is contiguous)."""
    return RAW, (np.ascontiguousarray(a),), None


def decode_raw(segments: tuple, shape, dtype: np.dtype) -> np.ndarray:
    (seg,) = segments
    return segment(seg, dtype, int(np.prod(shape, dtype=np.int64)), RAW).reshape(shape)


def segment(seg, dtype, size: int, what: str) -> np.ndarray:
    """``seg`` as an array, checked to hold ``size`` elements of ``dtype``; ValueError if not.

    Decoders call this rather than casting, so a malformed payload fails loudly instead
    of decoding into silently wrong numbers.
    """
    seg = np.asarray(seg)
    if seg.dtype != np.dtype(dtype) or seg.size != size:
        raise ValueError(f"malformed {what} segment: {seg.dtype}[{seg.size}] where "
                         f"{np.dtype(dtype)}[{size}] was expected")
    return seg


def check_finite(codec: str, index: int, a: np.ndarray) -> float:
    """max |a| as a float; ValueError naming the tensor if it holds NaN or inf."""
    # Two reductions and no temporary: np.abs(a).max() would allocate a copy of a.
    m = float(max(a.max(), -a.min()))
    if not np.isfinite(m):
        raise ValueError(f"tensor {index} (shape {a.shape}) holds NaN or inf, which the lossy "
                         f"codec {codec!r} cannot encode; the model has probably diverged "
                         "(lower the learning rate), or use a lossless codec")
    return m


def is_lossy_float(a: np.ndarray) -> bool:
    """Lossy codecs apply to float16/32/64 tensors with data; all else is sent raw."""
    return a.dtype.kind == "f" and a.dtype.itemsize <= 8 and a.size > 0
