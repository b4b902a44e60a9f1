"""``ddlf.get_runtime_context()``: what the driver, a task and an actor learn about themselves."""

from __future__ import annotations

import asyncio
import os

import pytest
from helpers_modules.clusters import start_cluster

import ddlf_actors as ddlf
from ddlf_actors.errors import ActorDiedError
from ddlf_actors.runtime.client.current import get_core


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


# -- Ray's older properties: typed ids, and the rest Ray 2.60 has besides get_*() ------------
def _properties():
    import warnings

    rc = ddlf.get_runtime_context()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return {"job": rc.job_id, "node": rc.node_id, "task": rc.task_id, "actor": rc.actor_id,
                "group": rc.current_placement_group_id,
                "capture": rc.should_capture_child_tasks_in_placement_group,
                "env": rc.runtime_env, "env_string": rc.get_runtime_env_string(),
                "get": {"job": rc.get_job_id(), "node": rc.get_node_id(),
                        "task": rc.get_task_id(), "actor": rc.get_actor_id(),
                        "group": rc.get_placement_group_id()}}


@ddlf.remote
def properties_task():
    return _properties()


@ddlf.remote
class PropertiesProbe:
    def properties(self):
        return _properties()


def test_the_drivers_properties_are_typed_ids_of_its_get_answers(cluster):
    from ddlf_actors.ids import ActorID, JobID, NodeID, PlacementGroupID, TaskID  # noqa: F401

    p = _properties()
    assert p["job"] == JobID(p["get"]["job"]) and p["job"].hex() == get_core().job_id
    assert isinstance(p["node"], NodeID) and p["node"].hex() == p["get"]["node"]
    assert p["node"].hex() in {n["node_id"] for n in ddlf.nodes()}
    assert p["task"] is None and p["actor"] is None
    assert isinstance(p["group"], PlacementGroupID) and p["group"].is_nil()
    assert p["capture"] is False and p["env"] == {} and p["env_string"] == "{}"


def test_a_task_and_an_actor_see_their_own_ids_and_runtime_env(cluster):
    env = {"env_vars": {"DDLF_CTX_PROBE": "on"}}
    t = ddlf.get(properties_task.options(runtime_env=env).remote(), timeout=30)
    assert t["task"] is not None and t["task"].hex() == t["get"]["task"]
    assert t["node"].hex() == t["get"]["node"] and t["actor"] is None
    assert t["env"]["env_vars"] == {"DDLF_CTX_PROBE": "on"}
    assert '"DDLF_CTX_PROBE": "on"' in t["env_string"]
    probe = PropertiesProbe.remote()
    a = ddlf.get(probe.properties.remote(), timeout=30)
    assert a["actor"].hex() == probe._actor_id and a["task"].hex() == a["get"]["task"]
    assert a["env"] == {}
    ddlf.kill(probe)


def test_an_actor_in_a_capturing_placement_group_sees_it(cluster):
    from ddlf_actors.util.placement_group import placement_group, remove_placement_group
    from ddlf_actors.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    try:
        probe = PropertiesProbe.options(num_cpus=1, scheduling_strategy=(
            PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        )).remote()
        a = ddlf.get(probe.properties.remote(), timeout=30)
        assert a["group"].hex() == pg.id == a["get"]["group"] and not a["group"].is_nil()
        assert a["capture"] is True
        ddlf.kill(probe)
    finally:
        remove_placement_group(pg)


def test_the_id_properties_warn_as_rays_deprecated_ones_do(cluster):
    rc = ddlf.get_runtime_context()
    with pytest.warns(DeprecationWarning, match=r"use get_node_id\(\)"):
        rc.node_id  # noqa: B018
    with pytest.warns(DeprecationWarning, match=r"use get_job_id\(\)"):
        rc.job_id  # noqa: B018


@ddlf.remote
def where_am_i():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return ddlf.get_runtime_context().node_id


def test_rays_scheduling_doc_example_runs(cluster):
    """Ray's doc_code/scheduling.py: node affinity to the driver's node_id, then to the
    node_id a task returned (an id object, not a string)."""
    import warnings

    import ddlf_actors.compat.ray as ray
    from ddlf_actors.compat.ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        here = ray.get_runtime_context().node_id
    hard = where_am_i.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id=here, soft=False)).remote()
    assert ray.get(hard, timeout=30) == here
    there = ray.get(where_am_i.remote(), timeout=30)
    soft = where_am_i.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id=there, soft=True)).remote()
    assert ray.get(soft, timeout=30) == there == ray.NodeID(there.hex())
    assert isinstance(ray.get_runtime_context().runtime_env, ray.runtime_env.RuntimeEnv)
