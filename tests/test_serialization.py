"""dumps/loads: pickle protocol 5 with out-of-band buffers, cloudpickle for code."""

from __future__ import annotations

import pickle
import sys
import threading
import types

import numpy as np
import pytest

from ddlf_actors.runtime.errors import CodeShippingError, SerializationError
from ddlf_actors.runtime.wire.framing import FrameDecoder, encode_frame
from ddlf_actors.runtime.wire.serialization import dumps, loads, snapshot


def roundtrip(obj):
    return loads(dumps(obj))


def over_the_wire(obj):
    """dumps -> frame -> bytes -> decoder (in chunks) -> loads."""
    data = b"".join(bytes(b) for b in encode_frame(dumps(obj)))
    dec = FrameDecoder()
    frames = []
    for i in range(0, len(data), 100_000):
        frames += dec.feed(data[i : i + 100_000])
    assert len(frames) == 1
    return loads(frames[0])


@pytest.mark.parametrize("value", [
    0, -1, 2**100, 3.5, float("inf"), complex(1, -2), True, False, None,
    "", "héllo wörld ✓", b"", b"\x00\xff" * 10, "x" * 100_000, b"y" * 200_000,
])
def test_scalars(value):
    assert roundtrip(value) == value
    assert type(roundtrip(value)) is type(value)


def test_nan():
    out = roundtrip(float("nan"))
    assert out != out


def test_nested_containers():
    value = {
        "a": [1, 2, (3, 4, {"b": None})],
        "c": {"d": {"e": [b"bytes", "str", 1.5]}},
        "s": {1, 2, 3},
        "fs": frozenset({"x"}),
        7: [[[[[["deep"]]]]]],
        "empty": ([], {}, ()),
        "many": list(range(1000)),
    }
    assert roundtrip(value) == value


def test_shared_references_are_preserved():
    inner = [1, 2]
    value = [inner, inner]
    out = roundtrip(value)
    assert out == value
    assert out[0] is out[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.bool_,
                                   np.complex128])
def test_small_numpy_arrays(dtype):
    arr = (np.arange(60) % 7).astype(dtype).reshape(3, 4, 5)
    segs = dumps(arr)
    out = loads(segs)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert np.array_equal(out, arr)


