"""ddlf_actors.util.progress.tqdm (Ray's ray.experimental.tqdm_ray): whole progress lines
that reach the driver through the worker's log forwarding."""

from __future__ import annotations

import io
import sys

import pytest

import ddlf_actors as ddlf
from ddlf_actors.util.progress import tqdm


def test_iterating_counts_and_prints_a_final_line():
    out = io.StringIO()
    seen = list(tqdm(range(7), desc="load", file=out, mininterval=3600))
    assert seen == list(range(7))
    lines = out.getvalue().splitlines()
    # The first update prints (nothing printed yet), the rest are rate-limited, close prints.
    assert len(lines) == 2
    assert lines[-1].startswith("load: 100%|") and " 7/7 " in lines[-1]


def test_update_without_total_and_context_manager():
    out = io.StringIO()
    with tqdm(desc="rows", file=out, mininterval=0) as bar:
        bar.update(3)
        bar.update(2)
        bar.set_description("rows!")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("rows: 3it")
    assert lines[-1].startswith("rows!: 5it")
    assert bar.n == 5


def test_disable_prints_nothing_and_iterating_without_iterable_is_refused():
    out = io.StringIO()
    list(tqdm(range(3), file=out, disable=True))
    assert out.getvalue() == ""
    with pytest.raises(TypeError, match="update"):
        iter(tqdm(total=3)).__next__()


def test_a_tasks_progress_reaches_the_driver(cluster, capfd):
    @ddlf.remote
    def work(name):
        from ddlf_actors.util.progress import tqdm as bar

        return sum(bar(range(5), desc=name, mininterval=0))

    assert ddlf.get(work.remote("task A"), timeout=60) == 10
    # Worker output is forwarded asynchronously; wait for the final line to arrive.
    import time

    deadline = time.monotonic() + 20
    text = ""
    while time.monotonic() < deadline:
        text += capfd.readouterr().out
        if "task A: 100%" in text:
            break
        time.sleep(0.1)
    assert "task A: 100%" in text and "5/5" in text, text[-2000:]


def test_ray_layer_maps_tqdm_ray(monkeypatch):
    from ddlf_actors.compat.ray import _finder

    saved = {n: m for n, m in sys.modules.items() if n == "ray" or n.startswith("ray.")}
    for n in saved:
        del sys.modules[n]
    _finder.install()
    try:
        from ray.experimental.tqdm_ray import tqdm as ray_tqdm

        assert ray_tqdm is tqdm
        import ray.experimental

        with pytest.raises(AttributeError, match="tqdm_ray only"):
            ray.experimental.channel  # noqa: B018
    finally:
        _finder.uninstall()
        sys.modules.update(saved)
