"""runtime/config.py: every tunable has a default and a DDLF_* environment override."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddlf_actors.runtime import config

TUNABLES = {
    # name: (environment variable, an override, its parsed value)
    "TASK_PIPELINE_DEPTH": ("DDLF_TASK_PIPELINE_DEPTH", "3", 3),
    "LEASE_IDLE_S": ("DDLF_LEASE_IDLE_S", "2.5", 2.5),
    "ACTOR_CONNECT_TRIES": ("DDLF_ACTOR_CONNECT_TRIES", "7", 7),
    "WAIT_ACTOR_MAX_S": ("DDLF_WAIT_ACTOR_MAX_S", "4", 4.0),
    "PRESTART_WORKERS": ("DDLF_PRESTART_WORKERS", "0", 0),
    "LOG_BATCH_S": ("DDLF_LOG_BATCH_S", "0.2", 0.2),
    "LOG_POLL_S": ("DDLF_LOG_POLL_S", "0.1", 0.1),
    "LOG_POLL_MAX_S": ("DDLF_LOG_POLL_MAX_S", "1", 1.0),
    "REJOIN_REFUSED_TRIES": ("DDLF_REJOIN_REFUSED_TRIES", "9", 9),
    "START_TIMEOUT_S": ("DDLF_START_TIMEOUT_S", "120", 120.0),
}


def _config_in_child(env: dict) -> dict:
    code = ("import json; from ddlf_actors.runtime import config; "
            f"print(json.dumps({{n: getattr(config, n) for n in {list(TUNABLES)!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_tunables_are_public_with_their_defaults():
    for name in TUNABLES:
        assert name in config.__all__
    assert (config.TASK_PIPELINE_DEPTH, config.LEASE_IDLE_S, config.PRESTART_WORKERS) == (16, 0.5, 2)


def test_each_tunable_reads_its_environment_variable():
    env = {var: raw for var, raw, _ in TUNABLES.values()}
    got = _config_in_child(env)
    assert got == {name: value for name, (_, _, value) in TUNABLES.items()}


def test_a_bad_integer_names_its_variable():
    with pytest.raises(AssertionError, match="DDLF_TASK_PIPELINE_DEPTH='many' is not an integer"):
        _config_in_child({"DDLF_TASK_PIPELINE_DEPTH": "many"})


@pytest.mark.parametrize("module", ["client.core", "head", "node", "process"])
def test_runtime_modules_keep_no_private_copies(module):
    """The constants these modules used to define for themselves now live in config."""
    import importlib

    mod = importlib.import_module(f"ddlf_actors.runtime.{module}")
    old = {"_TASK_DEPTH", "_LEASE_IDLE_S", "_RECONNECT_TRIES", "_WAIT_ACTOR_MAX_S", "_PRESTART",
           "_LOG_POLL_S", "_LOG_POLL_MAX_S", "_REJOIN_REFUSED_TRIES", "_START_TIMEOUT_S"}
    assert not old & set(vars(mod))
