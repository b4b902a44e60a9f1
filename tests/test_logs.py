"""Worker stdout and stderr reach the driver, each line prefixed with the actor or task name and pid."""

from __future__ import annotations

import os
import sys
import time

import ddlf_actors as ddlf


@ddlf.remote
class Talker:
    def say(self, text):
        print(text)
        print(f"err-{text}", file=sys.stderr)
        return os.getpid()


@ddlf.remote
def shout(text):
    print(text)
    return os.getpid()


def _collect(capfd, needles, timeout=10.0):
    out = err = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        o, e = capfd.readouterr()
        out, err = out + o, err + e
        if all(n in out + err for n in needles):
            break
        time.sleep(0.1)
    return out, err


def _line_with(text, needle):
    return next((ln for ln in text.splitlines() if needle in ln), None)


def test_actor_stdout_and_stderr_are_prefixed(cluster, capfd):
    pid = ddlf.get(Talker.remote().say.remote("hello-logs"), timeout=20)
    out, err = _collect(capfd, ["hello-logs", "err-hello-logs"])
    line = _line_with(out, "hello-logs")
    assert line is not None, out
    assert line.startswith(f"(Talker pid={pid}") and line.endswith("hello-logs"), line
    eline = _line_with(err, "err-hello-logs")
    assert eline is not None and eline.startswith(f"(Talker pid={pid}"), err


def test_task_output_is_prefixed_with_function_name(cluster, capfd):
    pid = ddlf.get(shout.remote("task-says-hi"), timeout=20)
    out, _ = _collect(capfd, ["task-says-hi"])
    line = _line_with(out, "task-says-hi")
    assert line is not None, out
    assert line.startswith(f"(shout pid={pid}"), line
