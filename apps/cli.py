"""``ddlf-train``: train on a DDLF cluster from the command line, or fetch a dataset.

    ddlf-train run --dataset fashion-mnist --scheme sync --workers 2 --master-epochs 2 \\
        --out runs/fmnist
    ddlf-train run --dataset fortunes --model gpt-tiny --workers 2     # a language model
    ddlf-train generate --run ddlf-run --prompt "A fool"
    ddlf-train fetch fashion-mnist

``run`` starts an embedded cluster unless ``--address`` is given (``--backend ray``: a
local Ray instance, or the Ray cluster at ``--address ray://host:10001`` or ``auto``), trains
the paper's CNN (in Keras, or in PyTorch with ``--framework torch``; Keras on another backend
with ``--keras-backend jax``) with a progress bar, prints a table of epoch, time and
accuracy, and writes the model (``model.keras``, or ``model.pt``: the module's state dict),
``history.csv``, ``history.json`` and ``training.png`` to ``--out`` (and TensorBoard logs
to ``--tensorboard DIR``). With ``--checkpoint-every N`` it also keeps checkpoints in
``--out``; ``--resume DIR`` continues from one. TensorFlow's start-up lines are hidden unless ``--verbose``.
Every mistake in the arguments is reported in one line, exit status 2, before a cluster
starts or a dataset is fetched. On text (``--dataset fortunes`` or ``text:PATH``) it trains
a GPT instead (``lm/cli.py``: its flags, the saved tokenizer and settings, ``generate``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from .config import BACKENDS, TrainConfig
from .lm import cli as lm_cli

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
                     help="a registered name (fashion-mnist, mnist, cifar10), a directory "
                          "of partition files (part-00000.npz ...), or text: fortunes (the "
                          "Debian corpus) or text:PATH (your UTF-8 files, a glob)")
    run.add_argument("--data-dir", help="where the dataset's files are (default: the lookup "
                                        "order of datasets.load)")
    run.add_argument("--scheme", default="auto",
                     help="a registered scheme: " + ", ".join(_scheme_names()) + " (default auto: the ring, its rounds and codec chosen from K, the model and a probe of the links)")
    run.add_argument("--workers", default="2",
                     help="trainers: K, or MIN:MAX for an elastic run that starts with MIN "
                          "and grows as CPUs appear")
    run.add_argument("--resume", metavar="DIR",
                     help="continue from the last checkpoint in DIR (a previous --out); "
                          "writes into DIR unless --out is given")
    run.add_argument("--framework", choices=("keras", "torch"),
                     help="the paper's CNN in Keras (the default for images; model.keras) or "
                          "in PyTorch (Adam 1e-3 and cross-entropy, as the Keras one compiles; "
                          "model.pt, its state dict): pip install 'ddlf-actors[torch]'; a "
                          "GPT on text trains on torch unless told (the faster one here)")
    run.add_argument("--compression", metavar="SPEC",
                     help="encode what crosses the wire: one codec spec for weights and "
                          "deltas (none, lz4, zstd[:level], fp16, int8, topk:FRACTION, a lossy "
                          "one with :ef or :noef), or DOWN,UP for the weights the driver sends "
                          "and the deltas the trainers return, e.g. fp16,topk:0.01")
    _add_config_flags(run)
    _add_scheme_flags(run)
    run.add_argument("--limit", type=int, help="train on the first N samples only (smoke runs)")
    run.add_argument("--address", help="join a running cluster (default: start an embedded one); "
                                       "with --backend ray: auto, ray://host:10001 or host:port")
    run.add_argument("--cluster", metavar="FILE",
                     help="train on the cluster `ddlf up FILE` started (the driver runs "
                          "here; the head's address and token come from its host over SSH)")
    run.add_argument("--backend", choices=BACKENDS, default="ddlf",
                     help="run the trainers on DDLF's actors (default) or on Ray's "
                          "(pip install 'ddlf-actors[ray]')")
    run.add_argument("--token-file", help="file holding the cluster token (or set DDLF_AUTH_TOKEN)")
    run.add_argument("--token", help=argparse.SUPPRESS)
    run.add_argument("--out", help="output directory (default: ddlf-run, or the --resume DIR)")
    run.add_argument("--tensorboard", metavar="DIR",
                     help="also write TensorBoard logs to DIR (by round and by time)")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("--verbose", action="store_true",
                     help="show TensorFlow's start-up and log lines (TF_CPP_MIN_LOG_LEVEL=0), "
                          "the trainers' and the driver's")
    lm_cli.add_run_flags(run)
    lm_cli.add_generate_command(sub)
    fetch = sub.add_parser("fetch", help="download a dataset into ~/.cache/ddlf/<name>")
    fetch.add_argument("name")
    fetch.add_argument("--force", action="store_true")
    return p


# What each choice needs installed, and the extra that brings it.
_NEEDS = {"torch": ("torch", "torch"), "jax": ("jax", "jax")}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The spellings a TrainConfig flag had before the flags were generated from its fields,
# kept so that scripts using them still work.
_ALIASES = {"rejoin_timeout_s": ("--rejoin-timeout",)}
# What a flag does on the command line beyond its field's help.
_CLI_NOTES = {"checkpoint_every": "written into --out"}


def _config_fields() -> list:
    """TrainConfig's fields that ``ddlf-train run`` takes as flags (``cli`` is not None):
    the rest (workers, compression, backend ...) have flags of their own shape below."""
    import dataclasses

    return [f for f in dataclasses.fields(TrainConfig) if f.metadata.get("cli") is not None]


def _add_argument(group, name: str, f, text: str, default=None, aliases=()) -> None:
    """A flag for an option field, of the kind its metadata says."""
    kind = _cli_type(f)
    if kind == "flag":
        group.add_argument(_flag(name), *aliases, dest=name, action="store_true",
                           default=default, help=text)
    elif kind == "bool":
        group.add_argument(_flag(name), *aliases, dest=name, default=default,
                           action=argparse.BooleanOptionalAction, help=text)
    else:
        conv = {"int": int, "float": float}.get(kind, str)
        choices = f.metadata.get("choices")
        group.add_argument(_flag(name), *aliases, dest=name, type=conv, help=text,
                           default=default, choices=choices,
                           metavar=None if choices else {"int": "N", "float": "X"}.get(kind, "VALUE"))


def _add_config_flags(run) -> None:
    """A flag per TrainConfig field the command line takes, with the field's default,
    so that ``ddlf-train run`` and ``train()`` default alike."""
    group = run.add_argument_group("run settings (train()'s keywords of the same names)")
    for f in _config_fields():
        text = "; ".join(t for t in (f.metadata["help"], _CLI_NOTES.get(f.name)) if t)
        if f.default is not None and "(default" not in text:
            text += f" (default {f.default})"
        _add_argument(group, f.name, f, text, default=f.default,
                      aliases=_ALIASES.get(f.name, ()))


def _config_options(args) -> dict:
    """TrainConfig's settings from their flags (those left out are None: the default)."""
    return {f.name: getattr(args, f.name) for f in _config_fields()
            if getattr(args, f.name) is not None}


