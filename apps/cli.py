"""``ddlf-train``: train on a DDLF cluster from the command line, or fetch a dataset.

    ddlf-train run --dataset fashion-mnist --scheme sync --workers 2 --master-epochs 2 \\
        --out runs/fmnist
    ddlf-train fetch fashion-mnist

``run`` starts an embedded cluster unless ``--address`` is given, trains with a progress
bar, prints a table of epoch, time and accuracy, and writes ``model.keras``,
``history.csv``, ``history.json`` and ``training.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["main"]


class NamedDataset:
    """A registered dataset read from ``data_dir`` on each trainer (picklable, no TF)."""

    def __init__(self, name: str, data_dir: str | None, limit: int | None = None):
        self.name = name
        self.data_dir = data_dir
        self.limit = limit

    def __call__(self):
        from . import datasets

        (x, y), (xt, yt) = datasets.load(self.name, data_dir=self.data_dir)
        if self.limit:
            x, y = x[: self.limit], y[: self.limit]
            xt, yt = xt[: max(1, self.limit // 6)], yt[: max(1, self.limit // 6)]
        return (x, y), (xt, yt)

    def source_files(self) -> list:
        """The files ``__call__`` reads, so ``datasets.load_shared`` keys its cache by them
        (their path, size and times) and not only by this object's name and folder."""
        from . import datasets

        if datasets.registry.registered(self.name) is not None:
            return []  # a registered loader reads what it reads; the cache keys its code
        return datasets.source_files(self.name, self.data_dir)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddlf-train", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a model data-parallel on the cluster")
    run.add_argument("--dataset", default="fashion-mnist",
                     help="a registered name (fashion-mnist, mnist, cifar10) or a directory "
                          "of partition files (part-00000.npz ...)")
    run.add_argument("--data-dir", help="where the dataset's files are (default: the lookup "
                                        "order of datasets.load)")
    run.add_argument("--scheme", choices=("sync", "async"), default="sync")
    run.add_argument("--workers", type=int, default=2)
    run.add_argument("--master-epochs", type=int, default=2)
    run.add_argument("--worker-epochs", type=int, default=1)
    run.add_argument("--batch-size", type=int, default=32)
    run.add_argument("--rounds-per-epoch", type=int, default=1)
    run.add_argument("--num-cpus", type=float, default=1, help="CPUs (TF threads) per trainer")
    run.add_argument("--staleness-bound", type=int, help="async: SSP bound")
    run.add_argument("--staleness-scaling", action="store_true", help="async: scale by staleness")
    run.add_argument("--target-accuracy", type=float)
    run.add_argument("--patience", type=int)
    run.add_argument("--limit", type=int, help="train on the first N samples only (smoke runs)")
    run.add_argument("--address", help="join a running cluster (default: start an embedded one)")
    run.add_argument("--token-file", help="file holding the cluster token (or set DDLF_AUTH_TOKEN)")
    run.add_argument("--token", help=argparse.SUPPRESS)
    run.add_argument("--out", default="ddlf-run", help="output directory (default: ddlf-run)")
    run.add_argument("--no-progress", action="store_true")
    fetch = sub.add_parser("fetch", help="download a dataset into ~/.cache/ddlf/<name>")
    fetch.add_argument("name")
    fetch.add_argument("--force", action="store_true")
    return p


def _dataset_arg(args):
    """Turn --dataset/--data-dir/--limit into what the schemes take; fail early if wrong."""
    from . import datasets

    if os.path.isdir(args.dataset):
        if args.limit or args.data_dir:
            raise SystemExit("ddlf-train: --limit and --data-dir apply to named datasets only")
        return datasets.partitioned(args.dataset), f"partitions in {args.dataset}"
    if args.dataset not in datasets.names():
        raise SystemExit(f"ddlf-train: unknown dataset {args.dataset!r}: use one of "
                         f"{', '.join(sorted(datasets.names()))}, or a directory of partition "
                         "files")
    datasets.ensure(args.dataset, args.data_dir)  # find it here, else fetch it
    if args.data_dir is None and not args.limit:
        return args.dataset, args.dataset
    return NamedDataset(args.dataset, args.data_dir, args.limit), args.dataset


def _run(args) -> int:
    import ddlf_actors as ddlf

    from . import models, report
    from .schemes import train_async, train_sync

    dataset, label = _dataset_arg(args)
    token = args.token
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    t0 = time.perf_counter()
    ddlf.init(args.address, token=token) if args.address else ddlf.init()
    try:
        shape = models.INPUT_SHAPES.get(args.dataset, (28, 28, 1))
        model_fn = _ModelFn(shape)
        common = dict(workers=args.workers, master_epochs=args.master_epochs,
                      worker_epochs=args.worker_epochs, batch_size=args.batch_size,
                      rounds_per_epoch=args.rounds_per_epoch, num_cpus=args.num_cpus,
                      target_accuracy=args.target_accuracy, patience=args.patience,
                      progress=not args.no_progress)
        if args.scheme == "sync":
            result = train_sync(model_fn, dataset, **common)
        else:
            result = train_async(model_fn, dataset, staleness_bound=args.staleness_bound,
                                 staleness_scaling=args.staleness_scaling, **common)
        total = time.perf_counter() - t0
    finally:
        ddlf.shutdown()
    os.makedirs(args.out, exist_ok=True)
    report.write_history(result.history, args.out)
    report.plot_history(result.history, os.path.join(args.out, "training.png"),
                        f"DDLF {args.scheme}, {label}, K={args.workers}")
    result.model.save(os.path.join(args.out, "model.keras"))
    print(report.format_table(result.history))
    print(f"\n{args.scheme} on {label}, {args.workers} trainers: trainers ready in "
          f"{result.startup_s:.1f} s, trained in {result.history[-1]['time_s']:.1f} s, "
          f"{total:.1f} s in all. Wrote model.keras, history.csv, history.json, training.png "
          f"to {args.out}/")
    if result.stopped_early:
        print(f"stopped early: {result.stopped_early}")
    return 0


class _ModelFn:
    """``models.paper_cnn`` for an input shape, picklable by reference."""

    def __init__(self, input_shape):
        self.input_shape = tuple(input_shape)

    def __call__(self):
        from . import models

        return models.paper_cnn(input_shape=self.input_shape)


def main(argv=None) -> int:
    import ddlf_actors as ddlf

    from . import datasets
    from .schemes import TrainerStartError

    args = _parser().parse_args(argv)
    try:
        if args.command == "fetch":
            print(datasets.fetch(args.name, force=args.force))
            return 0
        return _run(args)
    except (datasets.DatasetNotFoundError, datasets.DatasetFormatError, TrainerStartError,
            ddlf.errors.UnschedulableError, ddlf.errors.AuthenticationError, ValueError) as e:
        # A user's mistake, not a bug: the message says what to do; no traceback.
        print(f"ddlf-train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
