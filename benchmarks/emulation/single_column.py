"""The ``single`` column of ``cluster_emu.py scaling``: the tuned single process, the
best thing a user would run on ONE node instead of DDLF.

A plain Keras process: ``model.fit``'s compiled loop, one TensorFlow thread (intra- and
inter-op 1, ``OMP_NUM_THREADS=1``), batch 32, the model of :class:`TunedModel` with the
optimizer selection chose for it. It runs in one network-namespace host, in a cgroup of
its own capped at the nodes' CPUs (no link: it sends nothing), started by the parent
when the driver asks (``SINGLE job``, :func:`handle`), between the DDLF runs of the same
seed.

It is evaluated on the DDLF columns' schedule, at least ``evals_per_epoch`` times an epoch
(after steps k·S/E of each epoch of S steps), on the same images, and times its own
evaluations and takes them out of its training time (``EvalClock``, as
``train_compare.py``'s keras column does); DDLF's rows carry their evaluation time
(``eval_s``), taken out the same way (``protocol.ddlf_points``).

    python benchmarks/emulation/single_column.py --job JSON   # one run; prints its RESULT
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:   # run as a file: benchmarks.* from the checkout
    sys.path.insert(0, _ROOT)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

__all__ = ["run", "handle", "PREFIX", "STEPS_PER_ROUND_FOR_SMOKE"]

PREFIX = "SINGLE_RESULT "
# --max-rounds N stops the single process after N times this many steps: a DDLF round's
# default (rounds.STEPS_PER_ROUND), so a smoke run of each column does about as much.
STEPS_PER_ROUND_FOR_SMOKE = 16


def run(job: dict) -> dict:
    """One run of the single process (in its own process): the result record."""
    t0 = time.perf_counter()
    from benchmarks.emulation.tuned_model import TunedModel
    from benchmarks.protocol import SplitDataset, candidate_label
    from benchmarks.training.column_process import (
        BATCH_SIZE,
        EvalClock,
        configure_tf,
        describe_optimizer,
        eval_steps,
        evaluate_arrays,
    )

    configure_tf(1)
    import keras

    data = SplitDataset(job["stage"], "fashion-mnist", limit=job.get("limit"),
                        eval_limit=job.get("eval_limit"))
    (x, y), (xe, ye) = data()
    model = TunedModel(job["model"], job["seed"], job["candidate"])()
    own = describe_optimizer(model.optimizer)
    clock = EvalClock("single", "validation" if job["stage"] == "select" else "test")
    steps = math.ceil(len(x) / BATCH_SIZE)
    at = eval_steps(steps, job["evals_per_epoch"])
    max_steps = job.get("max_rounds", 0) * STEPS_PER_ROUND_FOR_SMOKE
    stop_at = job.get("stop_at_target")
    losses: list = []
    done = {"steps": 0}

    class EvalBetweenSteps(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            done["steps"] += 1
            ended = bool(max_steps) and done["steps"] >= max_steps
            if batch + 1 in at or ended:
                losses.append(float(logs["loss"]) if logs and "loss" in logs else None)
                acc = clock.evaluate(self.epoch + (batch + 1) / steps,
                                     lambda: evaluate_arrays(model, xe, ye))
                if stop_at is not None and acc >= stop_at:
                    ended = True
            if ended:
                self.model.stop_training = True

    t_ready = time.perf_counter()
    clock.start()
    model.fit(x, y, epochs=job["epochs"], batch_size=BATCH_SIZE, shuffle=True, verbose=0,
              callbacks=[EvalBetweenSteps()])
    train_s = clock.train_s()
    used = resource.getrusage(resource.RUSAGE_SELF)
    return {"status": "ok", "process_cpu_s": used.ru_utime + used.ru_stime, "startup_s": t_ready - t0, "train_s": train_s,
            "eval_s": clock.eval_s, "evals": clock.points, "train_losses": losses,
            "epochs_done": done["steps"] / steps,
            "label": candidate_label(job["candidate"], own),
            "scheme_ran": "keras fit, 1 thread",
            "settings": f"one process, 1 TF thread, fit, batch {BATCH_SIZE}; "
                        + candidate_label(job["candidate"], own)}


def _main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", required=True, help="the run, as the scaling driver writes it")
    a = p.parse_args(argv)
    job = json.loads(a.job)
    try:
        out = run(job)
    except Exception as e:
        traceback.print_exc()
        out = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    print(PREFIX + json.dumps(out), flush=True)


# -- the parent's side: run it in a capped host ------------------------------------------------

def handle(body: str, parent) -> str:
    """``SINGLE job`` from the driver: run the single process in host 1's namespace, in a
    cgroup of its own at the nodes' cap (the node there idles meanwhile), keep its result
    with what the head, the driver and it took of the CPU, and answer ``OK``."""
    from benchmarks.emulation.harness import cpu_between, log, snapshot

    job = json.loads(body)
    group = None
    if parent.groups is not None:
        group = getattr(parent, "single_group", None)
        if group is None:
            group = parent.single_group = parent.groups.child("single", parent.plan["node_cpus"])
    load = os.getloadavg()[0]
    before = snapshot([group], parent.ctl, {"head": parent.head, "driver": parent.driver})
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*(group.prefix() if group else []), *parent.hosts.prefix(1), sys.executable,
         os.path.abspath(__file__), "--job", json.dumps(job)],
        capture_output=True, text=True, env={**os.environ, **parent.env},
        timeout=job.get("timeout_s") or None)
    total = time.perf_counter() - t0
    after = snapshot([group], parent.ctl, {"head": parent.head, "driver": parent.driver})
    line = next((x for x in proc.stdout.splitlines() if x.startswith(PREFIX)), None)
    if line is None:
        out = {"status": "error", "reason": f"the single process exited with status "
               f"{proc.returncode} and no result; its errors: {proc.stderr[-2000:]}"}
    else:
        out = json.loads(line[len(PREFIX):])
        if out.get("status") != "ok":
            log(proc.stderr[-3000:])
    r = {**job, **out, "total_s": total, "load": [load, os.getloadavg()[0]],
         "cpu": cpu_between(before, after), "machine_cpus": os.cpu_count()}
    if out.get("process_cpu_s") is not None and not parent.groups_v2():
        # cgroup v1 sums the processes in the group now, and this one has ended: its own
        # count (start-up included, as the group's would be) stands for the group's.
        r["cpu"]["nodes_cpu_s"] = [out["process_cpu_s"]]
    parent.keep(r)
    log(f"  {'-':>8} K=1 single         seed {job['seed']}: {r['status']}, {total:.1f} s")
    return "OK"


if __name__ == "__main__":
    _main()