def _scheme_fields() -> dict:
    """Every scheme setting the command line takes: name -> [(scheme, dataclass field)],
    from the registered schemes' options dataclasses (one list, not two)."""
    import dataclasses

    from .schemes import registry

    out: dict = {}
    for scheme in registry.names():
        for f in dataclasses.fields(registry.get(scheme).Options):
            if f.metadata.get("cli") is not None:
                out.setdefault(f.name, []).append((scheme, f))
    return out


def _cli_type(f) -> str:
    kind = f.metadata.get("cli")
    if kind == "auto":
        kind = getattr(f.metadata.get("check"), "cli_type", "str")
    return kind


def _add_scheme_flags(run) -> None:
    """A flag per scheme setting, its help saying which schemes read it (and how, when
    they read it differently)."""
    group = run.add_argument_group(
        "scheme settings (each applies to the schemes it names; defaults: the scheme's, "
        "see docs/training.md)")
    for name, readers in _scheme_fields().items():
        f = readers[0][1]
        helps: dict[str, list[str]] = {}
        for scheme, field in readers:
            helps.setdefault(field.metadata["help"], []).append(scheme)
        text = "; ".join(f"{', '.join(schemes)}: {h}" for h, schemes in helps.items())
        _add_argument(group, name, f, text)


def _scheme_names() -> list[str]:
    from .schemes import registry

    return registry.names()


