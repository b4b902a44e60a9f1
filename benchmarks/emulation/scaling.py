"""``cluster_emu.py scaling`` (issue 30 section 5): more machines, less time, against the
tuned single process and data-parallel, with DDLF's defaults and its best setting.

    # 1. selection, on the validation split (the first 50,000 training images, judged on
    #    the last 10,000): the single process at K = 1 and data-parallel at every K, each
    #    over tuned_model.GRID; writes the choices file
    sudo python benchmarks/emulation/cluster_emu.py scaling --select [--ks 1,2,4,8]
    # 2. the final grid, on the test set: refuses to start without those choices
    sudo python benchmarks/emulation/cluster_emu.py scaling [--ks 1,2,4,8] \\
        [--rates 1gbit,100mbit] [--seeds 1,2,3] [--epochs 5] [--setting allreduce+codec]
    python benchmarks/emulation/cluster_emu.py scaling --from scaling.json   # the table again

The columns, the caps per K and the order of the runs are ``scaling_plan.py``'s; the
single process is ``single_column.py``; the table ``scaling_table.py``. One cluster per
(K, cap): the head, K capped nodes and the driver each in a network namespace
(``harness.py``). Every DDLF run is one ``train()`` call that starts its own trainers,
as a user's does, from the seed's initial weights (``tuned_model.TunedModel``); its
start-up is reported apart and not counted as training.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

__all__ = ["add_arguments", "main", "driver"]


def add_arguments(p) -> None:
    """The flags only this mode reads (``cluster_emu.py``'s parser holds the shared ones)."""
    p.add_argument("--columns", help="scaling: of single,dataparallel,defaults,best "
                                     "(default: all; best is each --setting)")
    p.add_argument("--cpus", help="scaling: K:CPUS caps per K, e.g. 1:0.5,8:0.25 (default: "
                                  "--node-cpus for every K, else 0.5 up to K = 4, then 2/K)")
    p.add_argument("--select", action="store_true",
                   help="scaling: tune the single process (K = 1) and data-parallel (each "
                        "K) on the validation split; write --choices")
    p.add_argument("--choices", help="scaling: the choices file (default "
                                     "benchmarks/emulation/scaling_choices.json)")
    p.add_argument("--select-epochs", type=int, default=2, help="scaling --select: epochs (2)")
    p.add_argument("--select-seeds", type=int, default=1,
                   help="scaling --select: seeds 1001.. (1)")
    p.add_argument("--select-grid",
                   help="scaling --select: the candidates, comma-separated adam:RATE, "
                        "sgdm:RATE or sgd:RATE (default: tuned_model.GRID, Adam and SGD "
                        "m0.9 at 7 rates); the choices file records which were tried")
    p.add_argument("--limit", type=int, help="scaling: train on the first N images (smoke)")
    p.add_argument("--eval-limit", type=int,
                   help="scaling: evaluate on the first M images (default: all, or 1000 "
                        "with --limit)")
    p.add_argument("--best-optimizer", default="model",
                   help="scaling: the best columns' optimizer: model (wide_cnn's own), "
                        "adam:RATE, sgdm:RATE or sgd:RATE")
    p.add_argument("--stop-at-target", default="",
                   help="scaling: columns whose runs stop at the target (comma-separated, "
                        "or all): no accuracy after the fixed epochs, much less time")
    p.add_argument("--timeout", type=float, default=0,
                   help="scaling: seconds a single-process run may take (0: no limit)")


def _grid(a) -> tuple[dict, list[str]]:
    """The grid's settings from the command line, and the columns skipped with why."""
    from benchmarks.emulation import emu_streaming, scaling_plan
    from benchmarks.emulation.tuned_model import parse_optimizer

    wanted = [c.strip() for c in (a.columns or ",".join(scaling_plan.COLUMNS)).split(",")
              if c.strip()]
    bad = [c for c in wanted if c not in scaling_plan.COLUMNS]
    if bad:
        raise SystemExit(f"--columns: unknown {bad}; choose from "
                         f"{','.join(scaling_plan.COLUMNS)}")
    settings = [s for s in a.setting.split(",") if s]
    for name in settings:
        emu_streaming.options_for(name, a.codec, a.fragments)   # a bad name fails here
    columns, skipped = [], []
    for c in wanted:
        if c == "best":
            columns += [f"best:{s}" for s in settings]
        elif c == "dataparallel" and scaling_plan.dataparallel_missing():
            why = scaling_plan.dataparallel_missing()
            if a.estimate:   # the grid as it will be once the scheme lands
                columns.append(c)
                skipped.append(f"dataparallel: estimated as planned, but it would be "
                               f"skipped now: {why}")
            else:
                skipped.append(f"dataparallel: skipped: {why}")
        else:
            columns.append(c)
    try:
        best = parse_optimizer(a.best_optimizer)
        cpus = scaling_plan.parse_cpus(a.cpus)
        grid = select_grid(a.select_grid)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    g = {"columns": columns, "rates": a.rates.split(","),
         "seeds": [int(s) for s in a.seeds.split(",")], "epochs": a.epochs,
         "target": a.target, "model": a.model, "codec": a.codec, "fragments": a.fragments,
         "evals_per_epoch": a.evals_per_epoch, "limit": a.limit,
         "eval_limit": a.eval_limit if a.eval_limit or not a.limit else 1000,
         "max_rounds": a.max_rounds, "stop_at": [s for s in a.stop_at_target.split(",") if s],
         "best_candidate": best,
         "ks": [int(k) for k in (a.ks or "1,2,4,8").split(",")], "cpus": cpus,
         "node_cpus": a.node_cpus, "skipped": skipped, "grid": grid}
    return g, skipped


def select_grid(text: str | None) -> list[dict]:
    """``--select-grid``'s candidates (``tuned_model.GRID`` without it); ``ValueError``
    for a bad or repeated one, or one that is the model's own optimizer (not tuned)."""
    from benchmarks.emulation.tuned_model import GRID, MODEL_DEFAULT, parse_optimizer

    if not text:
        return [dict(c) for c in GRID]
    out = [parse_optimizer(t.strip()) for t in text.split(",") if t.strip()]
    if not out or MODEL_DEFAULT in out:
        raise ValueError(f"--select-grid {text!r}: name at least one adam:RATE, sgdm:RATE "
                         "or sgd:RATE (the model's own optimizer is not a candidate)")
    if len({json.dumps(c, sort_keys=True) for c in out}) < len(out):
        raise ValueError(f"--select-grid {text!r}: a candidate is named twice")
    return out


def _select_grid(g: dict) -> tuple[dict, list]:
    """Selection's settings (the validation split, seeds 1001..) and its clusters: the
    single process once (K = 1 at the largest cap), data-parallel once per K (K = 1 only
    where ``--ks`` lists it, as the final grid runs it)."""
    from benchmarks.emulation import scaling_plan
    from benchmarks.training.column_process import SELECT_SEED_BASE

    sel = {**g, "seeds": [SELECT_SEED_BASE + i for i in range(1, g["select_seeds"] + 1)],
           "epochs": g["select_epochs"],
           "columns": [c for c in g["columns"] if c in ("single", "dataparallel")]}
    out, seen = [], set()
    for k, cap in scaling_plan.clusters(g["ks"], g["cpus"], g["node_cpus"]):
        jobs = [j for j in scaling_plan.select_jobs(k, cap, sel, g["grid"])
                if scaling_plan.choice_key(j["column"], k) not in seen]
        seen |= {scaling_plan.choice_key(j["column"], k) for j in jobs}
        if jobs:
            out.append((k, cap, jobs))
    return sel, out


def _final_clusters(g: dict, path: str | None) -> list:
    """The final grid's clusters and runs; ``ChoicesMissing`` naming the --select command
    when a tuned column has no choice (``path`` None: the model's own optimizer stands
    in, for an estimate)."""
    from benchmarks import protocol
    from benchmarks.emulation import scaling_plan
    from benchmarks.emulation.tuned_model import MODEL_DEFAULT

    plan = scaling_plan.clusters(g["ks"], g["cpus"], g["node_cpus"])
    # A K = 1 that --ks leaves out runs only the baselines (scaling_plan.final_jobs).
    keys = scaling_plan.needed_choices(g["columns"], [k for k, _ in plan
                                                      if k != 1 or 1 in g["ks"]])
    if path is None:
        chosen = {key: MODEL_DEFAULT for key in keys}
    else:
        chosen = protocol.read_choices(path, keys, command=scaling_plan.select_command)
    out = []
    for k, cap in plan:
        jobs = scaling_plan.final_jobs(k, cap, g, chosen)
        for j in jobs:
            if j["column"].startswith("best:"):
                j["candidate"] = dict(g["best_candidate"])
        out.append((k, cap, jobs))
    return out


def main(a) -> int:
    """``cluster_emu.py scaling`` after its shared flags were resolved (``a``)."""
    from benchmarks import protocol
    from benchmarks.emulation import emu_streaming, harness, scaling_plan, scaling_table

    if a.from_file:
        results = harness.load_results(a.from_file)
        print(f"{len(results)} run(s) from {a.from_file}")
        if results and "column" not in results[0]:   # issue 23's scaling runs: one setting
            print(emu_streaming.scaling_table(results, a.target))
        else:
            print("\n".join(scaling_table.markdown(scaling_table.rows(results, a.target),
                                                   a.target)))
        return 0
    g, skipped = _grid(a)
    g.update(select_epochs=a.select_epochs, select_seeds=a.select_seeds)
    path = a.choices or scaling_plan.DEFAULT_CHOICES
    n_train = len(protocol.split_indices("select" if a.select else "final", 60000, 10000,
                                         limit=g["limit"]).train)
    n_eval = min(10000, g["eval_limit"] or 10000)
    if a.select:
        g, plan = _select_grid(g)
        if not plan:
            print("cluster_emu scaling --select: nothing to tune (the single process and "
                  "data-parallel are the tuned columns)")
            return 0
    else:
        try:
            plan = _final_clusters(g, None if a.estimate else path)
        except protocol.ChoicesMissing as e:
            print(f"cluster_emu scaling: {e}", file=sys.stderr)
            return 2
    for line in skipped:
        print(line)
    if a.estimate:
        for k, cap, jobs in plan:
            secs = scaling_plan.estimate([(k, cap, jobs)], n_train, n_eval)
            print(f"K={k} at {cap:g} CPU: {len(jobs)} run(s), about {secs / 60:.0f} min")
        by: dict = {}
        for _k, _cap, jobs in plan:
            for j in jobs:
                name = f"{j['column']} at {j['rate'] or 'no link'}"
                by[name] = by.get(name, 0.0) + scaling_plan.run_seconds(j, n_train, n_eval)
        print("by column: " + "; ".join(f"{n} {v / 3600:.1f} h" for n, v in by.items()))
        total = scaling_plan.estimate(plan, n_train, n_eval)
        print(f"scaling{' --select' if a.select else ''}: {sum(len(j) for *_, j in plan)} "
              f"run(s) on {len(plan)} cluster(s), {g['epochs']} epochs: about "
              f"{total / 3600:.1f} h")
        return 0
    return _run(a, g, plan, path, skipped)


def _run(a, g: dict, plan: list, path: str, skipped: list) -> int:
    from netns_cluster import netns_unavailable

    from benchmarks import protocol
    from benchmarks.emulation import harness, scaling_plan, scaling_table
    from benchmarks.emulation.cpu_caps import cgroup_unavailable
    from benchmarks.emulation.single_column import handle
    from benchmarks.emulation.tuned_model import label

    why = netns_unavailable() or cgroup_unavailable()
    if why:
        print(f"cluster_emu skipped: {why}")
        return 0
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_emu.py")
    load, results = os.getloadavg()[0], []
    for k, cap, jobs in plan:
        harness.log(f"== K={k} at {cap:g} CPU: {len(jobs)} run(s)")
        cluster = {"mode": "scaling", "k": k, "node_cpus": cap, "priority": a.priority,
                   "jobs": jobs, "partial": a.json + ".partial.jsonl" if a.json else None}
        results += harness.run(cluster, script, handlers={"SINGLE": handle})
    meta = {k: v for k, v in g.items() if k != "cpus"}
    meta["clusters"] = [[k, cap] for k, cap, _ in plan]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"plan": meta, "results": results}, f, indent=1)
    print(f"\nload average (1 min) {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    for line in skipped:
        print(line)
    if a.select:
        tables = {}
        keyed = [(scaling_plan.choice_key(r["column"], r["k"]), r) for r in results]
        for key in dict.fromkeys(key for key, _r in keyed):
            runs = [r for kk, r in keyed if kk == key]
            rows = []
            for cand in g["grid"]:
                got = [r for r in runs if r["candidate"] == cand]
                row = protocol.candidate_row(cand, got, g["target"])
                row["label"] = label(cand)
                rows.append(row)
            tables[key] = rows
        meta.update(when=time.strftime("%Y-%m-%d %H:%M:%S"))
        protocol.write_choices(path, tables, {"target": g["target"], "select_epochs":
                                              g["epochs"], "limit": g["limit"],
                                              "seeds": g["seeds"], "when": meta["when"],
                                              "grid": [label(c) for c in g["grid"]]})
        for key, rows in tables.items():
            print()
            print(protocol.selection_table(key, rows, g["target"], g["epochs"]))
        print(f"\nwrote {path}")
        return 0
    print(f"{g['model']} on Fashion-MNIST, batch 32 per trainer, {g['epochs']} epochs, "
          f"{g['evals_per_epoch']} evaluations per epoch at least, seeds "
          f"{','.join(map(str, g['seeds']))} interleaved; tbf links, no delay"
          + (f"; --limit {g['limit']} training images, {g['eval_limit']} evaluated"
             if g["limit"] else "")
          + (f"; stopped after {g['max_rounds']} rounds" if g["max_rounds"] else ""))
    print("\n".join(scaling_table.markdown(scaling_table.rows(results, g["target"]),
                                           g["target"], g["epochs"])))
    return 0


# -- the driver (in its own namespace) -----------------------------------------------------------

def _ask(line: str) -> None:
    print(line, flush=True)
    if sys.stdin.readline().strip() != "OK":
        raise SystemExit(f"the parent did not answer {line!r}")


def driver(address: str, plan: dict) -> None:
    """The cluster's runs in ``plan["jobs"]`` order: the single process through the parent
    (``SINGLE``), every DDLF run here, each printed as a ``RESULT`` line."""
    import ddlf_actors as ddlf

    ddlf.init(address=address)
    rate = None
    try:
        for job in plan["jobs"]:
            if job["column"] == "single":
                _ask("SINGLE " + json.dumps(job))
                continue
            if job["rate"] != rate:
                _ask(f"RATE {job['rate']}")
                rate = job["rate"]
            print("RESULT " + json.dumps(run_ddlf(job)), flush=True)
    finally:
        ddlf.shutdown()


def run_ddlf(job: dict, ask=_ask) -> dict:
    """One DDLF run: ``train(model_fn, dataset[, scheme], **options)`` with the run's
    shape (K, epochs, seed), its evaluations, and nothing else for the defaults. ``ask``
    tells the parent a run starts and ends (its CPU snapshots); a run with no parent
    (``fixed_budget.py``) passes one that does nothing."""
    from benchmarks import protocol
    from benchmarks.emulation.tuned_model import TunedModel, label
    from benchmarks.protocol import cadence, ran
    from ddlf_actors.apps import train
    from ddlf_actors.apps.callbacks import Callback

    class StopAfter(Callback):
        """--max-rounds, and --stop-at-target."""

        def on_row(self, row, run):
            acc = row.get("test_accuracy")
            if (job["max_rounds"] and row["round"] >= job["max_rounds"]) or (
                    job["stop_at_target"] is not None and acc is not None
                    and acc >= job["stop_at_target"]):
                run.stop = True

    k, scheme = job["k"], job["scheme"]
    data = protocol.SplitDataset(job["stage"], "fashion-mnist", limit=job["limit"],
                                 eval_limit=job["eval_limit"])
    n_train = len(protocol.split_indices(job["stage"], 60000, 10000, limit=job["limit"]).train)
    opts = dict(job["options"])
    predicted = cadence.rounds_per_epoch(scheme, opts, k, n_train)
    opts.update(cadence.evaluations(scheme, opts, k, n_train, job["evals_per_epoch"]))
    model = TunedModel(job["model"], job["seed"], job["candidate"])
    shape = {"workers": k, "master_epochs": job["epochs"], "seed": job["seed"],
             "progress": False, "callbacks": [StopAfter()]}
    load = os.getloadavg()[0]
    ask(f"SNAP {job['run_id']}:start")
    t0 = time.perf_counter()
    try:
        if scheme is None:   # DDLF's defaults: train(model_fn, dataset), no scheme
            r = train(model, data, **shape, **opts)
        else:
            r = train(model, data, scheme, **shape, **opts)
        points, train_s, eval_s = protocol.ddlf_points(r.history, r.startup_s)
        # The round's parts too (compute_s: the busiest trainer's steps; collective_s: the
        # ring, from the driver's side; overhead_s: the wall time beyond the busiest
        # trainer's work): where a round's time goes besides its steps.
        keys = ("round", "epoch", "time_s", "compute_total_s", "eval_s", "bytes_sent",
                "bytes_received", "ring_bytes", "test_accuracy", "workers", "wall_s",
                "compute_s", "collective_s", "idle_s", "overhead_s")
        out = {"status": "ok", "evals": points, "train_s": train_s, "eval_s": eval_s,
               "startup_s": r.startup_s, "epochs_done": r.history[-1]["epoch"],
               "train_losses": [row.get("train_loss") for row in r.history],
               "scheme_ran": ran.scheme_ran(r), "compression": ran.compression_ran(r),
               "settings": ran.describe_run(r), "label": label(job["candidate"]),
               "rows": [{key: row.get(key) for key in keys} for row in r.history],
               "rounds_predicted": predicted, "eval_every": opts.get("eval_every"),
               "evals_per_epoch_asked": opts.get("evals_per_epoch")}
    except Exception as e:
        traceback.print_exc()
        out = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    total = time.perf_counter() - t0
    ask(f"SNAP {job['run_id']}:end")
    return {**job, **out, "total_s": total, "load": [load, os.getloadavg()[0]],
            "machine_cpus": os.cpu_count()}
