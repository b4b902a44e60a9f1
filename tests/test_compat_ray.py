"""ddlf_actors.compat.ray: Ray's names over DDLF, missing names, and the script runner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import ddlf_actors as ddlf
import ddlf_actors.compat.ray as ray
from ddlf_actors.compat.ray import _finder
from ddlf_actors.compat.ray._missing import NotProvidedError, NotProvidedModuleError
from ddlf_actors.errors import ActorDiedError, DDLFError, GetTimeoutError, TaskError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_core_names_are_ddlfs():
    assert ray.ObjectRef is ddlf.ObjectRef
    assert ray.util.ActorPool is ddlf.util.ActorPool
    assert ray.util.queue.Queue is ddlf.util.queue.Queue
    assert ray.util.queue.Empty is ddlf.util.queue.Empty


def test_exceptions_catch_ddlfs_errors():
    ex = ray.exceptions
    assert issubclass(ActorDiedError, ex.RayActorError) and ex.ActorDiedError is ActorDiedError
    assert issubclass(ex.ActorUnavailableError, ex.RayActorError)
    assert ex.RayTaskError is TaskError and ex.RayError is DDLFError
    assert issubclass(ex.GetTimeoutError, TimeoutError) and ex.GetTimeoutError is GetTimeoutError
    assert issubclass(ex.OwnerDiedError, ex.ObjectLostError)
    assert issubclass(ex.ObjectLostError, ex.RayError)
    for name in ("TaskCancelledError", "WorkerCrashedError", "RaySystemError",
                 "ActorAlreadyExistsError", "TaskUnschedulableError"):
        assert issubclass(getattr(ex, name), ex.RayError), name


@pytest.mark.parametrize("name,why", [("java_function", "Python only"), ("data", "Ray library"),
                                      ("timeline", "timeline")])
def test_missing_top_level_names_say_so(name, why):
    with pytest.raises(NotProvidedError, match=f"ray.{name} is not provided by DDLF.*{why}"):
        getattr(ray, name)
    assert not hasattr(ray, name)   # also an AttributeError


def test_from_import_of_a_missing_name_keeps_the_reason():
    # Without care Python reports only "cannot import name", dropping why.
    with pytest.raises(ImportError, match="ray.timeline is not provided.*timeline"):
        from ddlf_actors.compat.ray import timeline  # noqa: F401
    with pytest.raises(ImportError, match="ray.util.collective is not provided"):
        from ddlf_actors.compat.ray.util import collective  # noqa: F401


def test_missing_util_names_say_so():
    with pytest.raises(NotProvidedError, match="ray.util.state .*state API"):
        ray.util.state  # noqa: B018


def test_unsupported_options_are_refused_by_name():
    assert ray.remote(num_returns="dynamic")(lambda: 1)._options == {"num_returns": "dynamic"}
    assert ray.remote(num_returns=2)(lambda: (1, 2))._options == {"num_returns": 2}
    with pytest.raises(NotImplementedError, match="runtime_env"):
        ray.remote(runtime_env={"pip": ["x"]})(lambda: 1)
    with pytest.raises(NotImplementedError, match="concurrency groups"):
        ray.remote(concurrency_groups={"io": 2})(type("A", (), {}))
    with pytest.raises(ValueError, match="placement_group must be a PlacementGroup"):
        ray.remote(placement_group=object())(type("A", (), {}))
    with pytest.raises(ValueError, match="unknown Ray option 'bogus'"):
        ray.remote(bogus=1)(lambda: 1)
    f = ray.remote(num_gpus=1, memory=10)(lambda: 1)
    assert f._options == {"num_gpus": 1, "memory": 10}


@pytest.fixture
def ray_alias():
    """Route `import ray` to the compat layer for one test, then restore the real one."""
    saved = {n: m for n, m in sys.modules.items() if n == "ray" or n.startswith("ray.")}
    for n in saved:
        del sys.modules[n]
    _finder.install()
    try:
        yield
    finally:
        _finder.uninstall()
        sys.modules.update(saved)


def test_import_hook_maps_ray_modules(ray_alias):
    import ray as r
    import ray.exceptions
    import ray.util.queue
    from ray.util import ActorPool

    assert r is sys.modules["ddlf_actors.compat.ray"]
    assert ray.exceptions.RayActorError is ActorDiedError
    assert ActorPool is ddlf.util.ActorPool
    assert ray.util.queue.Queue is ddlf.util.queue.Queue
    with pytest.raises(NotProvidedModuleError, match="ray.serve is not provided"):
        import ray.serve  # noqa: F401
    with pytest.raises(ImportError, match="ray.util.state is not provided"):
        from ray.util.state import list_actors  # noqa: F401


SCRIPT = textwrap.dedent("""
    import os
    import sys
    import time

    import ray
    from ray.exceptions import RayActorError, RayTaskError
    from ray.util import ActorPool

    assert ray.__name__ == "ddlf_actors.compat.ray", ray.__name__
    ray.init(num_cpus=2)

    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    def where():
        # Runs in a worker: `ray` there must be DDLF's layer too, not the real Ray.
        import ray as inner
        return ray.__name__, inner.__name__, ray.get(ray.put(5))

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0
        def add(self, v):
            self.n += v
            return self.n
        def fail(self):
            raise KeyError("boom")

    print("squares", ray.get([square.remote(i) for i in range(4)]))
    print("where", ray.get(where.remote(), timeout=60))
    pool = ActorPool([Counter.remote(), Counter.remote()])
    print("pool", list(pool.map(lambda a, v: a.add.remote(v), [1, 10])))
    c = Counter.remote()
    try:
        ray.get(c.fail.remote())
    except RayTaskError as e:
        print("task error", isinstance(e, KeyError))
    ray.kill(c)
    try:
        ray.get(c.add.remote(1), timeout=30)
    except RayActorError:
        print("actor died")
    print("argv", sys.argv[1:])
    ray.shutdown()
    sys.exit(int(sys.argv[1]))
""")


def test_runner_runs_a_ray_script_on_ddlf(tmp_path, no_leaks):
    script = tmp_path / "ray_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get(
        "PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    env.pop("DDLF_RAY_COMPAT", None)
    proc = subprocess.run([sys.executable, "-m", "ddlf_actors.compat.ray", str(script), "7"],
                          capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(tmp_path))
    out = proc.stdout
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert "squares [0, 1, 4, 9]" in out
    assert "where ('ddlf_actors.compat.ray', 'ddlf_actors.compat.ray', 5)" in out
    assert "pool [1, 10]" in out
    assert "task error True" in out
    assert "actor died" in out
    assert "argv ['7']" in out


def test_runner_reports_a_missing_script():
    proc = subprocess.run([sys.executable, "-m", "ddlf_actors.compat.ray", "/nonexistent.py"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 2 and "no such script" in proc.stderr
