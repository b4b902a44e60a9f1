"""runtime_env: env_vars, working_dir and py_modules for the job, tasks and actors."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import textwrap
import zipfile

import pytest
from cluster_utils import MultiNodeCluster, joined
from helpers_modules.clusters import no_leaked_processes, start_cluster

import ddlf_actors as ddlf
from ddlf_actors.runtime import runtime_env as renv


def _write(path, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


@pytest.fixture
def project(tmp_path):
    """A working_dir with a module, a data file and things that must not be shipped."""
    wd = tmp_path / "project"
    # Read at import time: it must see the env's variables, set before user code.
    _write(str(wd / "renv_wd_mod.py"), """
        import os
        SEEN_AT_IMPORT = os.environ.get("RENV_FLAG")
        VALUE = "from-working-dir"
        """)
    _write(str(wd / "data.txt"), "payload\n")
    _write(str(wd / ".git" / "HEAD"), "ref: refs/heads/main\n")
    _write(str(wd / "__pycache__" / "x.pyc"), "junk")
    _write(str(wd / "big.bin"), "x" * 1000)
    mods = tmp_path / "mods"
    _write(str(mods / "renv_pkg" / "__init__.py"), "ANSWER = 42\n")
    _write(str(mods / "renv_single.py"), "NAME = 'single'\n")
    return wd, mods


# -- checked at the call, no cluster needed ------------------------------------------------------

@pytest.mark.parametrize("field", ["pip", "conda", "container", "uv", "image_uri"])
def test_unsupported_fields_are_refused_by_name(field):
    with pytest.raises(NotImplementedError, match=f"'{field}'"):
        ddlf.remote(runtime_env={field: ["x"]})(lambda: 1)


def test_unknown_field_and_bad_values_fail_at_the_call(tmp_path):
    @ddlf.remote
    def f():
        return 1

    with pytest.raises(ValueError, match="unknown runtime_env field 'bogus'"):
        f.options(runtime_env={"bogus": 1})
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="does not exist"):
        f.options(runtime_env={"working_dir": str(missing)})
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        f.options(runtime_env={"working_dir": str(tmp_path / "file.txt")})
    with pytest.raises(ValueError, match="py_modules.*does not exist"):
        f.options(runtime_env={"py_modules": [str(missing)]})
    with pytest.raises(TypeError, match="str -> str"):
        f.options(runtime_env={"env_vars": {"A": 1}})
    with pytest.raises(NotImplementedError, match="remote URIs"):
        f.options(runtime_env={"working_dir": "s3://bucket/x.zip"})
    with pytest.raises(ValueError, match="does not exist"):
        ddlf.init(runtime_env={"working_dir": str(missing)})
    assert not ddlf.is_initialized()   # a bad path starts nothing


def test_paths_become_absolute_and_modules_become_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wd").mkdir()
    spec = renv.validate({"working_dir": "wd", "py_modules": [renv, str(tmp_path / "wd")]})
    assert spec["working_dir"] == str(tmp_path / "wd")
    assert spec["py_modules"] == [renv.__file__, str(tmp_path / "wd")]


def test_merge_follows_ray():
    parent = {"env_vars": {"A": "p", "B": "p"}, "working_dir": "pkg-p", "py_modules": ["pkg-m"]}
    child = {"env_vars": {"B": "c", "C": "c"}, "working_dir": "pkg-c"}
    merged = renv.merge(parent, child)
    # env_vars merge key by key (the child's win); other fields are replaced, or kept.
    assert merged["env_vars"] == {"A": "p", "B": "c", "C": "c"}
    assert merged["working_dir"] == "pkg-c"
    assert merged["py_modules"] == ["pkg-m"]
    assert merged["key"] == renv.env_key(merged) != renv.env_key(parent)
    assert renv.merge(parent, None) is parent and renv.merge(None, child) is child


def test_a_call_env_with_nothing_in_it_runs_in_its_parents():
    """An env that validates to nothing ({"env_vars": {}}) is no env of its own: the call
    runs in its parent's (it used to reach packed(None) and raise AttributeError)."""
    class FakeCore:
        runtime_env = {"env_vars": {"A": "job"}, "key": "k"}

    core = FakeCore()
    assert renv.for_call(core, {"env_vars": {}}) is core.runtime_env
    assert renv.for_call(core, None) is core.runtime_env


