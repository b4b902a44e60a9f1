"""Lazy task graphs (``ddlf_actors.dag``) and their compiled-graph API, Ray's semantics."""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
import time
import types
import uuid

import pytest
from helpers_modules.clusters import start_cluster

import ddlf_actors as ddlf
from ddlf_actors.dag import (
    ClassMethodNode,
    ClassNode,
    CompiledDAGRef,
    DAGInputData,
    DAGNode,
    FunctionNode,
    InputNode,
    MultiOutputNode,
)
from ddlf_actors.errors import ActorDiedError, DDLFError, SerializationError, TaskError

T = 60  # bound on every get


@pytest.fixture(scope="module")
def cluster():
    # One cluster for the module: the tests are many and each is small.
    with start_cluster(num_cpus=2) as info:
        yield info


@ddlf.remote
def add(x, inc=1):
    return x + inc


@ddlf.remote
def token():
    return uuid.uuid4().hex


@ddlf.remote
def pair(a, b):
    return a, b


@ddlf.remote
def kinds(xs, d):
    return [type(x).__name__ for x in xs], type(d["k"]).__name__, ddlf.get(xs), ddlf.get(d["k"])


@ddlf.remote
def boom(x):
    raise KeyError(f"boom {x}")


@ddlf.remote(num_returns=2)
def two(x):
    return x, -x


@ddlf.remote
class Counter:
    def __init__(self, start=0):
        self.n = start
        self.token = uuid.uuid4().hex

    def inc(self, x=1):
        self.n += x
        return self.n

    def get(self):
        return self.n

    def ident(self):
        return self.token

    @ddlf.method(num_returns=2)
    def split(self, x):
        return x, x * 10


# -- task graphs --------------------------------------------------------------------------

def test_bind_builds_nodes_and_execute_submits_them(cluster):
    a = add.bind(1, inc=2)
    assert isinstance(a, FunctionNode)
    assert ddlf.get(a.execute(), timeout=T) == 3
    b = add.bind(a, inc=3)
    c = add.bind(b, inc=a)      # a node as a keyword argument
    assert ddlf.get(b.execute(), timeout=T) == 6
    assert ddlf.get(c.execute(), timeout=T) == 9
    assert ddlf.get(add.options(num_cpus=0).bind(5).execute(), timeout=T) == 6


def test_a_shared_node_runs_once_per_execute(cluster):
    t = token.bind()
    dag = pair.bind(t, t)
    x1, y1 = ddlf.get(dag.execute(), timeout=T)
    x2, y2 = ddlf.get(dag.execute(), timeout=T)
    assert x1 == y1 and x2 == y2     # once within an execute
    assert x1 != x2                  # again on the next one


def test_input_node_feeds_execute_arguments(cluster):
    with InputNode() as inp:
        dag = pair.bind(add.bind(inp), add.bind(inp, inc=10))
    assert ddlf.get(dag.execute(2), timeout=T) == (3, 12)
    assert ddlf.get(dag.execute(3), timeout=T) == (4, 13)

    with InputNode() as inp:
        dag = MultiOutputNode([add.bind(inp[0]), add.bind(inp.y), add.bind(inp["z"])])
    assert ddlf.get(dag.execute(1, y=2, z=3), timeout=T) == [2, 3, 4]

    with InputNode() as inp:       # one value: indexed, keyed, or its attribute
        dag = MultiOutputNode([add.bind(inp[1]), add.bind(inp[0])])
    assert ddlf.get(dag.execute([10, 20]), timeout=T) == [21, 11]
    with InputNode() as inp:
        dag = MultiOutputNode([add.bind(inp["x"]), add.bind(inp.real)])
    with pytest.raises(TypeError):
        dag.execute(5)              # 5["x"]
    assert ddlf.get(MultiOutputNode([add.bind(inp.real)]).execute(5), timeout=T) == [6]


