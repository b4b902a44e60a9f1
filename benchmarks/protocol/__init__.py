"""The bookkeeping of ``train_compare.py``'s protocol (issue 21), with no TensorFlow.

- ``split``: the validation split (selection) and the test set (final run);
- ``columns``: what each column is (framework, algorithm, evaluation granularity, grid);
- ``schedule``: the interleaved order of column-runs;
- ``curves``: a run's evaluations, the first crossing of the target, divergence;
- ``stats``: median and range over seeds;
- ``choices``: the selection rule and the choices file;
- ``ratios``: which columns may be compared, and as what;
- ``report``: the tables;
- ``cadence``: ``eval_every`` for E evaluations per epoch, asked of the scheme;
- ``ran``: what a DDLF run ran (the scheme ``train()``'s defaults resolved to), in words.
"""

from . import cadence, ran
from .choices import (
    ChoicesMissing,
    candidate_row,
    choose,
    read_choices,
    select_command,
    write_choices,
)
from .columns import (
    ALG6_SGD,
    COLUMN_NAMES,
    COLUMNS,
    INNER_GRID,
    MODEL_DEFAULT,
    Column,
    candidate_label,
    unknown_columns,
)
from .curves import Crossing, ddlf_points, divergence, evals_per_epoch, first_crossing
from .ratios import HEADLINE_PAIRS, KINDS, RatioPair, RatioRefused, pair, per_seed_ratios
from .report import headline_rows, headline_table, metrics, ratio_lines, selection_table
from .schedule import Job, interleave
from .split import HOLDOUT, STAGES, Split, SplitDataset, split_indices
from .stats import Summary, fmt_summary, summarize

__all__ = [
    "cadence", "ran", "ALG6_SGD", "COLUMNS", "COLUMN_NAMES", "ChoicesMissing", "Column", "Crossing",
    "HEADLINE_PAIRS", "HOLDOUT", "INNER_GRID", "Job", "KINDS", "MODEL_DEFAULT", "RatioPair",
    "RatioRefused", "STAGES", "Split", "SplitDataset", "Summary", "candidate_label",
    "candidate_row", "choose", "ddlf_points", "divergence", "evals_per_epoch",
    "first_crossing", "fmt_summary", "headline_rows", "headline_table", "interleave",
    "metrics", "pair", "per_seed_ratios", "ratio_lines", "read_choices", "select_command",
    "selection_table", "split_indices", "summarize", "unknown_columns", "write_choices",
]
