"""``ddlf-train run`` on text and ``ddlf-train generate`` end to end (issue 32), and one
run on the real corpus, Debian's fortunes, when this machine has it.

Each run is the real command in a subprocess with its own embedded cluster. The text is
generated under tmp_path; the GPT is ``gpt-tiny`` (0.84 M parameters) on windows of 32
bytes, one or two epochs of ~20 KB: a few seconds of training.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
from helpers_modules.clusters import no_leaked_processes  # noqa: E402

from ddlf_actors.apps.datasets import corpora  # noqa: E402

WORDS = "the a cat dog sat ran on under mat tree and then slept".split()


def _ddlf_train(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "ddlf_actors.apps.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    for i in range(2):
        lines = [" ".join(rng.choice(WORDS, rng.integers(3, 8))) + "." for _ in range(350)]
        (directory / f"part{i}.txt").write_text("\n".join(lines) + "\n")
    return directory


def test_run_on_text_writes_model_tokenizer_settings_history_and_a_sample(corpus, tmp_path):
    out = tmp_path / "out"
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", f"text:{corpus}/*.txt", "--model", "gpt-tiny",
                           "--framework", "torch", "--workers", "2", "--master-epochs", "2",
                           "--context", "32", "--out", str(out), "--sample-prompt", "the cat",
                           "--sample-tokens", "40")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tokens/s" in proc.stderr                  # the progress bar
    assert "val loss" in proc.stdout and "bits/B" in proc.stdout
    assert "sample (40 tokens at most" in proc.stdout and "\nthe cat" in proc.stdout
    for name in ("model.pt", "tokenizer.json", "lm.json", "history.csv", "history.json",
                 "training.png"):
        assert (out / name).is_file(), name
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"tokens", "tokens_per_s", "bits_per_byte", "perplexity"} <= set(rows[0])
    assert len(rows) == 2 and float(rows[-1]["bits_per_byte"]) < 8.0
    settings = json.loads((out / "lm.json").read_text())
    assert settings["model"]["framework"] == "torch" and settings["model"]["context"] == 32
    assert settings["model"]["total_steps"] > 0 and settings["dataset"]["tokenizer"] == "byte"

    gen = _ddlf_train("generate", "--run", str(out), "--prompt", "the dog", "-n", "30",
                      "--seed", "2")
    assert gen.returncode == 0, gen.stderr[-2000:]
    again = _ddlf_train("generate", "--run", str(out), "--prompt", "the dog", "-n", "30",
                        "--seed", "2")
    assert gen.stdout.startswith("the dog") and gen.stdout == again.stdout


def test_keras_run_and_its_generate(corpus, tmp_path):
    pytest.importorskip("keras")
    out = tmp_path / "out"
    proc = _ddlf_train("run", "--dataset", f"text:{corpus}/part0.txt", "--framework", "keras",
                       "--workers", "1", "--master-epochs", "1", "--context", "32",
                       "--out", str(out), "--sample-tokens", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "model.keras").is_file() and "(Keras)" in proc.stdout
    gen = _ddlf_train("generate", "--run", str(out), "--prompt", "a", "-n", "10")
    assert gen.returncode == 0 and gen.stdout.startswith("a"), gen.stderr[-2000:]


@pytest.mark.parametrize("args,message", [
    (["--model", "gpt-tiny"], "--model gpt-tiny trains on text"),
    (["--dataset", "fortunes", "--model", "paper-cnn"], "paper-cnn classifies images"),
    (["--dataset", "fortunes", "--limit", "10"], "--limit applies to image datasets"),
    (["--dataset", "fortunes", "--tokenizer", "words"], "--tokenizer words: tokenizer"),
    (["--dataset", "fortunes", "--context", "0"], "--context must be >= 1"),
    (["--dataset", "fortunes", "--target-loss", "-1"], "--target-loss"),
])
def test_bad_text_arguments_are_one_line_before_anything_starts(args, message, tmp_path):
    proc = _ddlf_train("run", *args, "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


def test_an_empty_file_fails_with_its_name_and_nothing_is_written(tmp_path, corpus):
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "out"
    with no_leaked_processes():
        proc = _ddlf_train("run", "--dataset", f"text:{tmp_path}/*.txt", "--out", str(out),
                           timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{tmp_path}/empty.txt is empty" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "history.csv").exists()


def test_a_context_longer_than_the_validation_split_fails_clearly(tmp_path, corpus):
    proc = _ddlf_train("run", "--dataset", f"text:{corpus}/part0.txt", "--context", "4096",
                       "--out", str(tmp_path / "o"), timeout=300)
    assert proc.returncode == 2
    assert "fewer than context + 1 = 4097" in proc.stderr and "Traceback" not in proc.stderr


def test_generate_from_a_folder_that_is_no_text_run(tmp_path):
    proc = _ddlf_train("generate", "--run", str(tmp_path), timeout=120)
    assert proc.returncode == 2 and "lm.json: no such file" in proc.stderr


def _real_fortunes() -> str | None:
    """The fortunes corpus on this machine, without fetching it; None if absent."""
    try:
        return os.path.dirname(corpora.CorpusSource("fortunes").resolve(download=False)[0])
    except FileNotFoundError:
        return None


@pytest.mark.skipif(_real_fortunes() is None,
                    reason="Debian's fortunes corpus is not on this machine (apt-get install "
                           "fortunes, as .ci/run does)")
def test_a_gpt_learns_on_the_real_fortunes_corpus(tmp_path):
    # The whole corpus, every 32nd window of 64 bytes (stride 2048): ~1,100 windows an
    # epoch, so the real data path (lookup, cookies, cache, splits) runs in seconds.
    from ddlf_actors.apps import datasets, lm, train

    ds = datasets.corpus("fortunes", context=64, stride=2048)
    fn = lm.GptModelFn(ds, framework="torch", layers=2, heads=2, dim=64, learning_rate=3e-3,
                       total_steps=80)
    result = train(fn, ds, workers=2, master_epochs=4, progress=False)
    rows = [r for r in result.history if r["test_loss"] is not None]
    assert ds.info["bytes"]["train"] > 2_000_000           # the whole corpus is there
    assert rows[0]["bits_per_byte"] > rows[-1]["bits_per_byte"]
    assert rows[-1]["bits_per_byte"] < 5.5     # from 8 bits a byte (4.8 measured after 4)
    sample = result.generate("The ", 60)
    assert sample.startswith("The ") and len(sample) > 4
