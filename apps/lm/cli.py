"""``ddlf-train``'s language-model parts: the text flags of ``run``, and ``generate``.

    ddlf-train run --dataset fortunes --model gpt-tiny [--framework torch] --workers 2
    ddlf-train run --dataset text:corpus/*.txt --tokenizer bpe:2048 --context 256
    ddlf-train generate --run ddlf-run --prompt "A fool" -n 200

``apps/cli.py`` owns the command line; it asks this module whether ``--dataset`` is text
(:func:`is_text`), checks the text flags here (:func:`check_args`), builds the dataset
and the model from them, and after the run saves the tokenizer and settings and prints a
sample (:func:`finish`).
"""

from __future__ import annotations

import os

__all__ = ["add_run_flags", "add_generate_command", "is_text", "check_args", "dataset",
           "model_fn", "finish", "generate_command", "MODELS"]

# --model: the GPT sizes (sizes.SIZES) by their CLI names.
MODELS = {"gpt-tiny": "tiny", "gpt-small": "small"}
TEXT_PREFIX = "text:"


def add_run_flags(run) -> None:
    group = run.add_argument_group(
        "language models (--dataset fortunes, or text:PATH for your own UTF-8 files; see "
        "docs/language-models.md)")
    group.add_argument("--model", choices=("paper-cnn", *MODELS),
                       help="paper-cnn for images (the default there); gpt-tiny (0.84 M "
                            "parameters, the default for text) or gpt-small (6.1 M)")
    group.add_argument("--context", type=int, default=128,
                       help="tokens per window (default 128)")
    group.add_argument("--tokenizer", default="byte",
                       help="byte (256 ids, default) or bpe:N (a BPE of N ids trained on the "
                            "training split; pip install 'ddlf-actors[text]')")
    group.add_argument("--learning-rate", type=float,
                       help="the GPT's peak rate (default 1e-3), warmed up over 100 steps "
                            "and decayed by a cosine to a tenth over the run")
    group.add_argument("--sample-prompt", default="",
                       help="at the end, print a sample continuing this text (default: a "
                            "new document)")
    group.add_argument("--sample-tokens", type=int, default=200,
                       help="tokens in that sample (0: none; default 200)")


def add_generate_command(sub) -> None:
    gen = sub.add_parser("generate", help="sample text from a language model a run saved")
    gen.add_argument("--run", required=True, metavar="DIR",
                     help="the --out folder of a ddlf-train run on text")
    gen.add_argument("--prompt", default="", help="text to continue (default: a new document)")
    gen.add_argument("-n", "--tokens", type=int, default=200, help="tokens to sample")
    gen.add_argument("--temperature", type=float, default=0.8)
    gen.add_argument("--top-k", type=int, default=40)
    gen.add_argument("--seed", type=int, default=0)


def is_text(name: str) -> bool:
    from ..datasets.corpora import CORPORA

    return name in CORPORA or name.startswith(TEXT_PREFIX)


def check_args(args, usage_error) -> None:
    """The text flags agree with ``--dataset`` (``usage_error``: the CLI's exception)."""
    text = is_text(args.dataset)
    if not text:
        if args.model in MODELS:
            raise usage_error(f"--model {args.model} trains on text: use --dataset fortunes "
                              "or --dataset text:PATH")
        return
    if args.model == "paper-cnn":
        raise usage_error("--model paper-cnn classifies images; for --dataset "
                          f"{args.dataset} use --model gpt-tiny or gpt-small")
    if args.limit is not None:
        raise usage_error("--limit applies to image datasets; a text run takes --dataset "
                          "text:PATH of a smaller file instead")
    if args.dataset.startswith(TEXT_PREFIX) and args.data_dir is not None:
        raise usage_error("--data-dir finds a named corpus (fortunes); text:PATH names its "
                          "files itself")
    if args.context < 1:
        raise usage_error(f"--context must be >= 1, got {args.context}")
    if args.sample_tokens < 0:
        raise usage_error(f"--sample-tokens must be >= 0, got {args.sample_tokens}")
    if args.learning_rate is not None and not args.learning_rate > 0:
        raise usage_error(f"--learning-rate must be > 0, got {args.learning_rate}")
    try:
        dataset(args)
    except ValueError as e:   # a bad --tokenizer, a missing tokenizers library
        raise usage_error(f"--tokenizer {args.tokenizer}: {e}") from None


def dataset(args):
    """The ``TextDataset`` of ``--dataset``, ``--context``, ``--tokenizer`` (not prepared)."""
    from .. import datasets

    options = {"context": args.context, "tokenizer": args.tokenizer}
    if args.dataset.startswith(TEXT_PREFIX):
        return datasets.text(args.dataset[len(TEXT_PREFIX):], **options)
    return datasets.corpus(args.dataset, data_dir=args.data_dir, **options)


def model_fn(args, ds):
    """The ``GptModelFn`` of ``--model``, ``--framework`` and the run's length, for the
    prepared dataset ``ds``: its cosine decays over each trainer's steps of the run."""
    from . import GptModelFn, steps_per_trainer

    workers = args.workers if isinstance(args.workers, int) else args.workers[1]
    steps = steps_per_trainer(ds.windows("train"), workers, args.batch_size,
                              args.master_epochs, args.worker_epochs)
    # The batch those steps are of: the schedule follows samples if auto splits the batch.
    options = {"total_steps": steps, "batch_size": args.batch_size}
    if args.learning_rate is not None:
        options["learning_rate"] = args.learning_rate
    return GptModelFn(ds, framework=args.framework, size=MODELS[args.model or "gpt-tiny"],
                      **options)


def finish(args, result, model_fn, ds) -> list:
    """Save the tokenizer and settings next to the model and print the sample; the
    files written."""
    from .run_files import save_run

    written = save_run(args.out, model_fn, ds, result.history)
    if args.sample_tokens:
        text = result.generate(args.sample_prompt, args.sample_tokens)
        print(f"\nsample ({args.sample_tokens} tokens at most, temperature 0.8, from "
              f"{args.sample_prompt!r}):\n{text}\n")
    return [os.path.basename(p) for p in written]


def generate_command(args) -> int:
    from .generate import generate
    from .run_files import load_run

    if args.tokens < 0:
        raise ValueError(f"-n must be >= 0, got {args.tokens}")
    model, tok, settings = load_run(args.run)
    print(generate(model, tok, args.prompt, args.tokens, context=settings["model"]["context"],
                   temperature=args.temperature, top_k=args.top_k, seed=args.seed))
    return 0
