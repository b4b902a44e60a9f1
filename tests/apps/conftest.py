"""Fixtures for the training tests: a private dataset cache and one cluster per module."""

from __future__ import annotations

import os

import pytest
from helpers_modules.clusters import start_cluster


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Trainers cache datasets here, not in ~/.cache (workers inherit the environment)."""
    path = str(tmp_path_factory.mktemp("ddlf-cache"))
    old = os.environ.get("DDLF_CACHE_DIR")
    os.environ["DDLF_CACHE_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("DDLF_CACHE_DIR", None)
    else:
        os.environ["DDLF_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def train_cluster(private_cache):
    """An embedded 2-CPU cluster shared by a module's training tests."""
    with start_cluster(num_cpus=2) as info:
        yield info


@pytest.fixture(params=["numpy", "torch"])
def framework(request):
    """The framework a training test runs on: a ``Kit`` (helpers_modules/torch_trainer.py)
    for the numpy softmax model or a small PyTorch module. Tests are written once and
    parametrized, not copied; the torch kit skips where torch is not installed (CI
    installs it and checks that it imports)."""
    from helpers_modules.torch_trainer import KITS

    if request.param == "torch":
        pytest.importorskip("torch")
    return KITS[request.param]


_TRAINER_ENV = ("CUDA_VISIBLE_DEVICES", "KERAS_BACKEND", "XLA_FLAGS", "OMP_WAIT_POLICY")


@pytest.fixture(autouse=True)
def _trainer_environment_restored():
    """Trainers on the in-process fake backend set what a trainer's own process would
    (GPUs hidden, Keras' backend, thread settings): undo it for the tests after."""
    saved = {k: os.environ.get(k) for k in _TRAINER_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