def test_pack_is_by_content_and_skips_excluded(project):
    wd, _ = project
    pkg_id, data = renv.pack(str(wd), ("*.bin",))
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert sorted(names) == ["data.txt", "renv_wd_mod.py"]
    os.utime(wd / "data.txt", (1, 1))   # a new mtime, the same content: the same package
    renv._pack_cache.clear()
    assert renv.pack(str(wd), ("*.bin",))[0] == pkg_id
    (wd / "data.txt").write_text("changed\n")
    assert renv.pack(str(wd), ("*.bin",))[0] != pkg_id


def test_py_module_keeps_its_name(project):
    _, mods = project
    _, data = renv.pack(str(mods / "renv_pkg"), (), "py_modules")
    assert zipfile.ZipFile(io.BytesIO(data)).namelist() == ["renv_pkg/__init__.py"]
    _, data = renv.pack(str(mods / "renv_single.py"), (), "py_modules")
    assert zipfile.ZipFile(io.BytesIO(data)).namelist() == ["renv_single.py"]


def test_size_cap_is_a_clear_error(project, monkeypatch):
    wd, _ = project
    monkeypatch.setattr(renv, "MAX_PACKAGE_BYTES", 500)
    with pytest.raises(ValueError, match=r"more than the 0 MiB.*big.bin.*excludes"):
        renv.pack(str(wd))
    renv.pack(str(wd), ("big.bin",))   # leaving it out fits


def test_node_cache_fetches_once_checks_the_hash_and_unpacks(project, tmp_path):
    wd, _ = project
    pkg_id, data = renv.pack(str(wd), ("*.bin",))
    calls = []

    async def fetch(asked):
        calls.append(asked)
        await asyncio.sleep(0.01)
        return data

    cache = renv.PackageCache(str(tmp_path / "cache"), fetch)

    async def main():
        return await asyncio.gather(*(cache.ensure(pkg_id) for _ in range(3)))

    paths = asyncio.run(main())
    assert calls == [pkg_id] and len(set(paths)) == 1
    assert open(os.path.join(paths[0], "data.txt")).read() == "payload\n"
    asyncio.run(cache.ensure(pkg_id))
    assert calls == [pkg_id]   # unpacked already: not fetched again

    async def tampered(asked):
        return data + b"x"

    with pytest.raises(ValueError, match="do not match its hash"):
        asyncio.run(renv.PackageCache(str(tmp_path / "c2"), tampered).ensure(pkg_id))


# -- on a cluster --------------------------------------------------------------------------------

@ddlf.remote
def look(names=("RENV_FLAG", "RENV_JOB", "RENV_SHARED")):
    import os
    import sys

    return {"env": {n: os.environ.get(n) for n in names}, "pid": os.getpid(),
            "cwd": os.getcwd(), "path0": sys.path[0]}


@ddlf.remote
def nested_look():
    return ddlf.get(look.remote(), timeout=30)


@ddlf.remote
def import_things():
    import os

    import renv_pkg
    import renv_single
    import renv_wd_mod

    return {"seen_at_import": renv_wd_mod.SEEN_AT_IMPORT, "value": renv_wd_mod.VALUE,
            "mod_file": renv_wd_mod.__file__, "answer": renv_pkg.ANSWER,
            "single": renv_single.NAME, "data": open("data.txt").read(), "cwd": os.getcwd(),
            "has_git": os.path.exists(".git")}


@ddlf.remote
class EnvActor:
    def __init__(self):
        import os

        # __init__ is user code: the variables are there already.
        self.at_init = os.environ.get("RENV_FLAG")

    def env(self):
        import os

        assert os.environ.get("RENV_FLAG") == self.at_init
        return {n: os.environ.get(n) for n in ("RENV_FLAG", "RENV_JOB", "RENV_SHARED")}


class Reader:
    def __init__(self):
        import renv_wd_mod

        self.seen = renv_wd_mod.SEEN_AT_IMPORT

    def read(self):
        import os

        return {"data": open("data.txt").read(), "cwd": os.getcwd(), "seen": self.seen,
                "flag": os.environ.get("RENV_FLAG"), "job": os.environ.get("RENV_JOB")}


