"""ddlf_actors/options.py: what @ddlf.remote and .options() accept, with no cluster."""

from __future__ import annotations

import pytest

from ddlf_actors.options import ACTOR_OPTIONS, METHOD_OPTIONS, TASK_OPTIONS, validate


def test_the_option_tables():
    # Subsets: the tables grow with each Ray option DDLF learns.
    assert {"max_restarts", "max_concurrency", "lifetime", "node_id", "get_if_exists",
            "max_task_retries", "num_cpus", "resources", "name"} <= ACTOR_OPTIONS
    assert {"max_retries", "num_returns", "num_cpus", "resources", "name"} <= TASK_OPTIONS
    assert {"num_returns"} <= METHOD_OPTIONS


def test_valid_options_come_back_unchanged():
    opts = {"num_cpus": 0.5, "resources": {"GPU": 1}, "max_restarts": -1, "name": "x",
            "max_concurrency": 4, "lifetime": "detached", "get_if_exists": True,
            "max_task_retries": 2, "node_id": "abc"}
    assert validate(opts, ACTOR_OPTIONS, "actor A") is opts
    assert validate({"num_returns": 3, "max_retries": 0}, TASK_OPTIONS, "task f")
    assert validate({}, METHOD_OPTIONS, "method m") == {}


def test_unknown_options_are_named_with_the_valid_ones():
    with pytest.raises(ValueError) as e:
        validate({"nun_cpus": 1, "max_retires": 2}, TASK_OPTIONS, "task f")
    msg = str(e.value)
    assert "['max_retires', 'nun_cpus']" in msg and "for task f" in msg and "'max_retries'" in msg
    with pytest.raises(ValueError, match="unknown option"):
        validate({"max_restarts": 1}, TASK_OPTIONS, "task f")   # an actor option on a task


@pytest.mark.parametrize("opts, match", [
    ({"num_cpus": -1}, "num_cpus must be a number >= 0"),
    ({"num_cpus": "2"}, "num_cpus must be a number >= 0"),
    ({"resources": {"GPU": -1}}, "resources must be a dict"),
    ({"resources": [("GPU", 1)]}, "resources must be a dict"),
    ({"resources": {1: 1}}, "resources must be a dict"),
    ({"resources": {"CPU": 2}}, "num_cpus=..., not resources"),
    ({"max_restarts": -2}, "max_restarts must be an int >= 0"),
    ({"max_restarts": 1.5}, "max_restarts must be an int >= 0"),
    ({"max_task_retries": "3"}, "max_task_retries must be an int"),
    ({"max_concurrency": 0}, "max_concurrency must be an int >= 1"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"name": 3}, "name must be a non-empty string"),
    ({"get_if_exists": 1}, "get_if_exists must be True or False"),
    ({"lifetime": "forever"}, "lifetime must be None or 'detached'"),
])
def test_bad_actor_options_say_what_is_wrong(opts, match):
    with pytest.raises(ValueError, match=match):
        validate(opts, ACTOR_OPTIONS, "actor A")


@pytest.mark.parametrize("nr", [0, -1, True, 1.0, "2"])
def test_bad_num_returns(nr):
    with pytest.raises(ValueError, match="num_returns must be an int >= 1"):
        validate({"num_returns": nr}, TASK_OPTIONS, "task f")


@pytest.mark.parametrize("nr", ["dynamic", "streaming"])
def test_generator_num_returns_are_accepted(nr):
    assert validate({"num_returns": nr}, METHOD_OPTIONS, "method m") == {"num_returns": nr}


def test_a_bad_num_returns_string_is_named():
    with pytest.raises(ValueError, match="num_returns"):
        validate({"num_returns": "lots"}, METHOD_OPTIONS, "method m")


def test_none_means_default():
    opts = {k: None for k in ACTOR_OPTIONS}
    assert validate(opts, ACTOR_OPTIONS, "actor A") is opts