def test_input_node_misuse_is_reported(cluster):
    inp = InputNode()
    with pytest.raises(ValueError, match="with InputNode"):
        add.bind(inp).execute(1)
    with pytest.raises(ValueError, match="takes no arguments"):
        InputNode(1)
    with InputNode() as i1, InputNode() as i2:
        dag = pair.bind(i1, i2)
    with pytest.raises(ValueError, match="only one InputNode"):
        dag.execute(1)
    with InputNode() as inp:
        dag = add.bind(inp[3])
    with pytest.raises(IndexError, match="positional"):
        dag.execute(1, 2)
    with pytest.raises(KeyError, match="'y'"):
        DAGInputData(1)["y"]


def test_nodes_nested_in_containers_arrive_as_refs(cluster):
    with InputNode() as inp:
        dag = kinds.bind([add.bind(inp), add.bind(inp, inc=2)], {"k": add.bind(inp, inc=3)})
    assert ddlf.get(dag.execute(1), timeout=T) == (["ObjectRef", "ObjectRef"], "ObjectRef",
                                                   [2, 3], 4)


def test_errors_reach_get_through_downstream_nodes(cluster):
    with InputNode() as inp:
        dag = add.bind(boom.bind(inp))
    with pytest.raises(KeyError, match="boom 7") as e:
        ddlf.get(dag.execute(7), timeout=T)
    assert isinstance(e.value, TaskError)


def test_num_returns_gives_a_list(cluster):
    refs = two.bind(4).execute()
    assert ddlf.get(refs, timeout=T) == [4, -4]
    c = Counter.remote()
    refs = c.split.bind(2).execute()
    assert ddlf.get(refs, timeout=T) == [2, 20]
    assert ddlf.get(c.inc.options(num_returns=1).bind().execute(), timeout=T) == 1


def test_dag_nodes_refuse_remote_rebind_and_pickling(cluster):
    node = add.bind(1)
    with pytest.raises(AttributeError, match="execute"):
        node.remote()
    with pytest.raises(AttributeError, match="bind"):
        node.bind()
    with pytest.raises(TypeError, match="lists, tuples and dicts"):
        pickle.dumps(node)
    with pytest.raises(TypeError, match="lists, tuples and dicts"):
        add.bind(frozenset([node])).execute()
    with pytest.raises(ValueError, match="list of DAG nodes"):
        MultiOutputNode(node)


# -- actors -------------------------------------------------------------------------------

def test_class_node_calls_run_in_bind_order_on_a_new_actor_each_execute(cluster):
    a1 = Counter.bind(10)
    assert isinstance(a1, ClassNode)
    first = a1.get.bind()
    assert isinstance(first, ClassMethodNode)
    assert ddlf.get(first.execute(), timeout=T) == 10
    a2 = Counter.bind(10)
    a1.inc.bind(2)           # not used by the output: still runs, before the next call
    a1.inc.bind(4)
    a2.inc.bind(6)
    dag = add.bind(a1.get.bind(), inc=a2.get.bind())
    assert ddlf.get(dag.execute(), timeout=T) == 32
    # Each execute makes new actors: the sum starts again from 10 + 10.
    assert ddlf.get(dag.execute(), timeout=T) == 32
    ids = a1.ident.bind()
    assert ddlf.get(ids.execute(), timeout=T) != ddlf.get(ids.execute(), timeout=T)
    handle = Counter.bind(3).execute()
    assert isinstance(handle, ddlf.ActorHandle)
    assert ddlf.get(handle.get.remote(), timeout=T) == 3


def test_class_node_misuse_is_reported(cluster):
    with InputNode() as inp:
        with pytest.raises(ValueError, match="constructor cannot read the input"):
            Counter.bind(inp)
    node = Counter.bind()
    with pytest.raises(AttributeError, match="no method 'nope'"):
        node.nope  # noqa: B018
    with pytest.raises(AttributeError, match="use .bind"):
        node.inc.remote()
    with pytest.raises(ValueError, match="unknown option"):
        node.inc.options(num_cpus=1)