def test_job_env_vars_merge_under_task_and_actor_envs(no_leaks):
    job = {"env_vars": {"RENV_JOB": "job", "RENV_SHARED": "job"}}
    with start_cluster(num_cpus=2, runtime_env=job):
        assert "RENV_JOB" not in os.environ   # the job's env is for workers, not the driver
        plain = ddlf.get(look.remote(), timeout=30)
        assert plain["env"] == {"RENV_FLAG": None, "RENV_JOB": "job", "RENV_SHARED": "job"}
        own = {"env_vars": {"RENV_SHARED": "task", "RENV_FLAG": "1"}}
        mine = ddlf.get(look.options(runtime_env=own).remote(), timeout=30)
        assert mine["env"] == {"RENV_FLAG": "1", "RENV_JOB": "job", "RENV_SHARED": "task"}
        # Workers set up for one env never run work of another.
        assert mine["pid"] != plain["pid"]
        again = ddlf.get([look.remote() for _ in range(4)], timeout=30)
        assert all(r["env"]["RENV_FLAG"] is None for r in again)
        assert mine["pid"] not in {r["pid"] for r in again}
        # A nested task inherits its parent's env (the task's, merged over the job's).
        inner = ddlf.get(nested_look.options(runtime_env=own).remote(), timeout=30)
        assert inner["env"] == mine["env"]
        a = EnvActor.options(runtime_env={"env_vars": {"RENV_FLAG": "a"}}).remote()
        assert ddlf.get(a.env.remote(), timeout=30) == {
            "RENV_FLAG": "a", "RENV_JOB": "job", "RENV_SHARED": "job"}


def test_working_dir_and_py_modules_are_shipped_and_used(project, no_leaks):
    wd, mods = project
    env = {"working_dir": str(wd), "py_modules": [str(mods / "renv_pkg"),
                                                  str(mods / "renv_single.py")],
           "env_vars": {"RENV_FLAG": "set-before-import"}, "excludes": ["*.bin"]}
    with start_cluster(num_cpus=2):
        got = ddlf.get(import_things.options(runtime_env=env).remote(), timeout=30)
        assert got["value"] == "from-working-dir" and got["answer"] == 42
        assert got["single"] == "single" and got["data"] == "payload\n"
        assert got["seen_at_import"] == "set-before-import"
        assert got["has_git"] is False
        # The worker runs in the unpacked copy (cwd and sys.path[0]), not in our folder.
        assert str(wd) not in got["cwd"] and got["mod_file"].startswith(got["cwd"])
        where = ddlf.get(look.options(runtime_env=env).remote(), timeout=30)
        assert where["cwd"] == where["path0"] == got["cwd"]
        assert not os.path.exists(os.path.join(got["cwd"], "big.bin"))


def test_actor_runs_in_its_env_even_after_the_source_folder_is_gone(project, no_leaks):
    wd, _ = project
    job = {"env_vars": {"RENV_JOB": "job"}}
    with start_cluster(num_cpus=2, runtime_env=job):
        actor_cls = ddlf.remote(Reader).options(
            runtime_env={"working_dir": str(wd), "env_vars": {"RENV_FLAG": "actor"}})
        first = actor_cls.remote()
        got = ddlf.get(first.read.remote(), timeout=30)
        assert got["data"] == "payload\n" and got["seen"] == "actor"
        assert got == {**got, "flag": "actor", "job": "job"}
        # The package lives on the head and the node now, not at our path.
        shutil.rmtree(wd)
        second = actor_cls.remote()
        assert ddlf.get(second.read.remote(), timeout=30)["data"] == "payload\n"


def test_each_node_gets_the_package_from_the_head(project):
    wd, _ = project
    with no_leaked_processes():
        with joined(MultiNodeCluster(node_cpus=(1, 1))):
            # Checked (and packed) once; the second node still gets it after the folder is gone.
            env = renv.validate({"working_dir": str(wd)})
            actor_cls = ddlf.remote(Reader)
            cwds = set()
            for node in ddlf.nodes():
                a = actor_cls.options(node_id=node["node_id"], runtime_env=env).remote()
                got = ddlf.get(a.read.remote(), timeout=30)
                assert got["data"] == "payload\n"
                assert node["node_id"] in got["cwd"]   # under that node's session folder
                cwds.add(got["cwd"])
                shutil.rmtree(wd, ignore_errors=True)  # the second node cannot read it here
            assert len(cwds) == 2


def test_runtime_env_reaches_workers_through_the_ray_layer(project, no_leaks):
    import ddlf_actors.compat.ray as ray
    from ddlf_actors.compat.ray.runtime_env import RuntimeEnv

    wd, _ = project
    with pytest.raises(NotImplementedError, match="'pip'"):
        ray.init(runtime_env=RuntimeEnv(pip=["emoji"]))
    ray.init(num_cpus=1, runtime_env=RuntimeEnv(env_vars={"RENV_JOB": "ray"}))
    try:
        @ray.remote(runtime_env={"working_dir": str(wd)})
        def read():
            import os

            return open("data.txt").read(), os.environ.get("RENV_JOB")

        assert ray.get(read.remote(), timeout=30) == ("payload\n", "ray")
    finally:
        ray.shutdown()