def _scheme_options(args) -> dict:
    """The scheme settings given on the command line (the rest stay None)."""
    return {name: getattr(args, name) for name in _scheme_fields()
            if getattr(args, name, None) is not None}


def _workers_arg(text: str):
    """``--workers``: ``K`` or ``MIN:MAX``; a ``_UsageError`` for anything else."""
    try:
        if ":" in text:
            lo, hi = (int(v) for v in text.split(":"))
            if not 1 <= lo <= hi:
                raise ValueError
            return (lo, hi)
        return int(text)   # TrainConfig says what is wrong with a number below 1
    except ValueError:
        raise _UsageError(f"--workers {text}: use a number of trainers (2) or a range "
                          "MIN:MAX with 1 <= MIN <= MAX (2:4)") from None


def _compression_arg(text: str, scheme):
    """``--compression``: ``SPEC`` or ``DOWN,UP``, checked for the ``scheme`` class; a
    ``_UsageError`` naming the valid forms for anything else."""
    from .config import ConfigError
    from .schemes.wire import Wire

    parts = [p.strip() for p in text.split(",")]
    spec = parts[0] if len(parts) == 1 else tuple(parts)
    try:
        Wire(spec, scheme.name, scheme.wire_modes)
    except ConfigError as e:
        raise _UsageError(f"--compression {text}: {e.problem}") from None
    except ValueError as e:
        raise _UsageError(f"--compression {text}: {e}") from None
    return spec


class _UsageError(Exception):
    """A mistake on the command line: one line on stderr, exit status 2."""


def _check_args(args) -> None:
    """Every check that needs neither a cluster nor a download, so that a mistake is
    reported before either starts. Reads --token-file into ``args.token``."""
    from . import checkpoint, datasets
    from .config import ConfigError

    if args.out is None:
        args.out = args.resume or "ddlf-run"
    text = lm_cli.is_text(args.dataset)
    if args.framework is None:   # the faster one for a GPT (lm.DEFAULT_FRAMEWORK)
        from .lm import DEFAULT_FRAMEWORK

        args.framework = DEFAULT_FRAMEWORK if text else "keras"
    args.workers = _workers_arg(str(args.workers))
    for flag, path in (("--out", args.out), ("--tensorboard", args.tensorboard)):
        if path is not None:
            _check_output_dir(flag, path)
    from .schemes import registry
    from .schemes.api import split_options

    given = _scheme_options(args)
    if args.scheme == "auto":   # a setting only another scheme reads names that scheme
        from .schemes.auto import named_by

        pair = args.compression is not None and "," in args.compression
        args.scheme = named_by({**given, "compression": ("", "") if pair else None}) or "auto"
    try:
        scheme = registry.get(args.scheme)
    except registry.UnknownSchemeError as e:
        raise _UsageError(f"--scheme {args.scheme}: {e}") from None
    for name in given:
        if name not in scheme.Options.names():
            raise _UsageError(f"{_flag(name)} does not apply to --scheme {args.scheme}; it "
                              f"applies to --scheme {', '.join(registry.accepting(name))}")
    if args.limit is not None and args.limit < 1:
        raise _UsageError(f"--limit must be >= 1, got {args.limit}")
    _check_framework_args(args)
    if args.compression is not None:
        args.compression = _compression_arg(args.compression, scheme)
    try:   # the same checks train() makes, named by their flags
        config, options = split_options(args.scheme, dict(
            _config_options(args), workers=args.workers,
            checkpoint_dir=args.out if args.checkpoint_every else None, **given))
        options.resolve(config)
    except ConfigError as e:
        raise _UsageError(f"{_option_flag(e.option)} {e.problem}") from None
    lm_cli.check_args(args, _UsageError)
    if text:
        pass   # found (or fetched) and checked on the driver once the cluster is joined
    elif os.path.isdir(args.dataset):
        if args.limit or args.data_dir:
            raise _UsageError("--limit and --data-dir apply to named datasets only")
    elif args.dataset not in datasets.names():
        raise _UsageError(f"unknown dataset {args.dataset!r}: use one of "
                          f"{', '.join(sorted(datasets.names()))}, a directory of "
                          "partition files, fortunes or text:PATH")
    elif args.data_dir is not None:
        datasets.ensure(args.dataset, args.data_dir)   # looks there only: no download
    if args.resume is not None:
        try:
            checkpoint.load(args.resume)
        except (FileNotFoundError, ValueError) as e:
            raise _UsageError(f"--resume {args.resume}: {e}") from None
    _check_backend(args)
    if args.cluster and (args.address or args.backend != "ddlf"):
        raise _UsageError(f"--cluster {args.cluster} joins the DDLF cluster `ddlf up` started: "
                          "leave out --address and --backend ray")
    if args.token_file:
        try:
            with open(args.token_file) as f:
                args.token = f.read().strip()
        except OSError as e:
            raise _UsageError(f"--token-file {args.token_file}: {e.strerror}") from None