def test_methods_bound_on_a_live_handle_reuse_the_actor(cluster):
    c = Counter.remote()
    with InputNode() as inp:
        dag = MultiOutputNode([c.inc.bind(inp)])
    assert ddlf.get(dag.execute(1), timeout=T) == [1]
    assert ddlf.get(dag.execute(2), timeout=T) == [3]
    assert ddlf.get(c.get.remote(), timeout=T) == 3


# -- compiled graphs ----------------------------------------------------------------------

def test_compiled_graph_runs_through_normal_calls(cluster):
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    cdag = dag.experimental_compile()
    ref = cdag.execute(1)
    assert isinstance(ref, CompiledDAGRef) and isinstance(ref, ddlf.ObjectRef)
    assert ddlf.get(ref, timeout=T) == 1         # a: 0+1 = 1, b: 0+1 = 1
    assert ref.get(timeout=T) == 1
    assert ddlf.get(cdag.execute(2), timeout=T) == 4   # a: 3, b: 1+3
    cdag.teardown()
    with pytest.raises(DDLFError, match="torn down"):
        cdag.execute(1)
    assert ddlf.get(a.get.remote(), timeout=T) == 3   # teardown leaves given actors alone

    with InputNode() as inp:
        multi = MultiOutputNode([a.inc.bind(inp), b.inc.bind(inp)]).experimental_compile()
    refs = multi.execute(10)
    assert all(isinstance(r, CompiledDAGRef) for r in refs)
    assert ddlf.get(refs, timeout=T) == [13, 14]
    with pytest.raises(ValueError, match="pickled"):
        pickle.dumps(refs[0])
    with pytest.raises(SerializationError, match="passed to a task"):
        add.remote(refs[0])
    multi.teardown(kill_actors=True)
    with pytest.raises(ActorDiedError):
        ddlf.get(a.get.remote(), timeout=T)


def test_compiled_graph_makes_bound_actors_once(cluster):
    node = Counter.bind(100)
    with InputNode() as inp:
        dag = node.inc.bind(inp)
    cdag = dag.experimental_compile()
    assert ddlf.get([cdag.execute(1), cdag.execute(2)], timeout=T) == [101, 103]
    handle = cdag._owned[0]
    cdag.teardown()
    with pytest.raises(ActorDiedError):
        ddlf.get(handle.get.remote(), timeout=T)


def test_compiled_graph_rejects_what_ray_rejects(cluster):
    with InputNode() as inp:
        tasks = add.bind(inp)
    with pytest.raises(NotImplementedError, match="actor method calls only"):
        tasks.experimental_compile()
    c = Counter.remote()
    with pytest.raises(ValueError, match="exactly one InputNode"):
        c.inc.bind(1).experimental_compile()
    with InputNode() as inp:
        dag = c.inc.bind(inp)
    with pytest.raises(NotImplementedError, match="NCCL"):
        dag.with_tensor_transport(transport="nccl")
    assert dag.with_tensor_transport() is dag
    with pytest.raises(NotImplementedError, match="typed channels"):
        dag.with_type_hint(object())
    with pytest.raises(NotImplementedError, match="GPU"):
        dag.experimental_compile(_overlap_gpu_communication=True)


def test_compiled_graph_with_asyncio(cluster):
    c = Counter.remote()
    with InputNode() as inp:
        cdag = c.inc.bind(inp).experimental_compile(enable_asyncio=True)
    with pytest.raises(ValueError, match="execute_async"):
        cdag.execute(1)

    async def run():
        fut = await cdag.execute_async(5)
        return await asyncio.wait_for(fut, T)

    assert asyncio.run(run()) == 5
    with InputNode() as inp:
        sync = c.inc.bind(inp).experimental_compile()
    with pytest.raises(ValueError, match="enable_asyncio"):
        asyncio.run(sync.execute_async(1))


