"""Train a small GPT across DDLF trainers on text, then sample from it.

    python examples/gpt_text.py                        # Debian's fortunes (fetched if need be)
    python examples/gpt_text.py --text 'notes/*.txt'   # your own UTF-8 files
    python examples/gpt_text.py --framework keras --epochs 2 --workers 2

The driver never sends text: every node tokenizes the corpus once into its dataset
cache, and each round the driver sends the trainers window numbers (offsets into that
array), as the DDLF paper sends image indices. Starts an embedded 2-CPU cluster.
"""

from __future__ import annotations

import argparse

from ddlf_actors.apps import datasets, lm, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", help="a glob of UTF-8 files (default: the fortunes corpus)")
    p.add_argument("--framework", choices=lm.FRAMEWORKS, default=lm.DEFAULT_FRAMEWORK)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--stride", type=int, help="between training windows (default: context); "
                                              "larger trains on a sample of them, faster")
    args = p.parse_args()

    options = {"context": args.context, "stride": args.stride}
    ds = (datasets.text(args.text, **options) if args.text
          else datasets.corpus("fortunes", **options))
    ds.prepare()   # find (or fetch) the files and tokenize them on this node; train() would
    steps = lm.steps_per_trainer(ds.windows("train"), args.workers, 32, args.epochs)
    # batch_size: the batch those steps are of, so the schedule follows samples if the run
    # splits the batch between the trainers (scheme="auto" may).
    model_fn = lm.GptModelFn(ds, framework=args.framework, size="tiny", total_steps=steps,
                             batch_size=32)
    print(f"{ds.__name__}: {ds.windows('train'):,} training windows, "
          f"{ds.info['tokens']['validation']:,} validation tokens; {model_fn}")

    result = train(model_fn, ds, workers=args.workers, master_epochs=args.epochs)
    last = [r for r in result.history if r["test_loss"] is not None][-1]
    print(f"validation loss {last['test_loss']:.3f} ({last['bits_per_byte']:.2f} bits per "
          f"byte) after {last['tokens']:,} tokens, {last['time_s']:.0f} s")
    print(result.generate("A fool", 200))


if __name__ == "__main__":
    main()
