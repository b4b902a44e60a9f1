"""PyTorch trainers in a process where TensorFlow came first (apps/frameworks/torch_imports.py).

With PyPI's CUDA build of torch (it brings triton) and TensorFlow 2.20 or 2.21 from PyPI,
a torch optimizer built after ``import tensorflow`` crashed the process (SIGSEGV while
``libtriton.so`` loaded): four pytest-xdist workers died this way in the README's test
command. Each test runs in a fresh interpreter, so that TensorFlow is loaded first and a
crash is a failed test, not a dead test process. Where triton is not installed (this
machine's ``+cpu`` torch for Python 3.11) the first test still checks several trainers'
optimizers built on threads at once; CI runs it on 3.10 with the CUDA build too.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

_WHERE = {"tensorflow": "the train extra brings it", "torch": "the torch extra brings it",
          "triton": "PyPI's CUDA build of torch brings it, a +cpu build does not"}


def _needs(*modules: str) -> None:
    for name in modules:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed ({_WHERE[name]})")


def _run(code: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, (
        f"exit code {out.returncode} (-11: SIGSEGV)\n--- stdout\n{out.stdout[-3000:]}"
        f"\n--- stderr\n{out.stderr[-6000:]}")
    return out


def test_torch_optimizers_on_threads_after_tensorflow():
    """Four threads build PyTorch adapters (each its model's first optimizer) at the same
    moment, after TensorFlow was imported, as in-process trainers do after a Keras one."""
    _needs("tensorflow", "torch")
    out = _run("""
        import importlib.util, sys, threading

        from ddlf_actors.apps import tf_startup
        tf_startup.import_tensorflow()      # first, as a Keras trainer in this process would

        import torch
        from ddlf_actors.apps.frameworks.torch import TorchAdapter

        n = 4
        barrier = threading.Barrier(n)
        built, errors = [], []

        def build(i):
            model = torch.nn.Linear(8, 2)
            barrier.wait()
            try:
                adapter = TorchAdapter(model, {"optimizer": lambda p: torch.optim.SGD(p, lr=0.1)})
                built.append(type(adapter.optimizer).__name__)
            except BaseException as e:
                errors.append(repr(e))

        threads = [threading.Thread(target=build, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        triton = importlib.util.find_spec("triton") is not None
        if triton:   # loaded through torch._dynamo, and its LLVM works
            from triton._C.libtriton import ir
            ir.load_dialects(ir.context())
        print("built", sorted(built), "triton", triton and "triton" in sys.modules)
    """)
    assert "built ['SGD', 'SGD', 'SGD', 'SGD']" in out.stdout, out.stdout


def test_import_triton_after_tensorflow_in_a_trainer_process():
    """What a trainer installs before its model_fn makes any later ``import triton`` safe,
    whoever imports it (Keras on torch, torch.compile), and triton works after it."""
    _needs("tensorflow", "triton")
    out = _run("""
        from ddlf_actors.apps import tf_startup
        from ddlf_actors.apps.frameworks import torch_imports

        tf_startup.import_tensorflow()
        torch_imports.install()             # what TrainerActor.__init__ does
        import triton
        from triton._C.libtriton import ir

        context = ir.context()
        ir.load_dialects(context)
        print("llvm global", torch_imports.llvm_is_global(), "triton", triton.__version__)
    """)
    assert "triton" in out.stdout
