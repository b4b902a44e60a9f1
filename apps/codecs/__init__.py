"""Codecs for weights and deltas: what crosses the wire between driver and trainers.

    from ddlf_actors.apps import codecs

    down, up = codecs.resolve_pair(("fp16", "topk:0.01"))   # weights, deltas
    enc = up.encoder()               # on a trainer: one per stream (keeps its residual)
    payload = enc.encode(delta)      # an Encoded: payload.nbytes cross the wire
    delta_hat = up.decode(payload)   # on the driver

Spec strings: ``none``, ``lz4``, ``zstd[:level]`` (lossless, bit-exact), ``fp16``,
``int8`` (per-tensor scale), ``int4[:block]`` (4 bits, a scale per block of 128),
``topk:<fraction>`` (with error feedback); ``:ef`` or
``:noef`` after a lossy codec turns error feedback on or off. Each codec's docstring
states its error bound. ``lz4`` and ``zstd`` need ``pip install 'ddlf-actors[compress]'``.

numpy only at import time; the compression libraries are imported when first used.
"""

from . import int4, lossless, quantize, topk  # noqa: F401 - importing registers the codecs
from .base import Codec, CodecUnavailableError, Encoded
from .feedback import Encoder, ErrorFeedback
from .int4 import Int4Codec
from .lossless import LZ4Codec, NoneCodec, ZstdCodec
from .quantize import FP16Codec, Int8Codec
from .registry import decode, forms, get, names, register, resolve_pair
from .topk import TopKCodec

__all__ = [
    "Codec",
    "Encoded",
    "Encoder",
    "ErrorFeedback",
    "CodecUnavailableError",
    "get",
    "resolve_pair",
    "decode",
    "register",
    "names",
    "forms",
    "NoneCodec",
    "LZ4Codec",
    "ZstdCodec",
    "FP16Codec",
    "Int8Codec",
    "Int4Codec",
    "TopKCodec",
]
