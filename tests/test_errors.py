"""Errors: remote exceptions, failed __init__, unpicklable args, missing modules, no room."""

from __future__ import annotations

import importlib
import sys
import threading
import time
import uuid

import pytest

import ddlf_actors as ddlf
from ddlf_actors.errors import (
    ActorDiedError,
    DDLFError,
    SerializationError,
    TaskError,
    UnschedulableError,
)


class QuotaExceeded(Exception):
    """A user-defined exception class, importable on workers."""


class RichError(RuntimeError):
    def __init__(self, message, code):
        super().__init__(message, code)
        self.code = code


@ddlf.remote
class Faulty:
    def __init__(self):
        self.calls = 0

    def raise_value_error(self, x):
        self.calls += 1
        raise ValueError(f"bad value {x}")

    def raise_custom(self):
        raise QuotaExceeded("quota exceeded for user-42")

    def raise_rich(self):
        raise RichError("rich failure", 17)

    def count(self):
        return self.calls

    def echo(self, x):
        return x

    def return_lock(self):
        return threading.Lock()


@ddlf.remote
class BrokenInit:
    def __init__(self, tag):
        raise RuntimeError(f"init exploded with tag {tag}")

    def ping(self):
        return "pong"


@ddlf.remote
def failing_task(x):
    raise ValueError(f"task failed on {x}")


@ddlf.remote
def custom_failing_task():
    raise QuotaExceeded("task quota gone")


@ddlf.remote
def identity(x):
    return x


# -- remote exceptions ----------------------------------------------------------------------------------

def test_actor_method_exception_is_task_error_and_user_class(cluster):
    f = Faulty.remote()
    ref = f.raise_value_error.remote(13)
    with pytest.raises(ValueError) as info:
        ddlf.get(ref, timeout=20)
    err = info.value
    assert isinstance(err, TaskError)
    assert isinstance(err, DDLFError)
    assert "bad value 13" in str(err)
    # The remote traceback names the method and shows the raising line.
    for text in (str(err), err.remote_traceback):
        assert "raise_value_error" in text
        assert 'raise ValueError(f"bad value {x}")' in text
    # except ValueError works in ordinary code, and the actor survives the error.
    try:
        ddlf.get(ref, timeout=20)
    except ValueError:
        pass
    else:
        pytest.fail("ValueError not raised")
    assert ddlf.get(f.count.remote(), timeout=20) == 1


def test_task_exception_is_task_error_and_user_class(cluster):
    with pytest.raises(ValueError) as info:
        ddlf.get(failing_task.remote("input-5"), timeout=20)
    err = info.value
    assert isinstance(err, TaskError)
    assert "task failed on input-5" in str(err)
    for text in (str(err), err.remote_traceback):
        assert "failing_task" in text
        assert 'raise ValueError(f"task failed on {x}")' in text


def test_user_defined_exception_class(cluster):
    f = Faulty.remote()
    with pytest.raises(QuotaExceeded, match="user-42") as info:
        ddlf.get(f.raise_custom.remote(), timeout=20)
    assert isinstance(info.value, TaskError)
    assert "raise_custom" in info.value.remote_traceback
    with pytest.raises(QuotaExceeded, match="task quota gone") as info:
        ddlf.get(custom_failing_task.remote(), timeout=20)
    assert isinstance(info.value, TaskError)
    assert "custom_failing_task" in info.value.remote_traceback


def test_user_exception_keeps_attributes(cluster):
    f = Faulty.remote()
    with pytest.raises(RichError) as info:
        ddlf.get(f.raise_rich.remote(), timeout=20)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, TaskError)
    assert info.value.code == 17
    assert info.value.args == ("rich failure", 17)


def test_exception_class_defined_inside_test(cluster):
    class LocalProblem(Exception):
        pass

    @ddlf.remote
    def raises_local():
        raise LocalProblem("local problem text")

    with pytest.raises(LocalProblem, match="local problem text") as info:
        ddlf.get(raises_local.remote(), timeout=20)
    assert isinstance(info.value, TaskError)
    assert "raises_local" in info.value.remote_traceback


def test_error_does_not_match_unrelated_class(cluster):
    with pytest.raises(TaskError) as info:
        ddlf.get(failing_task.remote(1), timeout=20)
    assert not isinstance(info.value, KeyError)
    assert not isinstance(info.value, QuotaExceeded)


def test_error_in_one_of_many_refs(cluster):
    refs = [identity.remote(1), failing_task.remote(2), identity.remote(3)]
    with pytest.raises(ValueError, match="task failed on 2"):
        ddlf.get(refs, timeout=20)
    assert ddlf.get([refs[0], refs[2]], timeout=20) == [1, 3]


# -- failed __init__ -------------------------------------------------------------------------------------

def test_exception_in_init_makes_calls_raise_actor_died(cluster):
    b = BrokenInit.remote("tag-314")
    with pytest.raises(ActorDiedError) as info:
        ddlf.get(b.ping.remote(), timeout=20)
    msg = str(info.value)
    assert "init exploded with tag tag-314" in msg
    assert "RuntimeError" in msg
    assert isinstance(info.value.cause, RuntimeError)
    # Every later call fails the same way (and fast).
    t0 = time.monotonic()
    for _ in range(3):
        with pytest.raises(ActorDiedError, match="tag-314"):
            ddlf.get(b.ping.remote(), timeout=20)
    assert time.monotonic() - t0 < 5