def _check_framework_args(args) -> None:
    """--framework and --keras-backend agree, and what they name is installed."""
    import importlib.util

    if args.keras_backend and args.framework != "keras":
        raise _UsageError(f"--keras-backend {args.keras_backend} runs a Keras model on that "
                          f"backend; --framework {args.framework} trains a PyTorch module: "
                          "leave --keras-backend out")
    for choice, flag in ((args.framework, "--framework"), (args.keras_backend, "--keras-backend")):
        module, extra = _NEEDS.get(choice or "", (None, None))
        if module and importlib.util.find_spec(module) is None:
            raise _UsageError(f"{flag} {choice} needs {module}, which is not installed: "
                              f"pip install 'ddlf-actors[{extra}]' (on every machine of the "
                              "cluster)")


def _check_backend(args) -> None:
    """--backend and --address agree, and Ray is importable when asked for."""
    address = args.address or ""
    if args.backend == "ddlf":
        if address.startswith("ray://"):
            raise _UsageError(f"--address {address} is a Ray Client address: add --backend ray")
        return
    if args.token_file or args.token:
        raise _UsageError("--token-file is DDLF's cluster token; a Ray cluster (--backend ray) "
                          "takes none")
    if address and address != "auto" and not address.startswith("ray://") \
            and ":" not in address:
        raise _UsageError(f"--address {address}: with --backend ray use auto, "
                          "ray://host:10001 (Ray Client) or host:port (a Ray head's GCS)")
    try:
        from ddlf_actors import ray_session

        ray_session.import_ray()
    except ImportError as e:
        raise _UsageError(f"--backend ray: {e}") from None


def _option_flag(option: str) -> str:
    """The flag for a ``ConfigError``'s option (``"min_workers=3"``: ``--min-workers 3``)."""
    name, eq, value = option.partition("=")
    flag = _flag(name.strip())
    value = value.strip().rstrip(":")
    return f"{flag} {value}" if eq and value else flag


