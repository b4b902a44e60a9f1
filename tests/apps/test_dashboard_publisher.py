"""DashboardPublisher, the callback every run has: what it sends to the head and when."""

from __future__ import annotations

import logging
import types

import pytest

from ddlf_actors.apps.callbacks import DashboardPublisher
from ddlf_actors.util import dashboard


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr(dashboard, "publish_run", lambda run_id, **kw: calls.append((run_id, kw)))
    return calls


def _run():
    cfg = types.SimpleNamespace(workers=3, min_workers=1)
    return types.SimpleNamespace(scheme="sync", config=cfg, total_rows=4, rows_done=0,
                                 events=[], model="m", dataset="d")


def test_it_sends_the_run_then_rows_events_and_the_end(sent):
    run, pub = _run(), DashboardPublisher()
    pub.on_train_begin(run)
    lost = {"kind": "trainer_lost", "detail": "x", "round": 1}
    run.events.append(lost)
    pub.on_event(lost, run)
    # a checkpoint reaches no callback: it is in run.events only, and goes with the next row
    run.events.append({"kind": "checkpoint", "detail": "/ck", "round": 1})
    pub.on_row({"round": 1, "test_accuracy": 0.5}, run)
    pub.on_train_end(object())
    assert {rid for rid, _ in sent} == {pub.run_id}
    kinds = [kw for _, kw in sent]
    assert kinds[0]["info"]["scheme"] == "sync" and kinds[0]["info"]["workers"] == 3
    assert [e["kind"] for e in kinds[1]["events"]] == ["trainer_lost"]
    assert kinds[2]["rows"] == [{"round": 1, "test_accuracy": 0.5}]
    assert [e["kind"] for e in kinds[2]["events"]] == ["checkpoint"]   # each event once
    assert kinds[3] == {"events": [], "status": "finished"}


def test_a_run_that_raised_ends_failed(sent):
    run, pub = _run(), DashboardPublisher()
    pub.on_train_begin(run)
    pub.on_train_end(None)
    assert sent[-1][1]["status"] == "failed"


def test_a_failing_publish_stops_publishing_with_one_warning(monkeypatch, caplog):
    calls = []

    def broken(run_id, **kw):
        calls.append(kw)
        raise ConnectionError("the head went away")
    monkeypatch.setattr(dashboard, "publish_run", broken)
    run, pub = _run(), DashboardPublisher()
    with caplog.at_level(logging.WARNING, logger="ddlf_actors.train"):
        pub.on_train_begin(run)
        pub.on_row({"round": 1}, run)
        pub.on_train_end(object())
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records if "dashboard" in r.getMessage()] == [
        f"not publishing run {pub.run_id} to the dashboard any more: the head went away"]
