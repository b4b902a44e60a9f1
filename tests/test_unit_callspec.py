"""runtime/wire/callspec.py: a CALL frame's body, encoded by the caller and decoded once by the
worker, with no process (round trips, the bytes on the wire, malformed bodies)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddlf_actors.runtime.client.refs import ArgRef
from ddlf_actors.runtime.wire.callspec import DYNAMIC, STREAMING, CallSpec, TaskSpec
from ddlf_actors.runtime.wire.messages import MessageError
from ddlf_actors.runtime.wire.serialization import _is_plain, dumps, loads

_args = st.tuples(st.integers(), st.text(max_size=8), st.none())
_kwargs = st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), max_size=3)
_nret = st.one_of(st.integers(1, 50), st.sampled_from([STREAMING, DYNAMIC]))
_limit = st.one_of(st.just(-1), st.integers(1, 100))
_placement = st.one_of(st.none(), st.fixed_dictionaries(
    {"group_id": st.text(min_size=1, max_size=8), "bundles": st.just([{"CPU": 1.0}]),
     "capture": st.booleans()}))


def _through_the_wire(spec):
    return loads(dumps(spec.to_wire()))


@given(method=st.text(min_size=1, max_size=20), args=_args, kwargs=_kwargs, nret=_nret,
       limit=_limit)
def test_a_call_spec_survives_the_wire(method, args, kwargs, nret, limit):
    spec = CallSpec(method, args, kwargs, nret, limit)
    assert CallSpec.from_wire(_through_the_wire(spec)) == spec


@given(fn_id=st.binary(min_size=16, max_size=16), name=st.text(min_size=1, max_size=20),
       job=st.one_of(st.none(), st.text(max_size=8)), args=_args, kwargs=_kwargs,
       nret=_nret, limit=_limit, placement=_placement)
def test_a_task_spec_survives_the_wire(fn_id, name, job, args, kwargs, nret, limit, placement):
    spec = TaskSpec(fn_id, name, job, args, kwargs, nret, limit, placement)
    assert TaskSpec.from_wire(_through_the_wire(spec)) == spec


def test_the_wire_form_is_the_tuple_callers_sent_before():
    """Same bytes as the hand-built tuples the specs replace, for the shapes that matter."""
    args, kwargs = (1, "x", np.arange(3.0)), {"k": 2}
    assert CallSpec("m", args, kwargs).to_wire() == ("m", args, kwargs)
    assert CallSpec("m", args, kwargs, STREAMING, 4).to_wire() == ("m", args, kwargs,
                                                                    STREAMING, 4)
    fid = b"f" * 16
    assert TaskSpec(fid, "f", "job", args, kwargs).to_wire() == (fid, "f", "job", args, kwargs)
    group = {"group_id": "g", "bundles": [{"CPU": 1.0}], "capture": False}
    assert TaskSpec(fid, "f", None, args, kwargs, placement=group).to_wire() == (
        fid, "f", None, args, kwargs, 1, -1, group)
    old = pickle.dumps(("m", (1, 2.0), {}), protocol=5)
    assert pickle.dumps(CallSpec("m", (1, 2.0), {}).to_wire(), protocol=5) == old


def test_plain_calls_keep_the_plain_pickle_fast_path():
    # dumps() uses plain pickle only for builtin containers of scalars and arrays.
    assert _is_plain(CallSpec("m", (1, np.zeros(4)), {"a": 1.5}).to_wire())
    assert _is_plain(TaskSpec(b"f" * 16, "f", "j", (ArgRef(b"i" * 16),), {}).to_wire()) == (
        _is_plain((b"f" * 16, "f", "j", (ArgRef(b"i" * 16),), {})))


def test_streaming_is_read_from_num_returns():
    assert CallSpec("m", (), {}, STREAMING).streaming
    assert CallSpec("m", (), {}, DYNAMIC).streaming
    assert not CallSpec("m", (), {}, 3).streaming
    assert TaskSpec(b"f", "f", None, (), {}, STREAMING).streaming


@pytest.mark.parametrize("body,words", [
    (["m", (), {}], "a CallSpec is a tuple of 3 to 5 fields, got list"),
    (("m", ()), "a CallSpec is a tuple of 3 to 5 fields, got 2"),
    (("m", (), {}, 1, -1, "extra"), "got 6"),
    ((7, (), {}), "CallSpec.method must be a str, got int"),
    (("m", "ab", {}), "CallSpec.args must be a tuple, got str"),
    (("m", (), []), "CallSpec.kwargs must be a dict, got list"),
    (("m", (), {}, 0), "CallSpec.num_returns must be an int >= 1"),
    (("m", (), {}, True), "CallSpec.num_returns must be an int >= 1"),
    (("m", (), {}, "lots"), "CallSpec.num_returns must be an int >= 1"),
    (("m", (), {}, 2, "x"), "CallSpec.backpressure must be an int, got str"),
])
def test_a_malformed_call_body_names_its_field(body, words):
    with pytest.raises(MessageError) as e:
        CallSpec.from_wire(body)
    assert words in str(e.value)


@pytest.mark.parametrize("body,words", [
    ((b"f", "f", None, ()), "a TaskSpec is a tuple of 5 to 8 fields, got 4"),
    (("f", "f", None, (), {}), "TaskSpec.fn_id must be bytes, got str"),
    ((b"f", None, None, (), {}), "TaskSpec.fn_name must be a str, got NoneType"),
    ((b"f", "f", 3, (), {}), "TaskSpec.job_id must be a str or None, got int"),
    ((b"f", "f", None, (), {}, -2), "TaskSpec.num_returns must be an int >= 1"),
    ((b"f", "f", None, (), {}, 1, -1, ["g"]), "TaskSpec.placement must be a dict or None"),
])
def test_a_malformed_task_body_names_its_field(body, words):
    with pytest.raises(MessageError) as e:
        TaskSpec.from_wire(body)
    assert words in str(e.value)
