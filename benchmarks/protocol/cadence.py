"""How often a DDLF run is evaluated: ``eval_every`` in rounds for a number of evaluations
per epoch, from the scheme's own sizing of its rounds.

A scheme that averages in rounds (``sync``, ``allreduce``, and ``auto``, which resolves to
one of them) evaluates every ``eval_every`` rounds; how many rounds an epoch has is the
scheme's to decide (``rounds.default_rounds``: about 16 local steps each, unless told
otherwise). :func:`rounds_per_epoch` asks the scheme, through its options' own
``resolve`` and ``for_data``, instead of writing the rule again here, so a benchmark keeps
its evaluations per epoch when a default changes. A scheme that decides its rounds only
once the run has started (``auto``'s start-up probe) may end with other rounds than this
predicts: :func:`evaluations` gives such a scheme ``evals_per_epoch`` instead, which
it turns into rounds once it has them (before it did, the 2026-11-29 scaling run's K = 4
at 100 Mbit/s, 32 steps a round, was evaluated half as often as asked).
"""

from __future__ import annotations

import inspect

__all__ = ["default_scheme", "rounds_per_epoch", "eval_every", "evaluations",
           "evals_per_epoch"]


def default_scheme() -> str:
    """The scheme ``train(model_fn, dataset)`` runs when given none."""
    from ddlf_actors.apps import train

    return inspect.signature(train).parameters["scheme"].default


def rounds_per_epoch(scheme: str | None, options: dict, workers: int, num_train: int,
                     batch_size: int = 32) -> int | None:
    """Rounds per epoch a run of ``scheme`` (None: the default) with ``options`` makes on
    ``num_train`` samples split over ``workers`` trainers, as the scheme sizes them; None
    for a scheme that does not count in rounds. A ``batch_size`` in ``options`` (a
    setting that changes it) wins over ``batch_size``."""
    from ddlf_actors.apps.schemes import split_options

    config, opts = split_options(scheme or default_scheme(),
                                 {"batch_size": batch_size, **options, "workers": workers})
    opts = opts.resolve(config).for_data(config, [{"num_train": num_train,
                                                   "partitioned": False}])
    if "rounds_per_epoch" not in opts.names():
        return None
    return opts.plan_rounds()


def eval_every(scheme: str | None, options: dict, workers: int, num_train: int,
               evals_per_epoch: int, batch_size: int = 32) -> dict:
    """``{"eval_every": n}`` for at least ``evals_per_epoch`` evaluations per epoch (every
    round when an epoch has fewer rounds), or ``{}`` for a scheme without ``eval_every``."""
    from ddlf_actors.apps.schemes import registry

    name = scheme or default_scheme()
    if "eval_every" not in registry.get(name).Options.names():
        return {}
    rounds = rounds_per_epoch(scheme, options, workers, num_train, batch_size) or 1
    return {"eval_every": max(1, rounds // evals_per_epoch)}


def evaluations(scheme: str | None, options: dict, workers: int, num_train: int,
                evals_per_epoch: int, batch_size: int = 32) -> dict:
    """The option for at least ``evals_per_epoch`` evaluations per epoch: the scheme's own
    ``evals_per_epoch`` where it has one (it counts the rounds once the run has them, so
    ``auto`` choosing 32 steps a round instead of 16 still gets them), else
    :func:`eval_every`'s prediction."""
    from ddlf_actors.apps.schemes import registry

    if "evals_per_epoch" in registry.get(scheme or default_scheme()).Options.names():
        return {"evals_per_epoch": evals_per_epoch}
    return eval_every(scheme, options, workers, num_train, evals_per_epoch, batch_size)


def evals_per_epoch(evals: int, epochs: float) -> int:
    """Evaluations per epoch that give a run of ``epochs`` its ``evals`` per epoch, and a
    budget of less than an epoch as many within it."""
    return max(1, round(evals / min(1.0, epochs)))
