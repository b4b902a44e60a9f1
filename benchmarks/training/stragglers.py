"""One slow node of four: lockstep sync, backup workers, balance, both (issue 15 section 3).

    python benchmarks/training/stragglers.py [--epochs 4] [--rounds-per-epoch 2] [--target 0.84]
                                    [--repeat 2] [--json out.json]

Four trainers (``num_cpus=1`` each) of a numpy MLP (784-128-10, SGD 0.1, batch 32) train
on Fashion-MNIST with ``train_sync``. Each trainer is one emulated node: its process is
put in a cgroup of its own with a CPU cap (cgroup v2 ``cpu.max``, else the v1
``cpu.cfs_quota_us`` that this kernel mounts; period 10 ms). The rows, one after another
with the same four trainers, the same initial weights and the same seed:

even        every trainer capped at ``--node-cpus`` (0.1) CPU: the baseline.
sync        trainer 0 capped at half that, so all its work (gathering its samples,
            training, evaluating its test shard) takes twice as long: lockstep sync.
backup=1    the same slow trainer, ``backup_workers=1``.
balance     the same slow trainer, ``balance=True``.
both        the same slow trainer, ``backup_workers=1, balance=True``.

The sequence runs ``--repeat`` (2) times, interleaved so that slow drifts of the machine's
load touch every row alike; the table gives each row's median over the repeats and the
spread (min-max) of its round time.

**Why every trainer is capped.** This machine has 2 cores shared with other jobs, so
four "one-CPU nodes" time-share it and a trainer's speed would depend on whatever else
runs. Each trainer's process is therefore capped at a tenth of a core (0.4 of a core for
the four): its work then has a fixed cost, the same for the four, and the slow node's
half speed is a real CPU limit. For the caps to be what binds on a loaded machine, the
run's processes (driver, head, node, trainers) are put in a parent group with the CPU
weight of ``--priority`` (32) ordinary processes; what they can take is bounded by the
caps (and the driver's small share), so this guarantees the run its 0.4 of a core
without taking more.

(Pacing each trainer by sleeping until its wall time is a multiple of its CPU time does
not work as a fixed cost: after each sleep its caches are cold, so an unthrottled
trainer's CPU per sample doubled against a throttled one's that never sleeps, and the
"slow" trainer kept up. That pacing is kept only as the slowdown hook used when no
cgroup can be made, not root or read-only ``/sys/fs/cgroup``, and the table says so:
every trainer paced to 12x its CPU time, trainer 0 to 24x.)

Measured: ``round_s``, the mean round time over the rounds after the first and before
the last (balance's first round is even, and the last round waits for late deltas), and
its ratio to the even cluster's; ``to_target_s``, the time from the start of the first
round to the end of the first round whose weights reach ``--target`` test accuracy, and
its ratio. Targets (issue 15): round time <= 1.25x even, time to target within 10 % of
even; lockstep sync about 2x.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")   # before numpy: trainers inherit it
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402

HIDDEN = 128


class MLP:
    """784-H-10 ReLU MLP trained with plain SGD, in numpy."""

    def __init__(self, hidden=HIDDEN, lr=0.1, seed=0):
        rng = np.random.default_rng(seed)
        self.w = [rng.normal(0, (2 / 784) ** 0.5, (784, hidden)).astype(np.float32),
                  np.zeros(hidden, np.float32),
                  rng.normal(0, (2 / hidden) ** 0.5, (hidden, 10)).astype(np.float32),
                  np.zeros(10, np.float32)]
        self.lr = lr

    def forward(self, x):
        h = np.maximum(x @ self.w[0] + self.w[1], 0)
        z = h @ self.w[2] + self.w[3]
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        return h, p

    def step(self, x, y):
        h, p = self.forward(x)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-9).sum())
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        gh = p @ self.w[2].T
        gh[h <= 0] = 0
        grads = [x.T @ gh, gh.sum(0), h.T @ p, p.sum(0)]
        for w, g in zip(self.w, grads):
            w -= self.lr * g
        return loss

    def get_weights(self):
        return [a.copy() for a in self.w]

    def set_weights(self, weights):
        self.w = [np.array(a, np.float32, copy=True) for a in weights]


def mlp_fn():
    return MLP()


def cpu_per_sample(n=3000) -> float:
    """The MLP's CPU time per sample of SGD here (process time: not inflated by load)."""
    rng = np.random.default_rng(0)
    x = rng.random((n, 784), dtype=np.float32)
    y = rng.integers(0, 10, n)
    m = MLP()
    m.step(x[:32], y[:32])
    t = time.process_time()
    for i in range(0, n, 32):
        m.step(x[i:i + 32], y[i:i + 32])
    return (time.process_time() - t) / n


