"""Encoders: one per stream, holding what a stream keeps between calls.

A trainer makes one encoder per stream it sends (``codec.encoder()``) and calls
``encoder.encode(delta)`` each round; the receiver only needs the stateless codec
(``codec.decode(payload)``). With error feedback the encoder keeps the residual, what
the codec dropped, and adds it to the next input, so nothing is lost for good: after
any number of calls, the sum of what the receiver decoded plus the residual equals the
sum of the inputs (up to float rounding). Karimireddy et al. (2019), "Error Feedback
Fixes SignSGD", and Stich et al. (2018), "Sparsified SGD with Memory", show this keeps
SGD's convergence under top-k and other biased compressors.
"""

from __future__ import annotations

import numpy as np

from .base import Codec, Encoded, as_arrays

__all__ = ["Encoder", "ErrorFeedback"]


class Encoder:
    """A stream's encoder without state: ``encode`` is ``codec.encode``."""

    def __init__(self, codec: Codec):
        self.codec = codec

    @property
    def residual(self) -> list | None:
        """What the stream has not yet delivered: always None here."""
        return None

    def encode(self, arrays) -> Encoded:
        return self.codec.encode(arrays)

    def reset(self) -> None:
        """Forget the stream's state (nothing to forget here)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.codec!r})"


class ErrorFeedback(Encoder):
    """A stream's encoder with error feedback.

    Each call encodes ``arrays + residual`` and keeps the new residual, ``(arrays +
    residual) − decoded``, per tensor, in the tensor's dtype. Use it for streams whose
    receiver adds up what it decodes (deltas); for whole weights it would add last
    round's error to this round's weights. All calls on one encoder must pass tensors of
    the same shapes and dtypes (ValueError otherwise: make one encoder per stream).
    """

    def __init__(self, codec: Codec):
        super().__init__(codec)
        self._residual: list | None = None
        self._layout: list | None = None

    @property
    def residual(self) -> list | None:
        """Per tensor, what is still owed to the receiver (None before the first call, and
        None for tensors that the codec sends exactly). Not a copy: do not modify."""
        return self._residual

    def encode(self, arrays) -> Encoded:
        arrays = as_arrays(arrays)
        layout = [(a.shape, a.dtype) for a in arrays]
        if self._residual is None:
            corrected = arrays
        else:
            if layout != self._layout:
                raise ValueError(
                    f"this error-feedback encoder was used for tensors "
                    f"{_describe(self._layout)} and is now given {_describe(layout)}: make one "
                    "encoder per stream (codec.encoder()), or call reset() to start over")
            corrected = [a if r is None else a + r for a, r in zip(arrays, self._residual)]
        payload, errors = self.codec.encode_with_error(corrected)
        self._residual, self._layout = errors, layout
        return payload

    def reset(self) -> None:
        """Drop the residual, e.g. when the receiver was restarted and lost what it had summed."""
        self._residual = self._layout = None

    def residual_norm(self) -> float:
        """The residual's L2 norm over all tensors (0.0 before the first call)."""
        if not self._residual:
            return 0.0
        return float(np.sqrt(sum(float(np.vdot(r, r)) for r in self._residual
                                 if r is not None)))


def _describe(layout) -> str:
    return "[" + ", ".join(f"{np.dtype(d).name}{tuple(s)}" for s, d in layout) + "]"
