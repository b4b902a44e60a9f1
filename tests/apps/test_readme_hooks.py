"""The README's way to train another framework, as a contract.

The README: subclass ``TrainerActor``, override its required hooks (``fit``,
``get_weights``, ``set_weights``, ``evaluate_arrays``) and, where needed, some optional
ones, and pass ``trainer_cls=``. ``helpers_modules/readme_trainer.ReadmeTrainer`` is that
subclass with a numpy model in attributes and no framework adapter (``build_model``
returns None): unlike ``NumpyTrainer`` (which trains through ``NumpyAdapter``), every
hook it leaves out must do what a model without that feature needs.

It runs through every registered scheme, a lost trainer, checkpoint and resume
(bit-equal), a lossless and a lossy codec and ``overlap=True`` on the in-process fake
backend (each run well under a second) and, for a trainer killed from outside and a
resume, on a real cluster. ``backend="ray"`` is in ``test_ray_backend.py``
(``test_the_readmes_subclass_trains_on_ray``), next to that module's Ray instance.
"""

from __future__ import annotations

import os
import re
import shutil
import signal

import numpy as np
import pytest
from helpers_modules.numpy_trainer import hard_blobs_dataset
from helpers_modules.readme_trainer import ReadmeTrainer, RecordsPid, readme_model_fn

from ddlf_actors.apps import Callback, TrainerActor, checkpoint, train
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.apps.frameworks import UnknownFrameworkError
from ddlf_actors.apps.options import ConfigError
from ddlf_actors.apps.schemes import registry

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = dict(workers=2, master_epochs=3, seed=7, progress=False)
MODEL = readme_model_fn()


def _train(scheme="sync", backend=None, model_fn=MODEL, **options):
    return train(model_fn, hard_blobs_dataset, scheme, trainer_cls=ReadmeTrainer,
                 backend=backend if backend is not None else FakeBackend(),
                 **{**RUN, **options})


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# -- the documents and the class say the same ----------------------------------------------------
def _hooks(text: str) -> tuple[set, set]:
    """``(required, optional)``: the hooks a passage names after "Required hooks:" (up to
    the sentence's end) and after "Optional hooks" (the rest); a hook is a backticked name
    of a ``TrainerActor`` method."""
    def names(part):
        return {n for n in re.findall(r"`([A-Za-z_]+)`", part)
                if callable(getattr(TrainerActor, n, None))}
    start = text.index("Required hooks:")
    end = text.index(".", start)
    optional = text.index("Optional hooks", end)
    return names(text[start:end]), names(text[optional:])