def make_trainer_cls():
    from ddlf_actors.apps import TrainerActor

    class PacedTrainer(TrainerActor):
        """Trains the MLP at ``duty`` times the CPU time it uses (wall / CPU)."""

        duty = 1.0           # set by the driver; the slowdown hook doubles it

        def configure_threads(self, n):
            pass

        def pace(self, duty):
            self.duty = float(duty)
            return os.getpid()

        def _paced(self, start_wall, start_cpu):
            due = start_wall + self.duty * (time.thread_time() - start_cpu)
            ahead = due - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)

        def usage(self):
            """(CPU s, wall s) spent in fit since the last call: wall/CPU = duty when the
            trainer got the CPU its pace needs, more when it did not."""
            out = getattr(self, "_usage", (0.0, 0.0))
            self._usage = (0.0, 0.0)
            return out

        def fit(self, x, y, epochs, batch_size):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return self._fit(x, y, epochs, batch_size, wall, cpu)
            finally:
                c, w = getattr(self, "_usage", (0.0, 0.0))
                self._usage = (c + time.thread_time() - cpu, w + time.perf_counter() - wall)

        def _fit(self, x, y, epochs, batch_size, wall, cpu):
            x = np.asarray(x, np.float32).reshape(len(x), -1)
            y = np.asarray(y)
            total = 0.0
            for _ in range(epochs):
                total = 0.0
                for i in range(0, len(x), batch_size):
                    total += self.model.step(x[i:i + batch_size], y[i:i + batch_size])
                    self._paced(wall, cpu)
            return total / max(1, len(x))

        def evaluate_arrays(self, x, y, batch_size=512):
            wall, cpu = time.perf_counter(), time.thread_time()
            x = np.asarray(x, np.float32).reshape(len(x), -1)
            _, p = self.model.forward(x)
            y = np.asarray(y)
            out = (float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-9))),
                   float(np.mean(p.argmax(axis=1) == y)))
            self._paced(wall, cpu)
            return out

    return PacedTrainer