def _check_output_dir(flag: str, path: str) -> None:
    """``path`` is a directory we can write, or can be made one."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise _UsageError(f"{flag} {path} is an existing file; give a directory (it is "
                          "created if missing)")
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise _UsageError(f"{flag} {path}: {parent} is a file, so the directory cannot be made")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _UsageError(f"{flag} {path}: {parent} is not writable")


def _dataset_arg(args):
    """Turn --dataset/--data-dir/--limit into what the schemes take, fetching a named
    dataset that is not on this machine (``_check_args`` has checked them)."""
    from . import datasets

    if os.path.isdir(args.dataset):
        return datasets.partitioned(args.dataset), f"partitions in {args.dataset}"
    datasets.ensure(args.dataset, args.data_dir)  # find it here, else fetch it
    if args.data_dir is None and not args.limit:
        return args.dataset, args.dataset
    return NamedDataset(args.dataset, args.data_dir, args.limit), args.dataset


def _run(args) -> int:
    import ddlf_actors as ddlf

    from . import frameworks, models, report
    from .callbacks import TensorBoard
    from .schemes import train

    _check_args(args)
    runtime_env = None
    if args.verbose:   # TF's lines, here and in every trainer (tf_startup.py)
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        runtime_env = {"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "0"}}
    t0 = time.perf_counter()
    # Connect before fetching the dataset: a wrong --address fails in seconds, not
    # after a download.
    if args.backend == "ray":   # the schemes then run their trainers on Ray (apps/backends)
        ddlf.init(args.address, backend="ray", runtime_env=runtime_env)
    elif args.address or args.cluster:
        ddlf.init(args.address or args.cluster, token=args.token, runtime_env=runtime_env)
    else:
        ddlf.init(runtime_env=runtime_env)
    text = lm_cli.is_text(args.dataset)
    try:
        if text:   # found, fetched if need be, tokenized and checked here, on the driver
            dataset = lm_cli.dataset(args).prepare()
            label, model_fn = dataset.__name__, lm_cli.model_fn(args, dataset)
        else:
            dataset, label = _dataset_arg(args)
            shape = models.INPUT_SHAPES.get(args.dataset, (28, 28, 1))
            model_fn = _ModelFn(shape, args.framework)
        common = dict(_config_options(args), workers=args.workers, **_scheme_options(args),
                      compression=args.compression, progress=not args.no_progress,
                      resume=args.resume,
                      callbacks=[TensorBoard(args.tensorboard)] if args.tensorboard else [])
        if args.checkpoint_every:
            common.update(checkpoint_dir=args.out)
        result = train(model_fn, dataset, args.scheme, **common)
        total = time.perf_counter() - t0
    finally:
        ddlf.shutdown()
    os.makedirs(args.out, exist_ok=True)
    report.write_history(result.history, args.out)
    what = "PyTorch" if args.framework == "torch" else f"Keras on {args.keras_backend}" \
        if args.keras_backend else "Keras"
    scheme = result.settings.get("scheme") or args.scheme   # auto: the scheme it chose
    report.plot_history(result.history, os.path.join(args.out, "training.png"),
                        f"DDLF {scheme}, {label}, K={args.workers}, {what}")
    # The adapter of the model's framework writes it in that framework's format.
    adapter = frameworks.for_model(result.model)
    adapter.save(result.model, os.path.join(args.out, adapter.model_file))
    saved = [adapter.model_file]
    print(report.format_table(result.history, result.events))
    if text:
        saved += lm_cli.finish(args, result, model_fn, dataset)
    workers = args.workers if isinstance(args.workers, int) else "{}-{}".format(*args.workers)
    print(f"\n{scheme} on {label}, {workers} trainers ({what}): trainers ready in "
          f"{result.startup_s:.1f} s, trained in {result.history[-1]['time_s']:.1f} s, "
          f"{total:.1f} s in all. Wrote {', '.join(saved)}, history.csv, history.json, "
          f"training.png to {args.out}/")
    if result.settings.get("auto"):
        print(result.settings["auto"]["line"])
    if args.tensorboard:
        print(f"TensorBoard logs in {args.tensorboard}/ (tensorboard --logdir {args.tensorboard})")
    if result.stopped_early:
        print(f"stopped early: {result.stopped_early}")
    return 0


class _ModelFn:
    """``models.paper_cnn`` (or ``paper_cnn_torch``) for an input shape, picklable by
    reference. Named for it, as a function is (``__name__``): the dashboard and
    checkpoints call it ``paper_cnn`` (``paper_cnn_torch``)."""

    def __init__(self, input_shape, framework: str = "keras"):
        self.input_shape = tuple(input_shape)
        self.framework = framework
        self.__name__ = "paper_cnn_torch" if framework == "torch" else "paper_cnn"

    def __call__(self):
        from . import models

        if self.framework == "torch":
            return models.paper_cnn_torch(input_shape=self.input_shape)
        return models.paper_cnn(input_shape=self.input_shape)


def main(argv=None) -> int:
    import ddlf_actors as ddlf
    from ddlf_actors import ray_session

    from . import datasets
    from .schemes import TooFewTrainersError, TrainerStartError

    args = _parser().parse_args(argv)
    # Losses and rejoins are logged as they happen (the progress bar prints them too).
    logging.basicConfig(format="ddlf-train: %(message)s")
    logging.getLogger("ddlf_actors.train").setLevel(logging.INFO)
    try:
        if args.command == "fetch":
            print(datasets.fetch(args.name, force=args.force))
            return 0
        if args.command == "generate":
            return lm_cli.generate_command(args)
        return _run(args)
    except (_UsageError, datasets.DatasetNotFoundError, datasets.DatasetFormatError,
            TrainerStartError, TooFewTrainersError, ddlf.errors.UnschedulableError,
            ddlf.errors.AuthenticationError, ddlf.errors.HeadUnreachableError,
            ray_session.RayUnreachableError, FileNotFoundError, ValueError) as e:
        # A user's mistake, not a bug: the message says what to do; no traceback.
        print(f"ddlf-train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
