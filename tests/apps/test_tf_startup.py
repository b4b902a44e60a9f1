"""TensorFlow's start-up lines kept off stderr (apps/tf_startup.py).

The fd-level mechanics are tested with a stand-in ``tensorflow`` package that writes to
fd 2 the way TF's C++ code does; one test imports the real TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ddlf_actors.apps import tf_startup
from ddlf_actors.apps.tf_startup import filter_startup_lines, gpu_note, split_cuda_failure

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = (b"I0000 00:00:1795547173.250856   12738 port.cc:153] oneDNN custom operations are "
          b"on. You may see slightly different numerical results.\n")
GUARD = (b"I0000 00:00:1795547173.718730   12601 cpu_feature_guard.cc:227] This TensorFlow "
         b"binary is optimized to use available CPU instructions.\n"
         b"To enable the following instructions: AVX2 FMA, in other operations, rebuild.\n")
WARN = b"W0000 00:00:1795547173.300000   12738 computation_placer.cc:177] already registered.\n"
ERROR = b"E0000 00:00:1795547173.400000   12738 cuda_dnn.cc:8579] Unable to register cuDNN.\n"
OLD_STYLE = b"2025-09-17 14:44:05.157831: I external/xla/tsl/cuda/cudart_stub.cc:32] No GPU.\n"
MINE = b"a line of my own\n"
# What a GPU build of TF 2.21 (the `tensorflow` package) logged on this GPU-less machine,
# beside torch 2.14.1's CUDA wheels, in every trainer and in the driver.
CUINIT = (b"E0000 00:00:1795734627.465977   22432 cuda_platform.cc:52] failed call to cuInit: "
          b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n")
CUINIT_OLD = (b"2020-10-08 23:28:14.726991: E tensorflow/stream_executor/cuda/cuda_driver.cc:313]"
              b" failed call to cuInit: UNKNOWN ERROR (303)\n")


def test_level_2_keeps_errors_and_other_output_only():
    data = BANNER + ONEDNN + MINE + WARN + OLD_STYLE + ERROR + BANNER + ONEDNN
    assert filter_startup_lines(data, 2) == MINE + ERROR


def test_level_1_keeps_warnings_and_level_0_keeps_everything():
    data = BANNER + ONEDNN + WARN + MINE
    assert filter_startup_lines(data, 1) == WARN + MINE
    assert filter_startup_lines(data, 0) == data


def test_only_log_lines_go_never_the_lines_after_them():
    # A line written right after a dropped one (another thread's, or a multi-line
    # message's tail) is kept: it cannot be told apart, and losing output is worse.
    tail = GUARD.split(b"\n", 1)[1]
    assert filter_startup_lines(GUARD + MINE, 1) == tail + MINE


_FAKE_TF = '''
import os
import types
os.write(2, {noise!r})
os.write(2, b"printed by the import itself\\n")
if os.environ.get("FAKE_TF_FAILS"):
    raise ImportError("libtensorflow_framework.so.2: cannot open shared object file")


def _list_physical_devices(device_type=None):
    # A GPU build without a CUDA driver logs this when it first sets up its devices.
    if os.environ.get("FAKE_TF_CUINIT"):
        os.write(2, {cuinit!r})
    return ["CPU:0"]


config = types.SimpleNamespace(list_physical_devices=_list_physical_devices)
'''


def _run_with_fake_tf(tmp_path, env_extra: dict):
    pkg = tmp_path / "tensorflow"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(_FAKE_TF.format(noise=BANNER + ONEDNN + ERROR,
                                                     cuinit=CUINIT))
    code = textwrap.dedent("""
        import sys
        print("before", file=sys.stderr)
        from ddlf_actors.apps import tf_startup
        tf_startup.import_tensorflow()
        print("after", file=sys.stderr)
        print(tf_startup.cuda_failure())
    """)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{_REPO}", **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, env=env,
                          timeout=60)


def test_the_import_writes_only_what_is_not_noise(tmp_path):
    proc = _run_with_fake_tf(tmp_path, {})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b"before\n" + ERROR + b"printed by the import itself\nafter\n"


def test_level_0_shows_everything_as_tf_prints_it(tmp_path):
    proc = _run_with_fake_tf(tmp_path, {"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (b"before\n" + BANNER + ONEDNN + ERROR
                           + b"printed by the import itself\nafter\n")


def test_a_failed_import_shows_all_it_printed_then_raises(tmp_path):
    proc = _run_with_fake_tf(tmp_path, {"FAKE_TF_FAILS": "1"})
    assert proc.returncode == 1
    err = proc.stderr
    assert BANNER + ONEDNN + ERROR + b"printed by the import itself\n" in err
    assert b"ImportError: libtensorflow_framework.so.2" in err and b"after" not in err


def test_the_real_tensorflow_imports_silently():
    pytest.importorskip("tensorflow")
    code = "from ddlf_actors.apps import tf_startup\ntf_startup.import_tensorflow()\n"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = _REPO
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


# -- a GPU build of TF without a CUDA driver (issue 24: both installed, no GPU) ---------------


def test_the_cuinit_failure_is_taken_out_with_its_reason():
    data = MINE + CUINIT + ERROR
    assert split_cuda_failure(data) == (
        MINE + ERROR, "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
    assert split_cuda_failure(CUINIT_OLD) == (b"", "UNKNOWN ERROR (303)")


def test_only_log_lines_about_cuinit_are_taken():
    mine = b"my own line says: failed call to cuInit is harmless\n"
    assert split_cuda_failure(mine + ERROR) == (mine + ERROR, None)


def test_the_device_setup_is_quiet_and_remembered(tmp_path):
    proc = _run_with_fake_tf(tmp_path, {"FAKE_TF_CUINIT": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b"before\n" + ERROR + b"printed by the import itself\nafter\n"
    assert proc.stdout == b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"


def test_level_0_shows_the_cuinit_failure(tmp_path):
    proc = _run_with_fake_tf(tmp_path, {"FAKE_TF_CUINIT": "1", "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert proc.returncode == 0, proc.stderr
    assert CUINIT in proc.stderr and proc.stdout == b"None\n"


def test_without_a_failure_nothing_is_remembered(tmp_path):
    proc = _run_with_fake_tf(tmp_path, {})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"None\n"


def test_gpu_note_says_it_once_for_the_run():
    reason = "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
    assert gpu_note(0, [None, None]) is None
    note = gpu_note(0, [reason, reason, None])
    assert note is not None and "num_gpus=0" in note and "CPU" in note and "\n" not in note
    asked = gpu_note(1, [reason, reason])
    assert asked is not None and "num_gpus=1" in asked and reason in asked
    assert asked.count(reason) == 1   # the same reason from every trainer, said once


def test_gpus_are_hidden_only_from_trainers_that_asked_for_none(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    tf_startup.hide_gpus_unless_requested(1)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    tf_startup.hide_gpus_unless_requested(0)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")   # the node gave this trainer GPU 1
    tf_startup.hide_gpus_unless_requested(0)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
