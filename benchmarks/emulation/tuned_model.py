"""The scaling table's models: ``models.wide_cnn`` (or another ``--model``) built after a
seed and compiled with one optimizer of the selection grid.

    GRID                                   # the candidates, defined here once
    TunedModel("wide_cnn", 1, GRID[1])     # a picklable model_fn: DDLF's trainers take it
    parse_optimizer("adam:0.002")          # a candidate from the command line

Every column of ``cluster_emu.py scaling`` builds its model through :class:`TunedModel`:
the single process, data-parallel with its chosen optimizer, DDLF's defaults and best
setting with the model's own (``{"optimizer": "default"}``: whatever ``wide_cnn``
compiles when the run starts). The weights depend on the seed alone (the optimizer is
compiled after they are made), so every run of a seed starts from the same initial
weights, whatever its column or candidate (``tests/test_unit_scaling.py`` checks it).
"""

from __future__ import annotations

__all__ = ["GRID", "MODEL_DEFAULT", "TunedModel", "parse_optimizer", "label"]

# The selection grid of issue 30 section 1, the same for every tuned column and every K:
# Adam and SGD with momentum 0.9 at a constant rate.
GRID: tuple[dict, ...] = (
    *({"optimizer": "adam", "lr": lr} for lr in (3e-4, 1e-3, 2e-3, 4e-3)),
    *({"optimizer": "sgd", "lr": lr, "momentum": 0.9} for lr in (0.01, 0.03, 0.1)),
)
# The model's own optimizer, as its function compiles it when the run starts.
MODEL_DEFAULT = {"optimizer": "default"}


class TunedModel:
    """``model()`` (``harness.model_fn(spec)``) after ``keras.utils.set_random_seed(seed)``,
    recompiled with ``candidate``'s optimizer unless it is ``MODEL_DEFAULT``."""

    def __init__(self, spec: str, seed: int, candidate: dict):
        self.spec, self.seed, self.candidate = spec, int(seed), dict(candidate)

    def __call__(self):
        from benchmarks.emulation.harness import model_fn
        from benchmarks.training.column_process import build_model

        return build_model(self.seed, self.candidate, model_fn(self.spec))

    def __repr__(self) -> str:
        return f"TunedModel({self.spec!r}, seed {self.seed}, {label(self.candidate)})"


def parse_optimizer(text: str) -> dict:
    """``model`` (the model's own), ``adam:RATE``, ``sgdm:RATE`` (momentum 0.9) or
    ``sgd:RATE``; ``ValueError`` naming the forms for anything else."""
    name, _, rate = text.partition(":")
    if name == "model" and not rate:
        return dict(MODEL_DEFAULT)
    try:
        lr = float(rate)
    except ValueError:
        lr = -1.0
    if name in ("adam", "sgd", "sgdm") and lr > 0:
        if name == "adam":
            return {"optimizer": "adam", "lr": lr}
        return {"optimizer": "sgd", "lr": lr, "momentum": 0.9 if name == "sgdm" else 0.0}
    raise ValueError(f"optimizer {text!r}: use model, adam:RATE, sgdm:RATE (momentum 0.9) "
                     "or sgd:RATE, e.g. adam:0.001")


def label(candidate: dict) -> str:
    """``Adam lr 0.001``, ``SGD m0.9 lr 0.03``, ``model default``."""
    from benchmarks.protocol import candidate_label

    return candidate_label(candidate)
