"""The head's record of training runs, as their drivers publish them for the dashboard.

A driver of a training run (``ddlf_actors.util.dashboard.publish_run``) sends the run's
description once, then each history row and event as it happens, then how it ended.
The head only keeps them for people to watch: nothing in the cluster reads them back.

Everything is bounded, since any driver may publish: at most ``max_runs`` runs (the
oldest finished one goes first), ``max_rows`` rows per run (past that every other old
row is dropped, so a curve keeps its whole shape at a coarser grain) and ``max_events``
events per run (the oldest go). Each row and event gets a sequence number, so a page
asks only for what it has not seen (``since``).

Pure state with no I/O, and it checks what it is given: a bad publish raises
``MessageError`` naming what is wrong, and changes nothing.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

from ..errors import MessageError

__all__ = ["RunRecord", "RunStore", "RUN_STATUSES", "check"]

RUN_STATUSES = ("running", "finished", "failed", "driver_gone")

_MAX_ID = 64          # characters in a run id
_MAX_KEYS = 48        # keys in an info dict, a row or an event
_MAX_KEY = 64         # characters in a key
_MAX_STR = 500        # characters in a string value (longer ones are cut)
_MAX_BATCH = 256      # rows or events in one publish
_MAX_LIST = 256       # numbers in a list value (a row's per-trainer samples: one per trainer)


class RunRecord:
    """One run: what it is (``info``), its rows and events, and whether it still runs."""

    def __init__(self, run_id: str, owner: str | None, max_rows: int, max_events: int):
        self.run_id = run_id
        self.owner = owner
        self.info: dict = {}
        self.rows: list[dict] = []
        self.events: collections.deque = collections.deque(maxlen=max_events)
        self.max_rows = max_rows
        self.status = "running"
        self.started = time.time()
        self.updated = self.started
        self.rows_received = 0
        self.seq = 0          # the last sequence number handed out (rows and events share it)

    def add_row(self, row: dict) -> None:
        self.seq += 1
        self.rows.append({**row, "seq": self.seq})
        self.rows_received += 1
        if len(self.rows) > self.max_rows:
            # Thin the older half: keep every other row there, all of the newer half.
            half = len(self.rows) // 2
            self.rows = self.rows[:half:2] + self.rows[half:]

    def add_event(self, event: dict) -> None:
        self.seq += 1
        self.events.append({**event, "seq": self.seq})

    def summary(self) -> dict:
        """The run without its rows and events: its info, status and latest row."""
        return {"run_id": self.run_id, "status": self.status, "started": self.started,
                "updated": self.updated, "info": dict(self.info),
                "rows": self.rows_received, "events": len(self.events),
                "last_row": dict(self.rows[-1]) if self.rows else None}

    def detail(self, since: int = 0) -> dict:
        """The summary plus the rows and events numbered after ``since``."""
        out = self.summary()
        out["seq"] = self.seq
        out["rows"] = [dict(r) for r in self.rows if r["seq"] > since]
        out["events"] = [dict(e) for e in self.events if e["seq"] > since]
        out["rows_received"] = self.rows_received
        return out


class RunStore:
    """Every run published to this head and not yet dropped, oldest first."""

    def __init__(self, max_runs: int = 32, max_rows: int = 2000, max_events: int = 500):
        self.max_runs = max_runs
        self.max_rows = max_rows
        self.max_events = max_events
        self.runs: collections.OrderedDict[str, RunRecord] = collections.OrderedDict()

    def publish(self, data: dict, owner: str | None) -> RunRecord:
        """Apply one publish: ``{"run_id", "info"?, "rows"?, "events"?, "status"?}``.

        Raises ``MessageError`` (and changes nothing) when any part is malformed.
        """
        data = check(data)
        run_id, info, rows, events = data["run_id"], data["info"], data["rows"], data["events"]
        status = data["status"]
        run = self.runs.get(run_id)
        if run is None:
            run = RunRecord(run_id, owner, self.max_rows, self.max_events)
            self.runs[run_id] = run
            self._evict()
        run.info.update(info)
        for r in rows:
            run.add_row(r)
        for e in events:
            run.add_event(e)
        if status is not None:
            run.status = status
        run.updated = time.time()
        return run

    def owner_gone(self, owner: str) -> None:
        """A driver disconnected: its runs that still ran will publish nothing more."""
        for run in self.runs.values():
            if run.owner == owner and run.status == "running":
                run.status = "driver_gone"
                run.updated = time.time()

    def get(self, run_id: str) -> RunRecord | None:
        return self.runs.get(run_id)

    def summaries(self) -> list[dict]:
        """Every run, newest first."""
        return [r.summary() for r in reversed(self.runs.values())]

    def _evict(self) -> None:
        while len(self.runs) > self.max_runs:
            victim = next((rid for rid, r in self.runs.items() if r.status != "running"),
                          next(iter(self.runs)))
            del self.runs[victim]


def check(data) -> dict:
    """``data`` as the head keeps it: ``{"run_id", "info", "rows", "events", "status"}``
    with plain JSON values (long strings cut, NaN and inf as None). ``MessageError``
    naming the part that is malformed. Drivers call it too, to fail before sending."""
    if not isinstance(data, dict):
        raise MessageError(f"publish_run takes a dict, got {type(data).__name__}")
    run_id = data.get("run_id")
    if not isinstance(run_id, str) or not 0 < len(run_id) <= _MAX_ID:
        raise MessageError(f"publish_run: run_id must be a str of 1 to {_MAX_ID} "
                           f"characters, got {run_id!r:.80}")
    unknown = set(data) - {"run_id", "info", "rows", "events", "status"}
    if unknown:
        raise MessageError(f"publish_run: unknown keys {sorted(unknown)!r:.200}")
    status = data.get("status")
    if status is not None and status not in RUN_STATUSES:
        raise MessageError(f"publish_run: status must be one of {RUN_STATUSES}, "
                           f"got {status!r:.80}")
    return {"run_id": run_id, "info": _clean_dict(data.get("info") or {}, "info"),
            "rows": [_clean_dict(r, "a row") for r in _batch(data.get("rows"), "rows")],
            "events": [_clean_dict(e, "an event") for e in _batch(data.get("events"), "events")],
            "status": status}


def _batch(value, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise MessageError(f"publish_run: {what} must be a list, got {type(value).__name__}")
    if len(value) > _MAX_BATCH:
        raise MessageError(f"publish_run: at most {_MAX_BATCH} {what} at a time, got {len(value)}")
    return list(value)


def _clean_dict(d, what: str) -> dict:
    """``d`` with str keys and JSON scalar values only; long strings cut, NaN/inf as None."""
    if not isinstance(d, dict):
        raise MessageError(f"publish_run: {what} must be a dict, got {type(d).__name__}")
    if len(d) > _MAX_KEYS:
        raise MessageError(f"publish_run: {what} has {len(d)} keys, at most {_MAX_KEYS}")
    out: dict[str, Any] = {}
    for k, v in d.items():
        if not isinstance(k, str) or not 0 < len(k) <= _MAX_KEY:
            raise MessageError(f"publish_run: {what} has a key that is not a str of 1 to "
                               f"{_MAX_KEY} characters: {k!r:.80}")
        if v is None or isinstance(v, bool):
            out[k] = v
        elif isinstance(v, int):
            out[k] = int(v)
        elif isinstance(v, float):
            out[k] = float(v) if math.isfinite(v) else None   # JSON has no NaN or inf
        elif isinstance(v, str):
            out[k] = v[:_MAX_STR]
        elif isinstance(v, (list, tuple)) and len(v) <= _MAX_LIST and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out[k] = [int(x) if isinstance(x, int) else float(x) if math.isfinite(x) else None
                      for x in v]
        else:
            raise MessageError(f"publish_run: {what}[{k!r}] must be a number, str, bool, a "
                               f"list of at most {_MAX_LIST} numbers, or "
                               f"None, got {type(v).__name__}")
    return out
