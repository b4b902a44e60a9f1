"""What ``cluster_emu.py scaling`` runs, decided before anything starts (no TensorFlow,
no cluster): the columns, the CPU cap of each K, the clusters, the interleaved runs, the
choices the tuned columns need, and the grid's expected wall time.

Columns (issue 30 section 5):

- ``single``: the tuned single process (``single_column.py``), at K = 1 only; T1 comes
  from it. Tuned on validation (its key in the choices file: ``single``).
- ``dataparallel``: ``train(..., "dataparallel")``, a gradient all-reduce every step, at
  every K, with the optimizer chosen for that K (``dataparallel@K4``). Skipped, with the
  reason, while no scheme of that name is registered.
- ``defaults``: ``train(model_fn, dataset)`` with no scheme and no scheme options: what
  a user gets. Never tuned (the model's own optimizer).
- ``best:SETTING``: a setting of ``emu_streaming.SETTINGS`` as given (``--setting``).

Every DDLF call also gets what the measurement needs and nothing else: ``workers=K``,
``master_epochs``, ``seed``, ``progress=False``, a callback for ``--max-rounds`` and
``eval_every`` for the evaluations per epoch.

CPU caps: ``--cpus K:C,...`` or, for a K not named, ``--node-cpus`` for every K, or the
rule :func:`default_cpus` (0.5 CPU a node up to K = 4, then 2/K: K nodes never ask for
more than the machine's 2 cores). Efficiencies are against K = 1 *at the same cap*, so
every cap in the grid gets a K = 1 cluster (:func:`clusters` adds it).
"""

from __future__ import annotations

__all__ = ["COLUMNS", "DEFAULT_CHOICES", "default_cpus", "parse_cpus", "cap_for", "clusters",
           "choice_key", "needed_choices", "select_command", "final_jobs", "select_jobs",
           "dataparallel_missing", "column_spec", "run_seconds", "estimate"]

import os

COLUMNS = ("single", "dataparallel", "defaults", "best")
DEFAULT_CHOICES = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "scaling_choices.json")
DATAPARALLEL = "dataparallel"


def default_cpus(k: int) -> float:
    """0.5 CPU a node up to K = 4, then 2/K (0.25 at K = 8)."""
    return 0.5 if k <= 4 else 2.0 / k


