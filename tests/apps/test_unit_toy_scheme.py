"""Adding a scheme is one file and one register line: the toy of docs/training.md,
registered and run in-process on the fake backend, with a lost trainer."""

from __future__ import annotations

import os
import sys

import pytest
from helpers_modules.numpy_trainer import NumpyTrainer, hard_blobs_dataset, softmax_model_fn

from ddlf_actors.apps import train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.schemes import registry

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "examples"))
from relay_scheme import RelayMachine  # noqa: E402


@pytest.fixture
def relay():
    registry.register("relay", RelayMachine)
    yield
    registry._SCHEMES.pop("relay")


def _run(**options):
    return train(softmax_model_fn(), hard_blobs_dataset, "relay", workers=2, master_epochs=3,
                 trainer_cls=NumpyTrainer, progress=False, seed=3, **options)


def test_the_toy_scheme_trains_and_takes_its_own_settings(relay):
    result = _run(backend=FakeBackend(), pieces=3)
    assert [r["epoch"] for r in result.history] == [1, 2, 3]
    assert [r["samples"] for r in result.history] == [600, 600, 600]   # each epoch whole
    assert all(r["updates"] == 3 for r in result.history)              # in 3 turns
    with pytest.raises(ValueError, match="pieces must be an int >= 1"):
        _run(backend=FakeBackend(), pieces=0)
    with pytest.raises(ValueError, match="alpha= does not apply to the 'relay' scheme"):
        _run(backend=FakeBackend(), alpha=0.5)


def test_the_toy_scheme_survives_a_lost_trainer(relay):
    fired = []

    def fail_when(actor, method, n):
        if not fired and method == "train" and n == 2 and actor.instance._ddlf_index == 1:
            fired.append(actor)
            return True
        return False

    result = _run(backend=FakeBackend(fail_when=fail_when))
    assert fired and [e["kind"] for e in result.events].count("trainer_lost") == 1
    assert [r["epoch"] for r in result.history] == [1, 2, 3]


def test_the_docs_show_the_toy_as_it_is():
    with open(os.path.join(_ROOT, "examples", "relay_scheme.py")) as f:
        code = f.read()
    with open(os.path.join(_ROOT, "docs", "training.md")) as f:
        docs = f.read()
    body = code[code.index("import dataclasses"):].strip()
    assert body in docs, "docs/training.md's toy scheme differs from examples/relay_scheme.py"
