"""Typed ids (``ddlf_actors.ids``): what Ray-style code does with ``ctx.node_id``."""

from __future__ import annotations

import pickle

import pytest

import ddlf_actors as ddlf
from ddlf_actors.ids import ActorID, NodeID, PlacementGroupID
from ddlf_actors.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def test_an_id_equals_its_own_class_and_string_only():
    a = NodeID("0a1b2c")
    assert a == NodeID("0a1b2c") and hash(a) == hash(NodeID("0a1b2c"))
    assert a != NodeID("0a1b2d") and a != ActorID("0a1b2c") and a != "0a1b2c"
    assert len({a, NodeID("0a1b2c"), ActorID("0a1b2c")}) == 2


def test_hex_binary_repr_nil_and_pickle():
    a = NodeID.from_hex("0a1b2c")
    assert a.hex() == "0a1b2c" and a.binary() == b"\x0a\x1b\x2c"
    assert NodeID("worker-7").binary() == b"worker-7"     # a node named at start
    assert repr(a) == str(a) == "NodeID(0a1b2c)"
    assert PlacementGroupID.nil().is_nil() and not a.is_nil()
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(TypeError, match="takes an id string"):
        NodeID(12)


def test_node_affinity_takes_a_node_id_as_rays_does():
    s = NodeAffinitySchedulingStrategy(NodeID("0a1b2c"), soft=False)
    assert s.node_id == "0a1b2c"
    with pytest.raises(ValueError, match="node id string"):
        NodeAffinitySchedulingStrategy(NodeID.nil(), soft=False)


def test_node_id_before_init_says_why():
    import warnings

    assert not ddlf.is_initialized()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RuntimeError, match="not initialized"):
            ddlf.get_runtime_context().node_id  # noqa: B018
        with pytest.raises(RuntimeError, match="not initialized"):
            ddlf.get_runtime_context().job_id  # noqa: B018
