"""What naming a cache entry by its source costs, next to mapping and building the entry.

    python benchmarks/runtime/dataset_cache_key.py [--dataset fashion-mnist] [--data-dir DIR] [--n 200]

``datasets.load_shared`` names each cache entry by what it was built from: for a
dataset name, the files ``load`` would read (found with ``stat`` calls, never read);
for a callable, its pickle, its module's source hash and the files it names. This
times, in one process and a private cache directory, the median over ``--n`` calls of:

- the key alone, for the name and for the CLI's ``NamedDataset`` callable;
- mapping the finished entry (the baseline: what a cache hit cost before the key
  named the files);
- a whole cache hit (key + map), and the one build (a miss: read, normalise, write).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

MS = 1e3


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * MS


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-dir", help="where the dataset is (default: datasets.locate)")
    p.add_argument("--n", type=int, default=200, help="calls per figure")
    args = p.parse_args(argv)

    from ddlf_actors.apps import datasets
    from ddlf_actors.apps.cli import NamedDataset
    from ddlf_actors.apps.datasets import cache

    data_dir = args.data_dir or datasets.locate(args.dataset)
    if data_dir is None:
        raise SystemExit(f"{args.dataset} is not on this machine: run "
                         f"'ddlf-train fetch {args.dataset}' or pass --data-dir")
    with tempfile.TemporaryDirectory(prefix="ddlf-key-bench-") as tmp:
        os.environ["DDLF_CACHE_DIR"] = tmp  # a private cache: the first call builds
        start = time.perf_counter()
        (x, _), _ = datasets.load_shared(args.dataset, data_dir=data_dir)
        build_ms = (time.perf_counter() - start) * MS
        entry = os.path.dirname(x.filename)
        named = NamedDataset(args.dataset, data_dir)
        datasets.load_shared(named)  # build the callable's entry too
        rows = [
            ("key of the name (resolve + stat)",
             _median_ms(lambda: cache._named(args.dataset, data_dir), args.n)),
            ("key of NamedDataset (pickle, source hash, stat)",
             _median_ms(lambda: cache._callable_key(named), args.n)),
            ("map the entry (baseline)", _median_ms(lambda: cache._map_entry(entry), args.n)),
            ("hit by name: key + map",
             _median_ms(lambda: datasets.load_shared(args.dataset, data_dir=data_dir), args.n)),
            ("hit by NamedDataset: key + map",
             _median_ms(lambda: datasets.load_shared(named), args.n)),
            ("build by name (the miss, once)", build_ms),
        ]
    base = rows[2][1]
    print(f"{args.dataset} in {data_dir}: {len(x)} training images, median of {args.n} calls")
    print(f"| {'what':<50} | {'ms':>9} | {'/ map':>7} |")
    print(f"|{'-' * 52}|{'-' * 11}|{'-' * 9}|")
    for what, ms in rows:
        print(f"| {what:<50} | {ms:9.3f} | {ms / base:7.2f} |")


if __name__ == "__main__":
    main()
