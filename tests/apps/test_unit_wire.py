"""apps/weight_messages.py and schemes/wire.py without processes: messages, replicas, modes."""

from __future__ import annotations

import numpy as np
import pytest

from ddlf_actors.apps import codecs
from ddlf_actors.apps.schemes.wire import CHANGES, PLAIN, WHOLE, Wire, resolve
from ddlf_actors.apps.weight_messages import (
    CHANGE,
    SET,
    TrainerWire,
    Weights,
    apply_change,
    difference,
)

UP = codecs.get("none")


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)]


def _set(run, version, weights, codec="none"):
    return Weights(SET, run, version, None, codecs.get(codec).encode(weights), UP)


@pytest.mark.parametrize("spec,mode", [
    (None, PLAIN), ("none", PLAIN), (("none", "none"), PLAIN), (("none", "topk:0.1"), WHOLE),
    ("lz4", WHOLE), ("fp16", WHOLE), ("int8", WHOLE), ("topk:0.01", CHANGES),
    ("int8:ef", CHANGES), (("fp16:ef", "none"), CHANGES)])
def test_the_down_codec_decides_how_weights_travel(spec, mode):
    assert resolve(spec)[2] == mode


def test_a_scheme_without_a_mode_refuses_it_by_name():
    with pytest.raises(ValueError, match="'easgd' scheme: its machine sends plain arrays"):
        Wire("fp16", "easgd", (PLAIN,))
    assert Wire(None, "easgd", (PLAIN,)).plain


def test_trainer_applies_each_message_once_and_follows_changes():
    end = TrainerWire()
    w0 = _weights(0)
    got = end.receive(_set("r1", 1, w0))
    for a, b in zip(got, w0):
        np.testing.assert_array_equal(a, b)
    assert end.receive(_set("r1", 1, _weights(9))) is got   # version 1 again: no decode
    topk = codecs.get("topk:0.25")
    w1 = _weights(1)
    payload = topk.encode(difference(w1, w0))
    expected = apply_change(w0, topk.decode(payload))
    after = end.receive(Weights(CHANGE, "r1", 2, 1, payload, UP))
    for a, b in zip(after, expected):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.float32
    # A change must follow the version held here, and be of this run.
    with pytest.raises(RuntimeError, match="from version 3 to 4 of run r1.*holds version 2"):
        end.receive(Weights(CHANGE, "r1", 4, 3, payload, UP))
    with pytest.raises(RuntimeError, match="of run r2, but this trainer holds nothing"):
        end.receive(Weights(CHANGE, "r2", 3, 2, payload, UP))


def test_a_new_run_starts_a_new_delta_stream():
    end = TrainerWire()
    topk = codecs.get("topk:0.25")
    end.receive(_set("r1", 1, _weights()))
    end.encode(_weights(3), topk)
    assert end.residual(topk) is not None
    end.receive(_set("r2", 1, _weights()))
    assert end.residual(topk) is None


def test_a_saved_residual_continues_the_stream_and_must_fit():
    topk = codecs.get("topk:0.25")
    a, b = TrainerWire(), TrainerWire()
    a.receive(_set("r1", 1, _weights()))
    a.encode(_weights(3), topk)
    saved = a.residual(topk)
    b.load_residual("r1", topk, saved, _weights())
    b.receive(_set("r1", 5, _weights()))          # the resumed run's first message
    pa, _ = a.encode(_weights(4), topk)
    pb, _ = b.encode(_weights(4), topk)
    for x, y in zip(topk.decode(pa), topk.decode(pb)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="does not fit"):
        TrainerWire().load_residual("r1", topk, saved[:1], _weights())
