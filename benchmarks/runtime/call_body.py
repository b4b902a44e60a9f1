"""What a CALL frame's body costs: the typed specs (runtime/wire/callspec.py) next to the
hand-built tuples they replaced, in bytes and in time to encode and decode, in-process.

    python benchmarks/runtime/call_body.py

"encode" is what the caller does per call (build the body, pickle it with
``dumps_with_refs``); "decode" is what the worker does (unpickle, read the fields). The old
decode is the positional unpacking the worker did (``name, args, kwargs, *extra = ...``).
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

from ddlf_actors.runtime.client.object_store import dumps_with_refs  # noqa: E402
from ddlf_actors.runtime.wire.callspec import STREAMING, CallSpec, TaskSpec  # noqa: E402
from ddlf_actors.runtime.wire.serialization import loads  # noqa: E402

FID = os.urandom(16)
GROUP = {"group_id": "g1", "bundles": [{"CPU": 1.0}], "capture": False}


def _old_actor(method, args, kwargs, nret=1, bp=-1):
    return (method, args, kwargs) if nret == 1 else (method, args, kwargs, nret, bp)


def _old_task(args, kwargs, nret=1, bp=-1, group=None):
    body = (FID, "f", "job1", args, kwargs)
    if group is not None:
        return (*body, nret, bp, group)
    if nret != 1:
        return (*body, nret, bp)
    return body


def _old_actor_decode(body):
    name, args, kwargs, *extra = body
    nret = extra[0] if extra else 1
    limit = extra[1] if len(extra) > 1 else -1
    return name, args, kwargs, nret, limit


def _old_task_decode(body):
    fn_id, fn_name, job_id, args, kwargs, *extra = body
    nret = extra[0] if extra else 1
    limit = extra[1] if len(extra) > 1 else -1
    group = extra[2] if len(extra) > 2 else None
    return fn_id, fn_name, job_id, args, kwargs, nret, limit, group


CASES = [
    ("actor call, no args", lambda: _old_actor("small_value", (), {}),
     lambda: CallSpec("small_value", (), {}).to_wire(), _old_actor_decode, CallSpec.from_wire),
    ("actor call, 3 args", lambda: _old_actor("train", (1, 2.5, "x"), {"epochs": 1}),
     lambda: CallSpec("train", (1, 2.5, "x"), {"epochs": 1}).to_wire(), _old_actor_decode,
     CallSpec.from_wire),
    ("actor call, streaming", lambda: _old_actor("gen", (3,), {}, STREAMING, 4),
     lambda: CallSpec("gen", (3,), {}, STREAMING, 4).to_wire(), _old_actor_decode,
     CallSpec.from_wire),
    ("actor call, 1 MB array", lambda: _old_actor("f", (np.ones(1 << 18, np.float32),), {}),
     lambda: CallSpec("f", (np.ones(1 << 18, np.float32),), {}).to_wire(), _old_actor_decode,
     CallSpec.from_wire),
    ("task, no args", lambda: _old_task((), {}),
     lambda: TaskSpec(FID, "f", "job1", (), {}).to_wire(), _old_task_decode,
     TaskSpec.from_wire),
    ("task, num_returns=2", lambda: _old_task((1,), {}, 2),
     lambda: TaskSpec(FID, "f", "job1", (1,), {}, 2).to_wire(), _old_task_decode,
     TaskSpec.from_wire),
    ("task in a placement group", lambda: _old_task((1,), {}, group=GROUP),
     lambda: TaskSpec(FID, "f", "job1", (1,), {}, placement=GROUP).to_wire(),
     _old_task_decode, TaskSpec.from_wire),
]


def _best_us(fn, n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=25)) / n * 1e6


def _measure(old_body, new_body, old_decode, new_decode) -> tuple:
    old_segs, _ = dumps_with_refs(old_body())
    new_segs, _ = dumps_with_refs(new_body())
    old_bytes = sum(memoryview(s).nbytes for s in old_segs)
    new_bytes = sum(memoryview(s).nbytes for s in new_segs)
    n = 50 if old_bytes > 100_000 else 2_000
    return (old_bytes, new_bytes,
            _best_us(lambda: dumps_with_refs(old_body()), n),
            _best_us(lambda: dumps_with_refs(new_body()), n),
            _best_us(lambda: old_decode(loads(old_segs)), n),
            _best_us(lambda: new_decode(loads(new_segs)), n))


def main(argv=None) -> None:
    # No options; a parser all the same, so --help answers instead of running the benchmark.
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    rows = [(name, *_measure(*fns)) for name, *fns in CASES]
    head = ("body", "bytes old", "bytes spec", "encode old us", "encode spec us",
            "decode old us", "decode spec us")
    widths = [max(len(head[0]), *(len(r[0]) for r in rows))] + [len(h) for h in head[1:]]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        cells = [r[0], str(r[1]), str(r[2])] + [f"{v:.2f}" for v in r[3:]]
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)))


if __name__ == "__main__":
    main()