def test_large_numpy_array_goes_out_of_band():
    arr = np.random.default_rng(1).standard_normal(1024 * 1024 // 8)  # 1 MB
    assert arr.nbytes == 1024 * 1024
    segs = dumps(arr)
    assert len(segs) > 1
    # The array's bytes travel in their own segment, not inside the pickle payload.
    assert memoryview(segs[0]).nbytes < 10_000
    assert sum(memoryview(s).nbytes for s in segs[1:]) >= arr.nbytes
    out = loads(segs)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert np.array_equal(out, arr)


def test_several_large_arrays_in_a_container():
    arrs = [np.full(200_000, i, dtype=np.float32) for i in range(3)]
    value = {"w": arrs, "step": 3, "name": "ckpt"}
    segs = dumps(value)
    assert len(segs) == 1 + 3
    out = loads(segs)
    assert out["step"] == 3 and out["name"] == "ckpt"
    for a, b in zip(arrs, out["w"]):
        assert np.array_equal(a, b)


def test_large_array_over_the_wire():
    arr = np.random.default_rng(2).integers(0, 1000, size=(512, 1024), dtype=np.int32)
    out = over_the_wire(arr)
    assert np.array_equal(out, arr)


def test_non_contiguous_large_array():
    base = np.arange(400_000, dtype=np.float64).reshape(800, 500)
    view = base[:, ::2]
    assert not view.flags.c_contiguous
    out = roundtrip(view)
    assert np.array_equal(out, view)
    out = over_the_wire(base.T)
    assert np.array_equal(out, base.T)


def test_object_array_and_structured_array():
    obj = np.array([1, "a", None, [1, 2]], dtype=object)
    out = roundtrip(obj)
    assert list(out) == list(obj)
    rec = np.zeros(100_000, dtype=[("x", np.float32), ("y", np.int16)])
    rec["x"] = np.arange(100_000)
    out = roundtrip(rec)
    assert np.array_equal(out, rec)


def test_lambda_and_closure():
    k = 41

    def make_adder(n):
        return lambda x: x + n + k

    fn = make_adder(1)
    segs = dumps(fn)
    out = over_the_wire(fn)
    assert out(0) == 42
    assert loads(segs)(10) == 52


def test_local_class_instance_and_method():
    class Local:
        def __init__(self, v):
            self.v = v

        def double(self):
            return self.v * 2

    obj = Local(21)
    out = roundtrip(obj)
    assert out.v == 21 and out.double() == 42
    bound = roundtrip(obj.double)
    assert bound() == 42


def test_lambda_inside_container_with_large_array():
    arr = np.ones(100_000)
    value = {"fn": lambda a: float(a.sum()), "arr": arr}
    segs = dumps(value)
    assert len(segs) > 1
    out = loads(segs)
    assert out["fn"](out["arr"]) == 100_000.0


def test_snapshot_copies_and_is_independent_of_the_source():
    arr = np.arange(200_000, dtype=np.int64)
    segs = snapshot(dumps(arr))
    arr[:] = -1
    out = loads(segs)
    assert np.array_equal(out, np.arange(200_000, dtype=np.int64))


# -- unpicklable values ------------------------------------------------------------------------
class Holder:
    def __init__(self):
        self.name = "holder"
        self.guard_mutex = threading.Lock()


class Outer:
    def __init__(self):
        self.count = 3
        self.inner_part = Holder()


def test_unpicklable_attribute_raises_serialization_error_naming_it():
    with pytest.raises(SerializationError) as ei:
        dumps(Holder())
    msg = str(ei.value)
    assert "guard_mutex" in msg
    assert "lock" in msg.lower()
    assert isinstance(ei.value, TypeError)


def test_unpicklable_nested_attribute_path():
    with pytest.raises(SerializationError) as ei:
        dumps(Outer())
    msg = str(ei.value)
    assert "inner_part" in msg
    assert "guard_mutex" in msg
    assert "count" not in msg


def test_unpicklable_inside_containers_names_the_position():
    value = {"params": [1, 2, threading.Lock()], "ok": 5}
    with pytest.raises(SerializationError) as ei:
        dumps(value)
    msg = str(ei.value)
    assert "params" in msg
    assert "[2]" in msg


def test_unpicklable_closure_raises_serialization_error():
    lock = threading.Lock()

    def uses_lock():
        with lock:
            return 1

    with pytest.raises(SerializationError):
        dumps(uses_lock)


def test_generator_raises_serialization_error():
    with pytest.raises(SerializationError):
        dumps(x for x in range(3))


# -- code shipping -----------------------------------------------------------------------------
@pytest.fixture
def vanishing_module():
    """A module importable while pickling, gone (as on a worker without it) when loading."""
    name = "ddlf_test_vanishing_mod_7f3a"
    mod = types.ModuleType(name)
    exec(
        "class Payload:\n"
        "    def __init__(self, v):\n"
        "        self.v = v\n"
        "def helper(x):\n"
        "    return x + 1\n",
        mod.__dict__,
    )
    sys.modules[name] = mod
    try:
        yield name, mod
    finally:
        sys.modules.pop(name, None)


def test_missing_module_raises_code_shipping_error(vanishing_module):
    name, mod = vanishing_module
    segs = [bytes(s) for s in dumps(mod.Payload(5))]
    # Sanity: it was pickled by reference, so it loads while the module exists.
    assert loads(segs).v == 5
    del sys.modules[name]
    with pytest.raises(CodeShippingError) as ei:
        loads(segs)
    msg = str(ei.value)
    assert name in msg
    assert "register_pickle_by_value" in msg


def test_missing_module_for_a_function(vanishing_module):
    name, mod = vanishing_module
    segs = [bytes(s) for s in dumps({"fn": mod.helper, "arr": np.zeros(100_000)})]
    del sys.modules[name]
    with pytest.raises(CodeShippingError) as ei:
        loads(segs)
    assert name in str(ei.value)


def test_missing_submodule_names_top_level_package_for_by_value():
    # A hand-made protocol-2 pickle of `pkgmissing_9c1.sub.Thing` (no module needed to make it).
    payload = pickle.dumps(0, protocol=2)[:2] + b"cpkgmissing_9c1.sub\nThing\nq\x00."
    with pytest.raises(CodeShippingError) as ei:
        loads([payload])
    msg = str(ei.value)
    assert "pkgmissing_9c1" in msg
    assert "register_pickle_by_value" in msg
    assert "register_pickle_by_value(pkgmissing_9c1)" in msg


def test_other_load_errors_are_not_code_shipping_errors():
    with pytest.raises(Exception) as ei:
        loads([b"not a pickle"])
    assert not isinstance(ei.value, CodeShippingError)


def test_a_payload_collected_in_a_cycle_leaves_no_ignored_buffer_error(monkeypatch):
    """Issue 31: on Python 3.13 the suite printed ``BufferError: Existing exports of data``
    as ignored exceptions. dumps() returned a getbuffer() view of its BytesIO; when the
    garbage collector took the two in one cycle, the BytesIO's finalizer tried to close it
    while the view still exported its buffer. Here a payload (code, so the cloudpickle path)
    sits in a cycle and is collected; nothing may be reported as ignored."""
    import gc

    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)

    class Holder:
        pass

    for _ in range(3):
        h = Holder()
        h.me = h
        h.segments = dumps(lambda x: x + 1)
        assert loads(h.segments)(1) == 2
        del h
        gc.collect()
    assert not [u for u in ignored if isinstance(u.exc_value, BufferError)], \
        [f"{type(u.exc_value).__name__}: {u.exc_value}" for u in ignored]
