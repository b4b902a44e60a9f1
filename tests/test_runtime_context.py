"""``ddlf.get_runtime_context()``: what the driver, a task and an actor learn about themselves."""

from __future__ import annotations

import asyncio
import os

import pytest
from helpers_modules.clusters import start_cluster

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError
from ddlf_actors.runtime.core import get_core


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(num_cpus=2) as info:
        yield info


def _about():
    rc = ddlf.get_runtime_context()
    return {"job": rc.get_job_id(), "node": rc.get_node_id(), "worker": rc.get_worker_id(),
            "task": rc.get_task_id(), "task_name": rc.get_task_name(),
            "function": rc.get_task_function_name(), "actor": rc.get_actor_id(),
            "actor_name": rc.get_actor_name(), "resources": rc.get_assigned_resources(),
            "canceled": rc.is_canceled(), "namespace": rc.namespace,
            "head": rc.head_address, "pid": os.getpid()}


@ddlf.remote
def about_task():
    return _about()


@ddlf.remote
class Probe:
    def __init__(self):
        self.init_task = ddlf.get_runtime_context().get_task_id()

    def about(self):
        return {**_about(), "init_task": self.init_task}

    def me(self):
        return ddlf.get_runtime_context().current_actor

    def ping(self):
        return "pong"

    def reconstructed(self):
        return ddlf.get_runtime_context().was_current_actor_reconstructed

    def crash(self):
        os._exit(1)


@ddlf.remote
class AsyncProbe:
    async def is_canceled(self):
        await asyncio.sleep(0)
        return ddlf.get_runtime_context().is_canceled()


def test_the_driver_has_a_job_and_nothing_else(cluster):
    rc = ddlf.get_runtime_context()
    assert rc.get_job_id() == get_core().job_id is not None
    assert rc.get_task_id() is None and rc.get_actor_id() is None
    assert rc.get_worker_id() is None and rc.get_placement_group_id() is None
    # As in Ray, a driver's node is the one on its host: here, the embedded cluster's.
    assert rc.get_node_id() in {n["node_id"] for n in ddlf.nodes()}
    assert rc.namespace == "" and rc.head_address == cluster.address
    with pytest.raises(RuntimeError, match="only available inside a task"):
        rc.is_canceled()
    with pytest.raises(RuntimeError, match="only available in an actor"):
        rc.current_actor  # noqa: B018


def test_a_task_knows_its_ids_name_and_resources(cluster):
    a, b = ddlf.get([about_task.remote(), about_task.options(num_cpus=2).remote()], timeout=30)
    nodes = {n["node_id"] for n in ddlf.nodes()}
    job = ddlf.get_runtime_context().get_job_id()
    for info in (a, b):
        assert info["job"] == job and info["node"] in nodes
        assert info["worker"] and info["actor"] is None and info["actor_name"] is None
        assert info["task_name"] == "about_task"
        assert info["function"] == f"{__name__}.about_task"
        assert info["canceled"] is False and info["head"] == cluster.address
    assert a["task"] and b["task"] and a["task"] != b["task"]
    assert a["resources"] == {"CPU": 1.0} and b["resources"] == {"CPU": 2.0}


def test_each_call_on_one_worker_has_its_own_task_id(cluster):
    infos = ddlf.get([about_task.remote() for _ in range(6)], timeout=30)
    assert len({i["task"] for i in infos}) == 6


def test_an_actor_knows_itself(cluster):
    named = Probe.options(name="probe-ctx", num_cpus=1).remote()
    plain = Probe.remote()
    n, p = ddlf.get([named.about.remote(), plain.about.remote()], timeout=30)
    assert n["actor"] == named._actor_id and p["actor"] == plain._actor_id
    assert n["actor_name"] == "probe-ctx" and p["actor_name"] == ""
    assert n["task_name"] == "Probe.about" and n["init_task"] is None
    assert n["resources"] == {"CPU": 1.0} and p["resources"] == {}
    assert n["task"] and n["worker"] != p["worker"]
    me = ddlf.get(named.me.remote(), timeout=30)
    assert me._actor_id == named._actor_id
    assert ddlf.get(me.ping.remote(), timeout=30) == "pong"   # a usable handle
    ddlf.kill(named)
    ddlf.kill(plain)


def test_was_current_actor_reconstructed_turns_true_after_a_restart(cluster):
    a = Probe.options(max_restarts=1).remote()
    assert ddlf.get(a.reconstructed.remote(), timeout=30) is False
    with pytest.raises(ActorDiedError):
        ddlf.get(a.crash.remote(), timeout=30)
    assert ddlf.get(a.reconstructed.remote(), timeout=60) is True
    ddlf.kill(a)


def test_is_canceled_is_refused_in_async_methods(cluster):
    a = AsyncProbe.remote()
    with pytest.raises(RuntimeError, match="not supported in an async"):
        ddlf.get(a.is_canceled.remote(), timeout=30)
    ddlf.kill(a)


def test_rays_runtime_context_is_ddlfs(cluster):
    import ddlf_actors.compat.ray as ray

    rc = ray.get_runtime_context()
    assert isinstance(rc, ddlf.RuntimeContext)
    assert rc.gcs_address == cluster.address
    assert rc.get_job_id() == ddlf.get_runtime_context().get_job_id()
    with pytest.raises(AttributeError, match="accelerator"):
        rc.get_accelerator_ids()
