"""Refs pickled out of band (``pickle.dumps(ref)``): pinned in their owner, fetchable."""

from __future__ import annotations

import copy
import os
import pickle
import time

import cloudpickle
import pytest
from helpers_modules.clusters import start_cluster

import ddlf_actors as ddlf
from ddlf_actors.errors import DDLFError, TaskError
from ddlf_actors.runtime.client import object_ref
from ddlf_actors.runtime.client.current import get_core
from ddlf_actors.runtime.client.object_ref import ForeignObjectRef
from ddlf_actors.runtime.client.oob import ObjectFetchError

T = 60


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(num_cpus=2) as info:
        yield info


@ddlf.remote
def pickled_put(value):
    return pickle.dumps(ddlf.put(value))


@ddlf.remote
def pickled_nested():
    return pickle.dumps(ddlf.put({"inner": ddlf.put("deep")}))


@ddlf.remote
def fails():
    raise KeyError("from the task")


@ddlf.remote
def slow(x):
    time.sleep(1.0)
    return x


@ddlf.remote
def pickled_call(fn_name):
    # The ref is still pending when it is pickled and when the driver asks for it.
    fn = {"fails": fails, "slow": slow}[fn_name]
    ref = fn.remote(7) if fn_name == "slow" else fn.remote()
    return cloudpickle.dumps(ref)


@ddlf.remote
def load_and_get(blob):
    return ddlf.get(pickle.loads(blob), timeout=30)


@ddlf.remote
class Owner:
    def pickle_one(self, value):
        self.ref = None
        return pickle.dumps(ddlf.put(value))

    def free_all(self):
        return object_ref.free(list(object_ref._pinned.values()))

    def pid(self):
        return os.getpid()


def test_unpickling_without_a_cluster_gives_a_ref_that_says_why():
    # First in the file, before the module's cluster starts: no core in this process.
    assert get_core(auto=False) is None
    ref = object_ref._out_of_band_ref(b"\x01" * 16, "127.0.0.1:9")
    assert isinstance(ref, ForeignObjectRef) and isinstance(ref, ddlf.ObjectRef)
    with pytest.raises(DDLFError, match="not connected to a DDLF cluster"):
        ref.future()
    same = pickle.loads(pickle.dumps(ref))   # stays foreign, keeps its reason
    assert type(same) is ForeignObjectRef and same.why == ref.why
    assert object_ref.pinned(ref.id) is None


def test_the_owner_keeps_a_ref_pickled_out_of_band(cluster):
    ref = ddlf.put({"hello": "world"})
    obj_id = ref.id
    blob = cloudpickle.dumps(ref)
    del ref                          # the pin keeps the object
    again = pickle.loads(blob)
    assert ddlf.get(again, timeout=T) == {"hello": "world"}
    assert object_ref.free(again) == 1 and object_ref.free(again) == 0
    del again
    assert obj_id not in get_core().objects   # freed once unpinned and unreferenced


def test_copies_do_not_pin(cluster):
    ref = ddlf.put(1)
    assert copy.copy(ref) is ref and copy.deepcopy([ref])[0] is ref
    assert object_ref.pinned(ref.id) is None
    assert ddlf.get(ddlf.put([ref]), timeout=T)[0] == ref   # in-band: no pin either
    assert object_ref.pinned(ref.id) is None


def test_a_worker_owned_ref_is_fetched_from_its_owner(cluster):
    ref = pickle.loads(ddlf.get(pickled_put.remote([1, 2, 3]), timeout=T))
    assert type(ref) is ddlf.ObjectRef
    assert ddlf.get(ref, timeout=T) == [1, 2, 3]
    outer = ddlf.get(pickle.loads(ddlf.get(pickled_nested.remote(), timeout=T)), timeout=T)
    assert ddlf.get(outer["inner"], timeout=T) == "deep"   # came along with the object


def test_a_pending_or_failed_ref_is_fetched_when_it_settles(cluster):
    ref = pickle.loads(ddlf.get(pickled_call.remote("slow"), timeout=T))
    assert ddlf.get(ref, timeout=T) == 7
    ref = pickle.loads(ddlf.get(pickled_call.remote("fails"), timeout=T))
    with pytest.raises(KeyError, match="from the task") as e:
        ddlf.get(ref, timeout=T)
    assert isinstance(e.value, TaskError)


def test_a_driver_owned_ref_is_fetched_by_a_worker(cluster):
    ref = ddlf.put("from the driver")
    blob = pickle.dumps(ref)
    assert ddlf.get(load_and_get.remote(blob), timeout=T) == "from the driver"
    object_ref.free(ref)


def test_a_freed_or_dead_owner_says_so(cluster):
    owner = Owner.remote()
    blob = ddlf.get(owner.pickle_one.remote("x"), timeout=T)
    assert ddlf.get(owner.free_all.remote(), timeout=T) == 1
    with pytest.raises(ObjectFetchError, match="no longer pins it"):
        ddlf.get(pickle.loads(blob), timeout=T)
    blob = ddlf.get(owner.pickle_one.remote("y"), timeout=T)
    ddlf.kill(owner)
    time.sleep(0.5)
    with pytest.raises(ObjectFetchError, match="owner"):
        ddlf.get(pickle.loads(blob), timeout=T)


def test_ray_private_internal_api(cluster):
    import ddlf_actors.compat.ray as ray

    ref = ray.put(b"z" * 1000)
    blob = ray.cloudpickle.dumps(ref)
    summary = ray._private.internal_api.memory_summary()
    row = next(line for line in summary.splitlines() if line.startswith(ref.hex()))
    assert row.split()[-1] == "yes" and "1 pinned out of band" in summary
    again = ray.cloudpickle.loads(blob)
    ray._private.internal_api.free(again)
    assert object_ref.pinned(ref.id) is None
    with pytest.raises(AttributeError, match="private modules"):
        ray._private.worker  # noqa: B018