def parse_cpus(text: str | None) -> dict[int, float]:
    """``"1:0.5,8:0.25"`` as ``{1: 0.5, 8: 0.25}``; ``ValueError`` naming the form."""
    out: dict[int, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        k, _, c = part.partition(":")
        try:
            out[int(k)] = float(c)
        except ValueError:
            raise ValueError(f"--cpus {text!r}: use K:CPUS pairs, e.g. 1:0.5,8:0.25") from None
        if out[int(k)] <= 0:
            raise ValueError(f"--cpus {text!r}: a cap must be above 0 CPUs")
    return out


def cap_for(k: int, cpus: dict[int, float], node_cpus: float | None = None) -> float:
    """K's cap: named in ``cpus``, else ``node_cpus``, else :func:`default_cpus`."""
    if k in cpus:
        return cpus[k]
    return node_cpus if node_cpus else default_cpus(k)


def clusters(ks: list[int], cpus: dict[int, float],
             node_cpus: float | None = None) -> list[tuple[int, float]]:
    """``[(K, cap)]`` in the order they run: for each cap (largest first), K = 1 at that
    cap, then its other K ascending. K = 1 is added where a cap has none: its runs are
    the baseline of that cap's efficiencies."""
    by_cap: dict[float, set] = {}
    for k in ks:
        by_cap.setdefault(cap_for(k, cpus, node_cpus), set()).add(k)
    return [(k, cap) for cap in sorted(by_cap, reverse=True)
            for k in sorted(by_cap[cap] | {1})]


def dataparallel_missing() -> str | None:
    """Why the dataparallel column cannot run here, or None."""
    from ddlf_actors.apps.schemes import registry

    if DATAPARALLEL in registry.names():
        return None
    return (f"scheme {DATAPARALLEL!r} is not registered (registry.names(): "
            f"{', '.join(registry.names())})")


def choice_key(column: str, k: int) -> str:
    """The column's name in the choices file: ``single``, ``dataparallel@K4``."""
    return "single" if column == "single" else f"{column}@K{k}"


def needed_choices(columns: list[str], ks: list[int]) -> list[str]:
    """The keys the final run reads: ``single`` (tuned once: its cap only scales its time)
    and ``dataparallel@K`` for every K."""
    out = ["single"] if "single" in columns else []
    if DATAPARALLEL in columns:
        out += [choice_key(DATAPARALLEL, k) for k in sorted(set(ks))]
    return out


def select_command(keys, path: str) -> str:
    """The ``--select`` command that writes ``keys`` into ``path``."""
    cols = ["single"] if "single" in keys else []
    ks = sorted({int(key.split("@K")[1]) for key in keys if "@K" in key})
    if ks:
        cols.append(DATAPARALLEL)
    return ("sudo python benchmarks/emulation/cluster_emu.py scaling --select "
            f"--columns {','.join(cols)} --ks {','.join(str(k) for k in ks or [1])} "
            f"--choices {path}")


def column_spec(column: str, codec: str, fragments: int) -> tuple[str | None, dict]:
    """``(scheme, options)`` of a DDLF column: None is train()'s default scheme."""
    from benchmarks.emulation.emu_streaming import options_for

    if column == "defaults":
        return None, {}
    if column == DATAPARALLEL:
        return DATAPARALLEL, {}
    if column.startswith("best:"):
        return options_for(column[len("best:"):], codec, fragments)
    raise ValueError(f"column {column!r} is not a DDLF column")


def _job(column, k, cap, rate, seed, stage, candidate, g: dict) -> dict:
    job = {"column": column, "k": k, "cpus": cap, "rate": rate, "seed": seed, "stage": stage,
           "candidate": dict(candidate), "model": g["model"], "epochs": g["epochs"],
           "evals_per_epoch": g["evals_per_epoch"], "limit": g.get("limit"),
           "eval_limit": g.get("eval_limit"), "max_rounds": g.get("max_rounds", 0),
           "stop_at_target": g["target"] if column.split(":")[0] in g.get("stop_at", ())
           or "all" in g.get("stop_at", ()) else None}
    if column != "single":
        job["scheme"], job["options"] = column_spec(column, g["codec"], g["fragments"])
    return job


def _numbered(jobs: list[dict]) -> list[dict]:
    """Each run's ``run_id``: the parent pairs its CPU snapshots by it."""
    for i, j in enumerate(jobs):
        j["run_id"] = f"{j['stage']}-K{j['k']}-{j['cpus']:g}cpu-{i}"
    return jobs


def _baseline_only(k: int, g: dict) -> bool:
    """A K = 1 that --ks left out is there as the baseline of the other K's efficiencies
    (the tuned single process, the defaults' own K = 1): a best setting's or
    data-parallel's K = 1 is not run there (their throughput efficiency is then not
    reported)."""
    return k == 1 and 1 not in g.get("ks", [1])


def final_jobs(k: int, cap: float, g: dict, chosen: dict) -> list[dict]:
    """The final runs on the cluster of (K, cap), in order: per link rate, seed by seed,
    every column (``g["columns"]``); ``single`` only at K = 1 and on the first rate (it
    has no link); no best or data-parallel column at a K = 1 that ``g["ks"]`` does not
    list. ``chosen``: the choices file's candidates by key."""
    from benchmarks.emulation.tuned_model import MODEL_DEFAULT

    baseline_only = _baseline_only(k, g)
    out = []
    for i, rate in enumerate(g["rates"]):
        for seed in g["seeds"]:
            for col in g["columns"]:
                if baseline_only and (col.startswith("best:") or col == DATAPARALLEL):
                    continue
                if col == "single":
                    if k == 1 and i == 0:
                        out.append(_job(col, 1, cap, None, seed, "final", chosen["single"], g))
                    continue
                cand = chosen[choice_key(col, k)] if col == DATAPARALLEL else MODEL_DEFAULT
                out.append(_job(col, k, cap, rate, seed, "final", cand, g))
    return _numbered(out)


def select_jobs(k: int, cap: float, g: dict, grid) -> list[dict]:
    """The selection runs on (K, cap): the first link rate only, seed by seed, every
    candidate of ``grid`` for ``single`` (K = 1) and ``dataparallel`` (not at a K = 1
    that ``g["ks"]`` does not list); on the validation split (``stage="select"``)."""
    out = []
    rate = g["rates"][0]
    baseline_only = _baseline_only(k, g)
    for seed in g["seeds"]:
        for col in g["columns"]:
            if col == "single" and k != 1 or col not in ("single", DATAPARALLEL):
                continue
            if col == DATAPARALLEL and baseline_only:
                continue
            for cand in grid:
                out.append(_job(col, k, cap, None if col == "single" else rate, seed,
                                "select", cand, g))
    return _numbered(out)


# -- the grid's expected wall time ---------------------------------------------------------------

# A plain model of issue 23's workload (docs/benchmarks/emulation.md): wide_cnn's step of
# batch 32 at 0.5 CPU (link_workload.py: 1.1 s per 32 steps), its evaluation (0.10 s a
# round at K = 4 for a quarter of the 10,000 test images every 7 rounds: ~0.28 ms an
# image), a run's start-up (trainers, or the single process: TensorFlow, the data, the
# model), a cluster's; all at 0.5 CPU, slower in proportion below it. A run stopped at
# the target is taken to stop after STOP_GUESS_EPOCHS.
STEP_S = 1.1 / 32
EVAL_S_PER_IMAGE = 0.28e-3
STARTUP_S = 30.0
CLUSTER_S = 120.0
STOP_GUESS_EPOCHS = 1.0
MODEL_MB = {"wide_cnn": 20.4, "paper_cnn": 2.06}


def run_seconds(job: dict, n_train: int, n_eval: int) -> float:
    """The expected wall time of one run of the grid (see the constants above)."""
    from benchmarks.emulation.emu_streaming import round_seconds
    from benchmarks.protocol import cadence

    k, slow = job["k"], 0.5 / job["cpus"]
    mbit = 1000.0 if str(job["rate"]).startswith("1g") else 100.0
    model_mb = MODEL_MB.get(job["model"].split(":")[0], 20.4)
    steps = n_train / (32 * k)                    # a trainer's steps in an epoch
    work = steps * STEP_S * slow                  # their compute
    scheme = job.get("scheme")
    if job["column"] == "single":
        epoch = work
    elif scheme == DATAPARALLEL:                  # a ring all-reduce after every step
        epoch = steps * round_seconds("allreduce", {}, k, mbit, STEP_S * slow, model_mb)
    else:
        rounds = cadence.rounds_per_epoch(scheme, job["options"], k, n_train) or steps
        name = scheme or cadence.default_scheme()
        epoch = rounds * round_seconds(name, job["options"], k, mbit, work / rounds, model_mb)
    evals = job["evals_per_epoch"] * n_eval / k * EVAL_S_PER_IMAGE * slow
    epochs = STOP_GUESS_EPOCHS if job.get("stop_at_target") else job["epochs"]
    if job.get("max_rounds"):
        epochs = min(epochs, job["max_rounds"] * 16 / steps)
    return STARTUP_S * slow + epochs * (epoch + evals)


def estimate(clusters_jobs: list[tuple[int, float, list]], n_train: int, n_eval: int) -> float:
    """Seconds for every cluster's start and every run."""
    return sum(CLUSTER_S + sum(run_seconds(j, n_train, n_eval) for j in jobs)
               for _k, _cap, jobs in clusters_jobs)