def test_compiled_graph_reports_a_dead_actor_and_keeps_the_others(cluster):
    actors = [Counter.remote() for _ in range(3)]
    with InputNode() as inp:
        cdag = MultiOutputNode([a.inc.bind(inp) for a in actors]).experimental_compile()
    ddlf.kill(actors[0])
    with pytest.raises(ActorDiedError):
        ddlf.get(cdag.execute(1), timeout=T)
    with pytest.raises(ActorDiedError):
        ddlf.get(actors[0].get.remote(), timeout=T)
    assert ddlf.get([a.get.remote() for a in actors[1:]], timeout=T) == [1, 1]


def test_visualize(cluster, monkeypatch, tmp_path):
    c = Counter.remote()
    with InputNode() as inp:
        cdag = MultiOutputNode([c.inc.bind(inp.x), c.get.bind()]).experimental_compile()
    text = cdag.visualize(format="ascii")
    assert "InputNode['x']" in text and "Counter" in text and ".inc()" in text
    rendered = {}

    class Source:
        def __init__(self, source, format):
            rendered.update(source=source, format=format)

        def render(self, filename, view=False):
            rendered.update(filename=filename)

    monkeypatch.setitem(sys.modules, "graphviz", types.SimpleNamespace(Source=Source))
    dot = cdag.visualize(filename=str(tmp_path / "g"))
    assert dot.startswith("digraph") and "->" in dot and rendered["format"] == "png"
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(ImportError, match="pip install graphviz"):
        cdag.visualize()
    with pytest.raises(NotImplementedError, match="channels"):
        cdag.visualize(format="ascii", channel_details=True)


# -- ddlf.kill right after creation: the compiled-graph actor-death example needs it ----

def test_kill_while_connecting_keeps_the_actor_dead(cluster):
    for _ in range(4):
        actors = [Counter.remote() for _ in range(3)]
        ddlf.kill(actors[0])
        with pytest.raises(ActorDiedError):
            ddlf.get([a.get.remote() for a in actors], timeout=T)
        with pytest.raises(ActorDiedError):
            ddlf.get(actors[0].get.remote(), timeout=T)


@ddlf.remote
def slow_value():
    time.sleep(1.0)
    return 5


def test_kill_before_pending_arguments_resolve_does_not_start_the_actor(cluster):
    from ddlf_actors.runtime.client.current import get_core

    a = Counter.remote(slow_value.remote())
    ddlf.kill(a)
    deadline = time.monotonic() + 20
    while True:
        view = [v for v in get_core().head_call("list_actors") if v["actor_id"] == a._actor_id]
        if view and view[0]["state"] == "DEAD" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    time.sleep(1.5)   # past the argument: the creation went ahead, then was killed
    view = [v for v in get_core().head_call("list_actors") if v["actor_id"] == a._actor_id]
    assert view and view[0]["state"] == "DEAD", view


# -- the Ray layer ------------------------------------------------------------------------

def test_ray_layer_names(cluster):
    import ddlf_actors.compat.ray as ray
    from ddlf_actors.compat.ray.dag.input_node import InputNode as RayInputNode
    from ddlf_actors.compat.ray.dag.output_node import MultiOutputNode as RayMulti

    assert ray.dag.InputNode is InputNode and RayInputNode is InputNode
    assert RayMulti is MultiOutputNode and ray.dag.DAGNode is DAGNode

    @ray.remote(num_cpus=0)
    def f(x):
        return x + 1

    @ray.remote
    class A:
        def pid(self):
            return os.getpid()

    with ray.dag.InputNode() as inp:
        dag = ray.dag.MultiOutputNode([f.bind(inp), f.options(memory=0).bind(inp)])
    assert ray.get(dag.execute(1), timeout=T) == [2, 2]
    assert isinstance(ray.get(A.options(num_cpus=0).bind().pid.bind().execute(), timeout=T),
                      int)
