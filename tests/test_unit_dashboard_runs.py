"""The head's record of published training runs: checked, bounded, thinned, numbered."""

from __future__ import annotations

import math

import pytest

from ddlf_actors.runtime.errors import MessageError
from ddlf_actors.runtime.head.runs import RunStore, check


def _row(i: int) -> dict:
    return {"round": i, "epoch": i / 10, "time_s": i * 0.5, "test_accuracy": i / 1000}


def test_a_run_keeps_info_rows_events_and_status():
    store = RunStore()
    store.publish({"run_id": "a", "info": {"scheme": "sync", "workers": 3}}, owner="o1")
    store.publish({"run_id": "a", "rows": [_row(1), _row(2)],
                   "events": [{"kind": "trainer_lost", "detail": "x"}]}, owner="o1")
    store.publish({"run_id": "a", "info": {"model": "m"}, "status": "finished"}, owner="o1")
    d = store.get("a").detail()
    assert d["info"] == {"scheme": "sync", "workers": 3, "model": "m"}
    assert [r["round"] for r in d["rows"]] == [1, 2]
    assert [e["kind"] for e in d["events"]] == ["trainer_lost"]
    assert d["status"] == "finished"
    # since= gives only what came after: rows and events share one sequence
    assert store.get("a").detail(since=2)["rows"] == []
    assert [e["kind"] for e in store.get("a").detail(since=2)["events"]] == ["trainer_lost"]


def test_rows_past_the_cap_thin_the_old_half_and_keep_the_newest():
    store = RunStore(max_rows=100)
    for i in range(1, 501):
        store.publish({"run_id": "a", "rows": [_row(i)]}, owner=None)
    run = store.get("a")
    rounds = [r["round"] for r in run.rows]
    assert len(rounds) <= 100
    assert rounds == sorted(rounds)
    assert rounds[-1] == 500 and rounds[0] == 1        # the whole span is still there
    assert run.rows_received == 500


def test_old_finished_runs_go_first_and_events_are_bounded():
    store = RunStore(max_runs=3, max_events=5)
    store.publish({"run_id": "live", "info": {}}, owner=None)
    for name in ("f1", "f2", "f3"):
        store.publish({"run_id": name, "status": "finished"}, owner=None)
    assert list(store.runs) == ["live", "f2", "f3"]
    store.publish({"run_id": "live", "events": [{"kind": str(i)} for i in range(9)]}, owner=None)
    assert [e["kind"] for e in store.get("live").events] == ["4", "5", "6", "7", "8"]


def test_a_driver_that_goes_marks_its_running_runs():
    store = RunStore()
    store.publish({"run_id": "a"}, owner="o1")
    store.publish({"run_id": "b", "status": "finished"}, owner="o1")
    store.publish({"run_id": "c"}, owner="o2")
    store.owner_gone("o1")
    assert [store.get(r).status for r in "abc"] == ["driver_gone", "finished", "running"]


@pytest.mark.parametrize("bad, says", [
    ("nope", "takes a dict"),
    ({"info": {}}, "run_id"),
    ({"run_id": "x" * 65}, "run_id"),
    ({"run_id": "a", "kill": True}, "unknown keys"),
    ({"run_id": "a", "status": "exploded"}, "status"),
    ({"run_id": "a", "rows": [{"loss": [1, 2]}]}, "a row['loss']"),
    ({"run_id": "a", "rows": [_row(1)] * 300}, "at most 256"),
    ({"run_id": "a", "info": {f"k{i}": 1 for i in range(60)}}, "keys"),
    ({"run_id": "a", "events": "lost"}, "events must be a list"),
])
def test_a_malformed_publish_is_refused_by_name_and_changes_nothing(bad, says):
    store = RunStore()
    with pytest.raises(MessageError, match=says.replace("[", r"\[").replace("]", r"\]")):
        store.publish(bad, owner=None)
    assert store.runs == {}


def test_values_are_made_json_safe():
    got = check({"run_id": "a", "rows": [{"loss": math.nan, "acc": math.inf, "n": 3}],
                 "events": [{"detail": "x" * 2000}]})
    assert got["rows"] == [{"loss": None, "acc": None, "n": 3}]
    assert len(got["events"][0]["detail"]) == 500