def test_init_error_of_locally_defined_class(cluster):
    @ddlf.remote
    class LocalBroken:
        def __init__(self):
            {}["missing-key-xyz"]

        def ping(self):
            return 1

    with pytest.raises(ActorDiedError, match="missing-key-xyz"):
        ddlf.get(LocalBroken.remote().ping.remote(), timeout=20)


# -- unpicklable arguments ------------------------------------------------------------------------------

def test_unpicklable_task_argument_fails_at_remote(cluster):
    lock = threading.Lock()
    with pytest.raises(SerializationError) as info:
        identity.remote(lock)
    assert isinstance(info.value, TypeError)
    assert "lock" in str(info.value).lower()


def test_unpicklable_actor_argument_fails_at_remote(cluster):
    f = Faulty.remote()
    with pytest.raises(SerializationError) as info:
        f.echo.remote({"fine": 1, "guard": threading.Lock()})
    assert isinstance(info.value, TypeError)
    msg = str(info.value)
    assert "lock" in msg.lower()
    assert "guard" in msg  # names where in the argument it sits
    with pytest.raises(TypeError, match="(?i)lock"):
        f.echo.remote(x=threading.Lock())
    # Nothing was sent: the actor is fine.
    assert ddlf.get(f.echo.remote("ok"), timeout=20) == "ok"


def test_unpicklable_constructor_argument_fails_at_remote(cluster):
    with pytest.raises(SerializationError, match="(?i)lock"):
        Faulty.remote(threading.Lock())


def test_unpicklable_put_fails(cluster):
    with pytest.raises(SerializationError, match="(?i)lock"):
        ddlf.put([1, threading.Lock()])


def test_unpicklable_return_value_fails_at_get(cluster):
    f = Faulty.remote()
    with pytest.raises(SerializationError, match="(?i)lock"):
        ddlf.get(f.return_lock.remote(), timeout=20)
    assert ddlf.get(f.echo.remote(2), timeout=20) == 2


# -- code that workers cannot import -------------------------------------------------------------------

_VANISHING_SOURCE = '''
import ddlf_actors as ddlf


def helper(x):
    return x + 1


class Thing:
    def __init__(self):
        self.n = 0

    def ping(self):
        return "pong"
'''


@pytest.fixture
def vanishing_module(tmp_path):
    """Import a module from tmp_path, then make it unimportable anywhere else."""
    name = f"ddlf_vanishing_{uuid.uuid4().hex[:10]}"
    path = tmp_path / f"{name}.py"
    path.write_text(_VANISHING_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
    path.unlink()
    importlib.invalidate_caches()
    try:
        yield mod
    finally:
        sys.modules.pop(name, None)


def test_task_from_unimportable_module_names_module(cluster, vanishing_module):
    fn = ddlf.remote(vanishing_module.helper)
    assert vanishing_module.helper(1) == 2  # it works here, in the driver
    with pytest.raises(DDLFError) as info:
        ddlf.get(fn.remote(1), timeout=30)
    msg = str(info.value)
    assert vanishing_module.__name__ in msg
    assert "register_pickle_by_value" in msg


def test_actor_from_unimportable_module_names_module(cluster, vanishing_module):
    cls = ddlf.remote(vanishing_module.Thing)
    with pytest.raises(DDLFError) as info:
        h = cls.remote()
        ddlf.get(h.ping.remote(), timeout=30)
    msg = str(info.value)
    assert vanishing_module.__name__ in msg
    assert "register_pickle_by_value" in msg


def test_register_pickle_by_value_fixes_unimportable_module(cluster, vanishing_module):
    import cloudpickle

    cloudpickle.register_pickle_by_value(vanishing_module)
    try:
        fn = ddlf.remote(vanishing_module.helper)
        assert ddlf.get(fn.remote(41), timeout=30) == 42
        h = ddlf.remote(vanishing_module.Thing).remote()
        assert ddlf.get(h.ping.remote(), timeout=30) == "pong"
    finally:
        cloudpickle.unregister_pickle_by_value(vanishing_module)


# -- resources nobody has ------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [{"num_cpus": 64}, {"resources": {"GPU": 1}}])
def test_unplaceable_actor_raises_unschedulable_fast(cluster, options):
    t0 = time.monotonic()
    with pytest.raises(UnschedulableError):
        h = Faulty.options(**options).remote()
        ddlf.get(h.count.remote(), timeout=10)
    assert time.monotonic() - t0 < 3
    # The cluster still works.
    assert ddlf.get(Faulty.remote().count.remote(), timeout=20) == 0


@pytest.mark.parametrize("options", [{"num_cpus": 64}, {"resources": {"GPU": 1}}])
def test_unplaceable_task_raises_unschedulable_fast(cluster, options):
    t0 = time.monotonic()
    with pytest.raises(UnschedulableError):
        ddlf.get(identity.options(**options).remote(1), timeout=10)
    assert time.monotonic() - t0 < 3
    assert ddlf.get(identity.remote(1), timeout=20) == 1


def test_unplaceable_in_decorator(cluster):
    @ddlf.remote(num_cpus=3)
    class TooBig:
        def ping(self):
            return 1

    with pytest.raises(UnschedulableError):
        ddlf.get(TooBig.remote().ping.remote(), timeout=10)
