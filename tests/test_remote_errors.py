"""Remote exceptions and results that do not survive the trip still reach the caller."""

from __future__ import annotations

import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import SerializationError, TaskError


class TwoArgError(Exception):
    def __init__(self, a, b):
        super().__init__(a)  # pickles as TwoArgError(a): cannot be rebuilt with one arg
        self.b = b


def _deep(n=100_000):
    x = []
    for _ in range(n):
        x = [x]
    return x


@ddlf.remote
class Thrower:
    def raise_two_arg(self):
        raise TwoArgError("the message", "extra")

    def deep(self):
        return _deep()

    def ok(self):
        return "ok"


@ddlf.remote
def deep_task():
    return _deep()


def test_an_exception_that_cannot_be_rebuilt_keeps_type_message_and_traceback(cluster):
    t = Thrower.remote()
    with pytest.raises(TaskError) as info:
        ddlf.get(t.raise_two_arg.remote(), timeout=30)
    text = str(info.value)
    assert "TwoArgError" in text and "the message" in text
    assert "raise_two_arg" in text            # the remote traceback
    assert info.value.cause_type_name == "TwoArgError"
    assert not isinstance(info.value, TypeError)  # not the driver's unpickling error


def test_a_value_too_deep_to_pickle_is_an_error_and_the_actor_lives_on(cluster):
    t = Thrower.remote()
    with pytest.raises(SerializationError):
        ddlf.get(t.deep.remote(), timeout=30)
    assert ddlf.get(t.ok.remote(), timeout=5) == "ok"   # alive, and not stalled


def test_a_task_returning_a_value_too_deep_to_pickle(cluster):
    with pytest.raises(SerializationError):
        ddlf.get(deep_task.remote(), timeout=30)


@ddlf.remote
def exits():
    import sys

    sys.exit(3)


def test_a_remote_sys_exit_is_a_plain_task_error(cluster):
    with pytest.raises(TaskError) as info:
        ddlf.get(exits.remote(), timeout=30)
    assert not isinstance(info.value, SystemExit)  # would end the driver, status 0
    assert isinstance(info.value, Exception)
    assert "SystemExit" in str(info.value)
