"""The columns of the comparison: what framework each runs on, which algorithm, how
often it has a global model to evaluate, and the grid it is tuned over.

A candidate is a dict naming the inner optimizer (``{"optimizer": "sgd", "lr": 0.03,
"momentum": 0.9}``, ``{"optimizer": "adam", "lr": 1e-3}``, or ``{"optimizer":
"default"}``: whatever ``models.paper_cnn()`` compiles, read at run time), plus, for Ray
Train, ``"scale_lr"``: the linear scaling rule (lr x K) on or off.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Column", "COLUMNS", "COLUMN_NAMES", "INNER_GRID", "MODEL_DEFAULT", "ALG6_SGD",
           "candidate_label", "unknown_columns"]

# The same inner-optimizer grid for every column that exposes one (issue 21).
INNER_GRID: tuple[dict, ...] = (
    *({"optimizer": "sgd", "lr": lr, "momentum": 0.9} for lr in (0.01, 0.03, 0.1)),
    *({"optimizer": "adam", "lr": lr} for lr in (3e-4, 1e-3, 3e-3)),
)
# The optimizer models.paper_cnn() compiles, whatever it is when the run starts.
MODEL_DEFAULT = {"optimizer": "default"}
# The paper's Algorithm 6 columns: plain SGD 0.01, as the paper trained.
ALG6_SGD = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.0}

# Frameworks and algorithms, as the ratio rules compare them (ratios.py).
NO_FRAMEWORK = "none (one process)"


@dataclasses.dataclass(frozen=True)
class Column:
    """``grid``: the candidates selection tries (None: fixed settings, ``fixed``, for the
    reason ``no_grid``); ``choice_from``: the column whose choice this one runs with
    (``ddlf-default@ray`` runs ``ddlf-default``'s). ``granularity``: when the column has
    a global model to evaluate ("steps", "rounds" or "epochs")."""

    name: str
    framework: str
    algorithm: str
    granularity: str
    grid: tuple | None = None
    fixed: dict | None = None
    no_grid: str = ""
    choice_from: str | None = None

    @property
    def chooses(self) -> bool:
        """True if selection picks this column's setting (it has a grid of its own)."""
        return self.grid is not None


ALG6 = "Algorithm 6: 1 round/epoch, plain average, SGD 0.01"
def _rounds_label() -> str:
    """DDLF's default scheme in words, from its own settings (apps/schemes/rounds.py)."""
    from ddlf_actors.apps.schemes.rounds import STEPS_PER_ROUND, RoundOptions

    d = RoundOptions.DEFAULTS
    k = " x K" if d["lr_scaling"] == "outer" else ""
    return (f"local SGD: rounds of ~{STEPS_PER_ROUND} steps, outer "
            f"{'Nesterov ' if d['nesterov'] else 'momentum '}{d['outer_momentum']:g} "
            f"at {d['outer_lr']:g}{k}")


ROUNDS = _rounds_label()
_ALG6_WHY = "the paper's Algorithm 6 as published (SGD 0.01), kept fixed as the reference"

COLUMNS: dict[str, Column] = {c.name: c for c in (
    Column("keras", NO_FRAMEWORK, "one process, 2 threads, Keras fit", "steps",
           grid=INNER_GRID),
    Column("raytrain", "Ray Train", "gradient all-reduce every step (global batch 32 x K)",
           "steps", grid=tuple({**c, "scale_lr": s} for c in INNER_GRID for s in (False, True))),
    Column("ray", "Ray (by hand)", ALG6, "epochs", fixed=ALG6_SGD, no_grid=_ALG6_WHY),
    Column("spark", "Spark", ALG6, "epochs", fixed=ALG6_SGD, no_grid=_ALG6_WHY),
    Column("ray-rounds", "Ray (by hand)", ROUNDS, "rounds", grid=INNER_GRID),
    Column("ddlf-default", "DDLF", ROUNDS, "rounds", grid=(MODEL_DEFAULT,) + INNER_GRID),
    Column("ddlf-sync", "DDLF", ROUNDS, "rounds", choice_from="ddlf-default",
           no_grid="train_sync's defaults with ddlf-default's choice (the star, for the "
                   "record)"),
    Column("ddlf-alg6", "DDLF", ALG6, "epochs", fixed=ALG6_SGD, no_grid=_ALG6_WHY),
    Column("ddlf-default@ray", "DDLF on Ray", ROUNDS, "rounds", choice_from="ddlf-default",
           no_grid="runs ddlf-default's choice (the same settings on backend='ray')"),
)}
COLUMN_NAMES = tuple(COLUMNS)


def unknown_columns(names) -> list[str]:
    return sorted(set(names) - set(COLUMNS))


def candidate_label(c: dict, default_desc: str | None = None) -> str:
    """A candidate as the tables print it: ``SGD m0.9 lr 0.03``, ``Adam lr 0.001``,
    ``model default (SGD lr 0.01)``; `` x K`` with the linear scaling rule."""
    opt = c.get("optimizer")
    if opt == "default":
        text = "model default" + (f" ({default_desc})" if default_desc else "")
    elif opt == "sgd":
        m = c.get("momentum", 0.0)
        text = f"SGD{f' m{m:g}' if m else ''} lr {c['lr']:g}"
    elif opt == "adam":
        text = f"Adam lr {c['lr']:g}"
    else:
        text = repr(c)
    if c.get("scale_lr"):
        text += " x K"
    return text