class CpuLimit:
    """A cgroup holding processes under a CPU cap: v2 ``cpu.max`` where the cpu controller
    is on the unified hierarchy, else v1 ``cpu.cfs_quota_us``. Raises OSError if none can
    be made."""

    PERIOD_US = 100_000   # v1's least quota is 1 ms: 1/24 CPU needs a period of 24 ms or more

    def __init__(self, name: str, parent: CpuLimit | None = None):
        v2 = "/sys/fs/cgroup"
        controllers = os.path.join(v2, "cgroup.controllers")
        if os.path.exists(controllers) and "cpu" in open(controllers).read().split():
            self.v2, self.root = True, v2
            with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
        elif os.path.isdir("/sys/fs/cgroup/cpu") and \
                os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
            self.v2, self.root = False, "/sys/fs/cgroup/cpu"
        else:
            raise OSError("no cgroup cpu controller found (neither v2 cpu.max nor v1 cpu)")
        self.path = os.path.join(parent.path if parent else self.root, name)
        os.mkdir(self.path)
        if self.v2 and parent is None:
            with open(os.path.join(self.path, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def limit(self, cpus: float | None) -> None:
        """At most ``cpus`` CPUs (None: no limit)."""
        if self.v2:
            quota = "max" if cpus is None else str(max(1000, int(cpus * self.PERIOD_US)))
            self._write("cpu.max", f"{quota} {self.PERIOD_US}")
        else:
            self._write("cpu.cfs_quota_us", -1)
            self._write("cpu.cfs_period_us", self.PERIOD_US)
            if cpus is not None:
                self._write("cpu.cfs_quota_us", max(1000, int(cpus * self.PERIOD_US)))

    def weight(self, shares: int) -> None:
        """The group's CPU weight against its siblings (1024: one ordinary process)."""
        if self.v2:
            self._write("cpu.weight", max(1, min(10000, round(shares * 100 / 1024))))
        else:
            self._write("cpu.shares", shares)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", pid)

    def close(self) -> None:
        """Move the processes back to the root group and remove this one."""
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                        f.write(pid)
                except OSError:
                    pass   # exited meanwhile
            for _ in range(50):   # a process moved out leaves the group a moment later
                try:
                    os.rmdir(self.path)
                    return
                except OSError:
                    time.sleep(0.02)
            os.rmdir(self.path)
        except OSError as e:
            print(f"could not remove {self.path}: {e}", file=sys.stderr)


def measure(history: list, target: float) -> dict:
    rows = history
    start = rows[0]["time_s"] - rows[0]["wall_s"]
    middle = rows[1:-1] or rows
    round_s = (middle[-1]["time_s"] - (middle[0]["time_s"] - middle[0]["wall_s"])) / len(middle)
    hit = next((r for r in rows if (r["test_accuracy"] or 0) >= target), None)
    return {"round_s": round_s, "to_target_s": None if hit is None else hit["time_s"] - start,
            "target_round": None if hit is None else hit["round"],
            "final_accuracy": rows[-1]["test_accuracy"],
            "accuracy": [r["test_accuracy"] for r in rows],
            "wall_s": [round(r["wall_s"], 3) for r in rows],
            "compute_s": [round(r["compute_s"], 3) for r in rows],
            "overhead_s": [round(r["overhead_s"], 3) for r in rows],
            "late": sum(r.get("late", 0) for r in rows),
            "slow_share": float(np.mean([r["trainer_samples"][0] / max(1, sum(r["trainer_samples"]))
                                         for r in rows[1:]])) if len(rows) > 1 else None}


def summarize(ms: list) -> dict:
    """A row's medians over its repeats (a run that missed the target counts as
    missing it)."""
    def med(key):
        vals = [m[key] for m in ms]
        return None if any(v is None for v in vals) else float(np.median(vals))
    out = {k: med(k) for k in ("round_s", "to_target_s", "target_round", "final_accuracy",
                               "late", "slow_share")}
    out["round_lo"] = min(m["round_s"] for m in ms)
    out["round_hi"] = max(m["round_s"] for m in ms)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds-per-epoch", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.84)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--node-cpus", type=float, default=0.1,
                    help="each trainer's CPU cap in the even cluster (trainer 0: half)")
    ap.add_argument("--rows", default="even,sync,backup=1,balance,both")
    ap.add_argument("--priority", type=float, default=32.0,
                    help="the run's CPU weight, in ordinary processes (cpu.shares / 1024)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import ddlf_actors as ddlf
    from ddlf_actors.apps import datasets, train_sync
    from ddlf_actors.apps.config import TrainConfig
    from ddlf_actors.apps.schemes.pool import start_trainers, stop_trainers

    datasets.ensure("fashion-mnist")
    cpu = cpu_per_sample()
    duty = 12.0   # the slowdown hook's pace (wall per CPU time), without cgroups only
    print(f"MLP 784-{HIDDEN}-10: {cpu * 1e6:.1f} us CPU per sample", file=sys.stderr)
    K = 4
    ddlf.init(num_cpus=K)
    limits: list[CpuLimit] = []
    group: CpuLimit | None = None
    how = "cgroup"
    try:
        trainer_cls = make_trainer_cls()
        config = TrainConfig(workers=K, trainer_cls=trainer_cls, progress=False)
        trainers = start_trainers(mlp_fn, "fashion-mnist", config)
        try:
            pids = ddlf.get([t.pace.remote(1.0) for t in trainers])
            try:
                # The run's processes (driver, head, node, workers) get the weight of
                # --priority ordinary processes: on a machine loaded by other jobs they
                # still get what the caps allow, and the caps bound what they can take.
                group = CpuLimit(f"ddlf-stragglers-{os.getpid()}")
                group.weight(int(args.priority * 1024))
                for proc in [psutil.Process()] + psutil.Process().children(recursive=True):
                    if proc.pid not in pids:
                        try:
                            group.add(proc.pid)
                        except OSError:
                            pass   # exited
                for j, pid in enumerate(pids):
                    lim = CpuLimit(f"trainer-{j}", parent=group)
                    limits.append(lim)
                    lim.limit(args.node_cpus)
                    lim.add(pid)
                how = ("cgroup v2 cpu.max" if limits[0].v2 else "cgroup v1 cpu.cfs_quota_us") + \
                      f" ({args.node_cpus:g} CPU per trainer, trainer 0 at {args.node_cpus / 2:g})"
            except OSError as e:
                for lim in limits + ([group] if group is not None else []):
                    lim.close()
                limits, group = [], None
                ddlf.get([t.pace.remote(duty) for t in trainers])
                how = f"slowdown hook (trainer 0 paced 2x slower): cgroups unavailable ({e})"
            print(f"slow node: {how}", file=sys.stderr)
            init = mlp_fn().get_weights()
            runs: dict = {}
            rows = [r.strip() for r in args.rows.split(",")] * args.repeat
            for row in rows:
                slow = not row.startswith("even")
                if limits:
                    limits[0].limit(args.node_cpus / (2 if slow else 1))
                else:
                    ddlf.get(trainers[0].pace.remote(duty * (2 if slow else 1)))
                opts = {"backup=1": dict(backup_workers=1), "balance": dict(balance=True),
                        "both": dict(backup_workers=1, balance=True)}.get(row, {})
                t = time.perf_counter()
                res = train_sync(mlp_fn, "fashion-mnist", trainers=trainers,
                                 trainer_cls=trainer_cls, workers=K, master_epochs=args.epochs,
                                 rounds_per_epoch=args.rounds_per_epoch, initial_weights=init,
                                 seed=0, progress=False, **opts)
                m = measure(res.history, args.target)
                m["run_s"] = time.perf_counter() - t
                usage = ddlf.get([tr.usage.remote() for tr in trainers])
                m["wall_per_cpu"] = [round(w / c, 1) if c else None for c, w in usage]
                m["fit_cpu_s"] = [round(c, 2) for c, w in usage]
                runs.setdefault(row, []).append(m)
                print(f"{row}: {m}", file=sys.stderr)
        finally:
            for lim in limits:   # first: a stopped trainer's process must not stay capped
                lim.close()
            limits = []
            if group is not None:
                group.close()
                group = None
            stop_trainers(trainers)
    finally:
        for lim in limits:
            lim.close()
        if group is not None:
            group.close()
        ddlf.shutdown()

    results = {row: summarize(ms) for row, ms in runs.items()}
    base = results.get("even")
    print(f"\n4 trainers, trainer 0 slowed to half speed by {how}; MLP on Fashion-MNIST, "
          f"{args.epochs} epochs x {args.rounds_per_epoch} rounds, target {args.target}, "
          f"median of {args.repeat}\n")
    print(f"| {'row':<11} | round s | spread | vs even | to {args.target} s | vs even | at round | "
          "final acc | late deltas | trainer 0 share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row, m in results.items():
        rr = m["round_s"] / base["round_s"] if base else float("nan")
        tt = (m["to_target_s"] / base["to_target_s"]
              if base and m["to_target_s"] and base["to_target_s"] else None)
        print(f"| {row:<11} | {m['round_s']:.3f} | {m['round_lo']:.2f}-{m['round_hi']:.2f} | "
              f"{rr:.2f}x | "
              f"{'-' if m['to_target_s'] is None else format(m['to_target_s'], '.2f')} | "
              f"{'-' if tt is None else format(tt, '.2f') + 'x'} | "
              f"{'-' if m['target_round'] is None else format(m['target_round'], 'g')} | {m['final_accuracy']:.4f} | {m['late']:g} | "
              f"{m['slow_share']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"how": how, "cpu_per_sample_s": cpu, "node_cpus": args.node_cpus,
                       "results": results, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
