"""``retry_exceptions``: a task whose code raised runs again, within ``max_retries``, as in Ray."""

from __future__ import annotations

import os
import time
import warnings

import pytest
from helpers_modules.clusters import start_cluster
from helpers_modules.util import wait_for

import ddlf_actors as ddlf
from ddlf_actors.errors import TaskCancelledError


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(num_cpus=2) as info:
        yield info


class Flaky(Exception):
    pass


def _fail_times(path, failures, exc=Flaky):
    """Raise ``exc`` on the first ``failures`` attempts (counted in a file), then succeed."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    attempts = open(path).read().count("\n")
    if attempts <= failures:
        raise exc(f"attempt {attempts}")
    return attempts


fail_times = ddlf.remote(_fail_times)
flaky_by_default = ddlf.remote(retry_exceptions=[Flaky], max_retries=1)(_fail_times)


@ddlf.remote(retry_exceptions=True, max_retries=3)
def slow(path):
    with open(path, "a") as f:
        f.write("x\n")
    for _ in range(1000):
        time.sleep(0.02)


def _attempts(path) -> int:
    return open(path).read().count("\n")


def test_a_raising_task_is_retried_until_it_succeeds(cluster, tmp_path):
    path = str(tmp_path / "n")
    ref = fail_times.options(retry_exceptions=True, max_retries=2).remote(path, 2)
    assert ddlf.get(ref, timeout=30) == 3


def test_retries_count_against_max_retries(cluster, tmp_path):
    path = str(tmp_path / "n")
    ref = fail_times.options(retry_exceptions=True, max_retries=1).remote(path, 5)
    with pytest.raises(Flaky, match="attempt 2"):
        ddlf.get(ref, timeout=30)
    assert _attempts(path) == 2


def test_only_listed_exceptions_are_retried(cluster, tmp_path):
    listed, other = str(tmp_path / "a"), str(tmp_path / "b")
    opts = dict(retry_exceptions=[Flaky, KeyError], max_retries=3)
    assert ddlf.get(fail_times.options(**opts).remote(listed, 1), timeout=30) == 2
    with pytest.raises(ValueError, match="attempt 1"):
        ddlf.get(fail_times.options(**opts).remote(other, 1, ValueError), timeout=30)
    assert _attempts(other) == 1


def test_without_retry_exceptions_an_error_is_final(cluster, tmp_path):
    path = str(tmp_path / "n")
    with pytest.raises(Flaky):
        ddlf.get(fail_times.options(max_retries=3).remote(path, 1), timeout=30)
    assert _attempts(path) == 1


def test_unlimited_retries(cluster, tmp_path):
    path = str(tmp_path / "n")
    ref = fail_times.options(retry_exceptions=True, max_retries=-1).remote(path, 4)
    assert ddlf.get(ref, timeout=30) == 5


def test_options_given_to_the_decorator_apply(cluster, tmp_path):
    assert ddlf.get(flaky_by_default.remote(str(tmp_path / "a"), 1), timeout=30) == 2
    with pytest.raises(Flaky):
        ddlf.get(flaky_by_default.remote(str(tmp_path / "b"), 2), timeout=30)


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="retry_exceptions must be"):
        fail_times.options(retry_exceptions="yes")
    with pytest.raises(ValueError, match="retry_exceptions must be"):
        fail_times.options(retry_exceptions=[ValueError, 3])


def test_rays_option_is_no_longer_ignored(cluster, tmp_path):
    import ddlf_actors.compat.ray as ray

    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the old layer warned and dropped it
        f = ray.remote(retry_exceptions=True, max_retries=2)(fail_times._fn)
    assert f._options["retry_exceptions"] is True
    assert ray.get(f.remote(str(tmp_path / "n"), 2), timeout=30) == 3


def test_a_cancelled_task_is_not_retried(cluster, tmp_path):
    started = tmp_path / "started"
    ref = slow.remote(str(started))
    assert wait_for(started.exists, 15)
    ddlf.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ddlf.get(ref, timeout=30)
    assert ddlf.get(fail_times.remote(str(tmp_path / "flush"), 0), timeout=30) == 1
    assert started.read_text().count("\n") == 1
