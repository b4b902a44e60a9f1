"""Publishing to the head's web dashboard, and finding it.

    from ddlf_actors.util import dashboard

    dashboard.url()                                   # 'http://127.0.0.1:8265', or None
    dashboard.publish_run("my-run", info={"scheme": "sync", "workers": 4})
    dashboard.publish_run("my-run", rows=[{"round": 1, "epoch": 0.1, "time_s": 2.5,
                                           "test_accuracy": 0.61, "test_loss": 1.1}])
    dashboard.publish_run("my-run", status="finished")

``ddlf_actors.apps``' ``train_sync`` and ``train_async`` publish every run this way (see
``apps.callbacks.DashboardPublisher``); anything else that runs for a while can too.
"""

from __future__ import annotations

__all__ = ["publish_run", "url"]


def _plain(d):
    """numpy scalars (and anything else with ``.item()``) as Python numbers."""
    if not isinstance(d, dict):
        return d
    return {k: (v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v)
            for k, v in d.items()}


def publish_run(run_id: str, *, info: dict | None = None, rows=None, events=None,
                status: str | None = None) -> None:
    """Tell the head about a run, to show on its dashboard; returns at once.

    ``info`` (merged into what the run already has: e.g. ``scheme``, ``workers``,
    ``model``, ``dataset``), ``rows`` (history rows: numbers such as ``round``, ``epoch``,
    ``time_s``, ``test_accuracy``, ``test_loss``, ``bytes_sent``), ``events`` (dicts with
    ``kind``, ``detail``, ...) and ``status`` ("running", "finished", "failed") are each
    optional.
    Values must be numbers, strings, bools or None; a dict has at most 48 keys, and one
    call carries at most 256 rows and 256 events. The head keeps the newest 32 runs, up
    to 2000 rows each (older rows thinned) and the last 500 events.

    Raises ``ValueError`` for malformed input (checked here, before sending) and
    ``DDLFError`` when DDLF is not initialized. It is sent without waiting for a reply
    (the order of calls is kept), so publishing never slows the caller down.
    """
    from ddlf_actors.autoinit import core as _core

    # The head's own check (pure, no I/O), imported here: a driver that never publishes
    # does not load the head's package.
    from ddlf_actors.runtime.errors import MessageError
    from ddlf_actors.runtime.head.runs import check

    try:
        data = check({"run_id": run_id, "info": _plain(info),
                      "rows": None if rows is None else [_plain(r) for r in rows],
                      "events": None if events is None else [_plain(e) for e in events],
                      "status": status})
    except MessageError as e:
        raise ValueError(str(e)) from None
    core = _core(auto_init=False)
    core.push_head("publish_run", data)


def url() -> str | None:
    """The URL of the connected head's dashboard, or None if it serves none.
    ``DDLFError`` when DDLF is not initialized."""
    from ddlf_actors.autoinit import core as _core

    return _core(auto_init=False).head_call("dashboard_url")
