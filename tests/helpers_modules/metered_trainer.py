"""A numpy trainer that records what crosses the wire to and from it with compression=."""

from __future__ import annotations

import numpy as np

from helpers_modules.numpy_trainer import NumpyTrainer


class MeteredTrainer(NumpyTrainer):
    """Records, per train call, the weight message it got (its kind, version and payload
    bytes), the index bytes and the bytes of the delta it sent back."""

    def train_wire(self, msg, indices, epochs, batch_size, residual=False, **options):
        payload, stats = super().train_wire(msg, indices, epochs, batch_size, residual,
                                            **options)
        log = self.__dict__.setdefault("_meter", [])
        log.append({"kind": msg.kind, "version": msg.version, "down": msg.nbytes,
                    "indices": int(np.asarray(indices).nbytes), "up": payload.nbytes,
                    "codec": payload.codec})
        return payload, stats

    def meter(self) -> list:
        return list(self.__dict__.get("_meter", []))

    def replica(self):
        """The weights this trainer holds from the driver's messages."""
        return self._wire_end().weights