def _readme_passage() -> str:
    with open(os.path.join(_REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("- Another framework:")
    return text[start:text.index("\n- ", start + 1)]


def _guide_passage() -> str:
    with open(os.path.join(_REPO, "docs", "training-guide.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("- **Another framework:**")
    return text[start:text.index("\n- **", start + 1)]


def _training_md_passage() -> str:
    with open(os.path.join(_REPO, "docs", "training.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("### Another framework: a TrainerActor subclass")
    return text[start:text.index("\n## ", start)]


def test_the_readme_docs_and_docstring_list_the_same_hooks():
    readme = _hooks(_readme_passage())
    assert readme[0] == {"fit", "get_weights", "set_weights", "evaluate_arrays"}
    assert {"get_learning_rate", "get_optimizer_state", "buffer_mask"} <= readme[1]
    assert _hooks(_training_md_passage()) == readme
    assert _hooks(_guide_passage()) == readme
    assert _hooks(TrainerActor.__doc__ or "") == readme
    # Each hook named is one the trainer really calls (a typo would name none).
    assert all(callable(getattr(TrainerActor, n)) for n in readme[0] | readme[1])


def test_the_readme_trainer_overrides_the_readmes_hooks_and_nothing_else():
    required, optional = _hooks(_readme_passage())
    overridden = {n for n, v in vars(ReadmeTrainer).items()
                  if callable(v) and not n.startswith("_")}
    assert required <= overridden and overridden <= required | optional, overridden
    # None of the hooks whose absence this contract is about.
    assert not overridden & {"get_learning_rate", "set_learning_rate", "get_optimizer_state",
                             "set_optimizer_state", "buffer_mask", "local_model", "describe",
                             "train"}


# -- every scheme, codecs, overlap (in process) -----------------------------------------------
@pytest.mark.parametrize("scheme", registry.names())
def test_every_scheme_trains_the_readme_subclass(scheme):
    result = _train(scheme)
    assert result.framework is None            # no adapter held the model
    assert [r["epoch"] for r in result.history][-1] == 3
    assert result.history[-1]["test_accuracy"] > 0.6   # chance is 0.25


def _unseeded_arrays():
    """README's model function, drawing its kernel from NumPy's global generator."""
    return [np.random.normal(0, 0.01, (64, 4)).astype(np.float32), np.zeros(4, np.float32)]


@pytest.mark.parametrize("scheme", ["allreduce", "dataparallel"])
def test_the_ring_start_sends_no_weights_to_readme_trainers_that_built_them(scheme):
    # The trainers build from the run's seed (schemes/initial_weights.py), so the start
    # sends the README subclass nothing: round 1 carries one copy more than round 2 (the
    # driver fetching trainer 0's weights), not one per trainer more. Resume and the
    # codecs, which are sent the weights, are the tests around this one.
    result = _train(scheme, model_fn=_unseeded_arrays, workers=3, rounds_per_epoch=1)
    rows = result.history
    assert rows[-1]["test_accuracy"] > 0.6
    copy = (64 * 4 + 4) * 4
    first, second = (r["bytes_sent"] + r["bytes_received"] for r in rows[:2])
    assert first - second == copy


@pytest.mark.parametrize("scheme", registry.names())
@pytest.mark.parametrize("compression", ["zstd", "int8:ef"])
def test_a_lossless_and_a_lossy_codec(scheme, compression):
    if compression == "int8:ef" and scheme == "dataparallel":
        compression = "int8"     # per-step gradients: a codec without error feedback
    elif compression == "int8:ef" and scheme not in ("sync", "allreduce"):
        # Trainers holding different versions take whole weights down (wire.py says so).
        compression = ("fp16", "int8:ef")
    result = _train(scheme, compression=compression)
    assert result.history[-1]["test_accuracy"] > 0.6
    if compression == "zstd" and scheme in ("sync", "allreduce"):
        # Lossless: bit for bit the run without a codec (these schemes are deterministic).
        _same(result.weights, _train(scheme).weights)


@pytest.mark.parametrize("scheme", ["sync", "allreduce"])
def test_overlap(scheme):
    result = _train(scheme, overlap=True, rounds_per_epoch=3)
    assert [r["round"] for r in result.history] == list(range(1, 10))
    assert result.history[-1]["test_accuracy"] > 0.6


# -- what a model without a learning rate, optimizer state or a framework gets -----------------
def _calls_seen(seen: list):
    def fail_when(actor, method, n):
        seen.append(method)
        return False
    return fail_when


@pytest.mark.parametrize("scheme,option,named", [
    ("sync", {"lr_schedule": lambda step: 0.1}, "lr_schedule="),
    ("sync", {"lr_scaling": "inner"}, "lr_scaling='inner'"),
    ("allreduce", {"lr_scaling": "sqrt"}, "lr_scaling='sqrt'"),
    ("allreduce", {"lr_schedule": lambda step: 0.1}, "lr_schedule="),
    ("async", {"lr_schedule": lambda step: 0.1}, "lr_schedule="),
    ("downpour", {"lr_schedule": lambda step: 0.1}, "lr_schedule="),
])
def test_a_rate_setting_is_refused_by_name_before_any_training(scheme, option, named):
    seen: list = []
    with pytest.raises(ConfigError, match=re.escape(named)) as err:
        _train(scheme, backend=FakeBackend(fail_when=_calls_seen(seen)), **option)
    assert "get_learning_rate" in str(err.value)      # how to fix it
    assert "describe" in seen and set(seen) <= {"__init__", "describe", "get_weights"}, seen


def test_auto_leaves_the_rate_of_a_trainer_without_one_alone():
    # From K = 4 auto scales the trainers' rate by sqrt(K), but only where they report
    # one: a trainer with the README's hooks and no get_learning_rate still trains.
    result = _train("auto", workers=4, rounds_per_epoch=2)
    assert result.settings["options"]["lr_scaling"] == "none"
    assert "sqrt" not in result.settings["auto"]["line"]
    assert result.history[-1]["test_accuracy"] > 0.6


def test_lr_scaling_outer_needs_no_trainer_rate():
    result = _train("sync", lr_scaling="outer", rounds_per_epoch=2)
    assert result.history[-1]["test_accuracy"] > 0.6


def test_result_model_names_the_weights_instead():
    result = _train("sync", master_epochs=1)
    with pytest.raises(UnknownFrameworkError, match="result.weights"):
        result.model  # noqa: B018
    assert len(result.weights) == 2


def test_a_lost_trainer_is_replaced_in_process():
    from helpers_modules.fake_faults import dies

    result = _train("sync", rounds_per_epoch=3, min_workers=2,
                    backend=FakeBackend(fail_when=dies(1, "train", 2)))
    assert len(_kinds(result, "trainer_lost")) == 1
    assert _kinds(result, "trainer_joined")[0]["trainer"] == 1
    assert [r["round"] for r in result.history] == list(range(1, 10))
    assert result.history[-1]["workers"] == 2 and result.history[-1]["test_accuracy"] > 0.6


@pytest.mark.parametrize("scheme,extra", [("sync", {}), ("allreduce", {}),
                                          ("sync", {"compression": "int8:ef"}),
                                          ("sync", {"overlap": True})])
def test_resume_from_a_middle_checkpoint_is_bit_equal(scheme, extra, tmp_path):
    full = _train(scheme, rounds_per_epoch=2, checkpoint_dir=str(tmp_path / "a"),
                  keep_checkpoints=10, **extra)
    names = checkpoint.list_checkpoints(str(tmp_path / "a"))
    assert len(names) == 6
    assert not checkpoint.load(str(tmp_path / "a")).optimizer_states   # it has none
    middle = tmp_path / "b"
    middle.mkdir()
    shutil.copy(names[2], middle)   # after round 3
    resumed = _train(scheme, rounds_per_epoch=2, resume=str(middle), **extra)
    _same(full.weights, resumed.weights)
    assert [r["round"] for r in resumed.history] == list(range(1, 7))
    said = [e["detail"] for e in resumed.events if "no optimizer state" in e["detail"]]
    assert len(said) == 1 and _kinds(resumed, "resumed")[0]["detail"] == said[0]


# -- on a real cluster ---------------------------------------------------------------------------
class _KillOneTrainer(Callback):
    """After the first row, SIGKILL one trainer's process (from outside, as ``kill -9``
    would), found by the pid its model_fn recorded."""

    def __init__(self, pid_dir):
        self.pid_dir = pid_dir
        self.killed = None

    def on_row(self, row, run):
        if self.killed is not None:
            return
        pids = sorted(int(p.split("-")[1]) for p in os.listdir(self.pid_dir))
        self.killed = pids[-1]
        os.kill(self.killed, signal.SIGKILL)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scheme", ["sync", "auto"])   # auto: train()'s default, the ring
def test_a_trainer_killed_from_outside_is_replaced_on_a_cluster(train_cluster, tmp_path,
                                                                scheme):
    killer = _KillOneTrainer(str(tmp_path))
    result = train(RecordsPid(MODEL, str(tmp_path)), hard_blobs_dataset, scheme,
                   trainer_cls=ReadmeTrainer, rounds_per_epoch=2, min_workers=2,
                   callbacks=[killer], **RUN)
    assert killer.killed is not None
    assert result.settings["scheme"] == ("allreduce" if scheme == "auto" else "sync")
    assert len(_kinds(result, "trainer_lost")) == 1
    assert len(_kinds(result, "trainer_joined")) == 1
    assert len(os.listdir(tmp_path)) == 3          # two trainers, one replacement
    assert [r["round"] for r in result.history] == list(range(1, 7))
    assert result.history[-1]["workers"] == 2 and result.history[-1]["test_accuracy"] > 0.6


@pytest.mark.timeout(300)
def test_checkpoint_and_resume_is_bit_equal_on_a_cluster(train_cluster, tmp_path):
    run = dict(RUN, rounds_per_epoch=2)
    two = train(MODEL, hard_blobs_dataset, "sync", trainer_cls=ReadmeTrainer,
                checkpoint_dir=str(tmp_path), **{**run, "master_epochs": 2})
    assert two.checkpoint is not None
    resumed = train(MODEL, hard_blobs_dataset, "sync", trainer_cls=ReadmeTrainer,
                    resume=str(tmp_path), **run)
    whole = train(MODEL, hard_blobs_dataset, "sync", trainer_cls=ReadmeTrainer, **run)
    _same(whole.weights, resumed.weights)
    assert [r["round"] for r in resumed.history] == list(range(1, 7))
    assert "no optimizer state" in _kinds(resumed, "resumed")[0]["detail"]



class RequiredHooksOnly(ReadmeTrainer):
    """The README's subclass without its optional gradient hooks."""

    compute_gradients = TrainerActor.compute_gradients
    apply_gradients = TrainerActor.apply_gradients


def test_auto_weighs_the_batch_of_the_readme_subclass_from_its_gradients():
    # auto's batch rule measures the gradient noise scale through compute_gradients: the
    # README's subclass has it, so the rule decides, and says from what.
    result = _train("auto", rounds_per_epoch=2, batch_size=16)
    probe = result.settings["auto"]["probe"]
    assert probe["noise"]["n"] >= 4 and probe["split_step_s"] > 0
    assert "gradient noise scale" in result.settings["auto"]["line"]
    assert result.config.batch_size == (result.settings["auto"]["batch_size"] or 16)
    assert result.history[-1]["test_accuracy"] > 0.6


def test_auto_keeps_the_batch_of_a_trainer_without_gradients_and_says_why():
    # Without compute_gradients there is no noise scale: each trainer keeps the batch.
    result = train(MODEL, hard_blobs_dataset, "auto", trainer_cls=RequiredHooksOnly,
                   backend=FakeBackend(), rounds_per_epoch=2, batch_size=16, **RUN)
    line = result.settings["auto"]["line"]
    assert result.settings["auto"]["batch_size"] is None and result.config.batch_size == 16
    assert "each trainer steps on the batch of 16 (no noise scale: " in line
    assert "compute_gradients" in line
    assert result.history[-1]["test_accuracy"] > 0.6
