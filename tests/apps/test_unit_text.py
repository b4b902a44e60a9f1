"""Text datasets (issue 32): tokenizers, the fortunes corpus's lookup and fetch, the token
cache, windows by offset, bad input, and the text metrics of history rows.

No cluster, no TensorFlow, no torch, no network: text is generated under tmp_path; the
apt boundary (``corpora._apt_fetch_corpus``) and the system directory are replaced. The
BPE tests need Hugging Face's ``tokenizers`` (the ``text`` extra) and skip without it.
"""

from __future__ import annotations

import math
import os
import pickle

import numpy as np
import pytest

from ddlf_actors.apps import datasets
from ddlf_actors.apps.callbacks import EarlyStopping
from ddlf_actors.apps.datasets import (
    DatasetFormatError,
    DatasetNotFoundError,
    cache,
    corpora,
    registry,
)
from ddlf_actors.apps.datasets import text_dataset as textmod
from ddlf_actors.apps.datasets import tokenizer as tk
from ddlf_actors.apps.lm import schedule, steps_per_trainer
from ddlf_actors.apps.lm.metrics import TextMetrics

WORDS = "the a cat dog sat ran on under mat tree and then slept".split()


def write_corpus(directory, files=3, words=600, seed=0) -> list:
    """``files`` UTF-8 text files of sentences over a small vocabulary (and one é)."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i in range(files):
        sentences = [" ".join(rng.choice(WORDS, rng.integers(3, 9))).capitalize() + "."
                     for _ in range(words // 6)]
        path = os.path.join(directory, f"doc{i}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(sentences) + "\nCafé.\n")
        paths.append(path)
    return paths


def write_fortunes(directory, extra: str = "") -> None:
    """A corpus directory as Debian's packages leave it: cookie files, .dat indexes, .u8
    links."""
    os.makedirs(directory, exist_ok=True)
    cookies = {name: [f"{name} cookie {i}: " + " ".join(WORDS[i % 5:i % 5 + 6])
                      for i in range(40)] for name in corpora.CORPORA["fortunes"].required}
    cookies["computers"][0] = "B\bBo\bol\bld\bd words."   # a pager's overstriking
    for name, items in cookies.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write("\n%\n".join(items) + "\n%\n" + extra)
        with open(os.path.join(directory, name + ".dat"), "wb") as f:
            f.write(b"\0\0\0\2binary index")
        os.symlink(name, os.path.join(directory, name + ".u8"))


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """HOME, the cache and the system copy under tmp_path; apt disabled."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DDLF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DDLF_DATA_DIR", raising=False)
    monkeypatch.setitem(registry.SYSTEM_DIRS, "fortunes", str(tmp_path / "system" / "fortunes"))
    monkeypatch.setattr(cache, "SHM_DIR", str(tmp_path / "shm"))

    def no_apt(corpus, dest):
        raise OSError("apt disabled in tests")

    monkeypatch.setattr(corpora, "_apt_fetch_corpus", no_apt)
    return tmp_path


# --------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_is_the_utf8_bytes_and_the_separator_is_nul():
    tok = tk.make("byte")
    assert tok.vocab_size == 256 and tok.separator == 0 and tok.spec == "byte"
    ids = tok.encode_stream(b"\0Caf\xc3\xa9\0ok")
    assert ids.dtype == np.uint8 and list(ids[:2]) == [0, ord("C")]
    assert tok.decode(ids) == "\n\nCafé\n\nok"
    assert tok.decode(ids[:5]).endswith("\ufffd") or tok.decode(ids[:5]) == "\n\nCaf\ufffd"
    assert isinstance(tk.from_json(tok.to_json()), tk.ByteTokenizer)


@pytest.mark.parametrize("spec", ["bpe", "bpe:100", "word", "bpe:99999999", 7])
def test_a_bad_tokenizer_spec_is_refused_with_the_choices(spec):
    with pytest.raises(ValueError, match="byte|BPE vocabulary"):
        tk.make(spec)


def test_bpe_trains_round_trips_and_pickles_as_its_json():
    pytest.importorskip("tokenizers")
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 20
    tok = tk.make("bpe:300").trained_on(texts)
    assert tok.trained and 257 <= tok.vocab_size <= 300
    ids = tok.encode_stream(b"\0the cat sat\0on the mat")
    assert ids[0] == 0 and (ids == 0).sum() == 2 and len(ids) < len("the cat saton the mat")
    assert tok.decode(ids) == "\n\nthe cat sat\n\non the mat"
    back = pickle.loads(pickle.dumps(tok))
    assert back.to_json() == tok.to_json() and list(back.encode("the dog")) == \
        list(tok.encode("the dog"))
    assert tk.from_json(tok.to_json()).vocab_size == tok.vocab_size


def test_an_untrained_bpe_says_to_prepare_the_dataset():
    pytest.importorskip("tokenizers")
    with pytest.raises(RuntimeError, match="prepare"):
        tk.make("bpe:300").encode("x")


# --------------------------------------------------------------------------- bad files


@pytest.mark.parametrize("content,match", [
    (b"", "empty"), (b"  \n\t\n", "empty"), (b"PK\x03\x04\0\0binary", "NUL byte at offset 4"),
    (b"caf\xe9 au lait", "not UTF-8 text .*offset 3.*iconv"),
])
def test_an_empty_or_binary_file_is_refused_naming_it(tmp_path, content, match):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    good = write_corpus(tmp_path / "good", files=1)
    ds = datasets.text([good[0], str(path)], context=8)
    with pytest.raises(DatasetFormatError, match=match) as info:
        ds.prepare()
    assert str(path) in str(info.value)
    assert not os.path.isdir(tmp_path / "cache" / "arrays") or \
        not [e for e in os.listdir(tmp_path / "cache" / "arrays") if not e.startswith(".")]


def test_a_pattern_matching_nothing_or_a_directory_is_refused(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="matches no file"):
        datasets.text(str(tmp_path / "none" / "*.txt")).prepare()
    with pytest.raises(DatasetNotFoundError, match="no such file"):
        datasets.text(str(tmp_path / "missing.txt")).prepare()
    (tmp_path / "d").mkdir()
    with pytest.raises(DatasetFormatError, match="is a directory"):
        datasets.text(str(tmp_path / "d")).prepare()


# --------------------------------------------------------------------------- the stream


def test_splits_are_contiguous_ranges_cut_at_documents_and_windows_are_offsets(tmp_path):
    write_corpus(tmp_path / "c", files=4)
    ds = datasets.text(str(tmp_path / "c" / "*.txt"), context=16, split=(0.2, 0.1)).prepare()
    info = ds.info
    (x, y), (xv, yv) = datasets.load_shared(ds)
    tokens = x.tokens
    assert sum(info["tokens"].values()) == len(tokens)
    assert info["tokens"] == info["bytes"]          # the byte tokenizer: a token per byte
    # Contiguous: the splits tile the stream in order; each cut is at a document's start.
    assert (x.start, x.stop) == (0, info["tokens"]["train"]) and xv.start == x.stop
    assert tokens[xv.start] == 0 and tokens[0] == 0
    # (the cut moves to the next document start, else the next line)
    assert 0.1 < info["tokens"]["validation"] / len(tokens) < 0.3
    assert tokens[xv.stop - 1] == ord("\n")
    # Window i starts at i * stride; y is x one token on; int32 rows.
    idx = np.array([5, 0, len(x) - 1])
    xs, ys = x[idx], y[idx]
    assert xs.dtype == np.int32 and xs.shape == (3, 16)
    for row, i in zip(xs, idx):
        np.testing.assert_array_equal(row, tokens[i * 16:i * 16 + 16])
    np.testing.assert_array_equal(ys[:, :-1], xs[:, 1:])
    assert len(x) == (info["tokens"]["train"] - 17) // 16 + 1 == info["windows"]["train"]
    np.testing.assert_array_equal(xv[1:3], xv[np.array([1, 2])])
    with pytest.raises(IndexError):
        x[np.array([len(x)])]
    assert "é" in ds.tokenizer.decode(tokens[:info["tokens"]["train"]])


def test_tokens_are_stored_once_per_node_and_a_changed_file_gets_a_new_entry(tmp_path,
                                                                             monkeypatch):
    paths = write_corpus(tmp_path / "c", files=2)
    ds = datasets.text(paths, context=8).prepare()
    arrays = tmp_path / "cache" / "arrays"
    entries = [e for e in os.listdir(arrays) if not e.startswith(".")]
    assert len(entries) == 1 and entries[0].startswith("text-")
    assert np.load(arrays / entries[0] / "tokens.npy").dtype == np.uint8

    def no_rebuild(self, files):
        raise AssertionError("built again")

    with monkeypatch.context() as m:
        m.setattr(textmod.TextDataset, "_build", no_rebuild)
        (x, _), _ = datasets.load_shared(ds)            # a trainer: maps the entry
    assert isinstance(x.tokens, np.memmap) and not x.tokens.flags.writeable
    with open(paths[1], "a") as f:
        f.write("More text.\n")
    datasets.text(paths, context=8).prepare()
    again = [e for e in os.listdir(arrays) if not e.startswith(".")]
    assert len(again) == 1 and again != entries        # rebuilt; the stale entry removed


def test_a_trainer_whose_node_holds_other_text_refuses_it(tmp_path):
    paths = write_corpus(tmp_path / "c", files=2)
    ds = datasets.text(paths, context=8).prepare()
    shipped = pickle.loads(pickle.dumps(ds))           # what a trainer gets
    with open(paths[0], "w") as f:
        f.write("Something else entirely, on this node.\n" * 50)
    with pytest.raises(DatasetFormatError, match="not the driver's"):
        shipped.load_shared()


def test_a_context_longer_than_the_validation_split_is_refused(tmp_path):
    paths = write_corpus(tmp_path / "c", files=1, words=120)
    with pytest.raises(DatasetFormatError, match=r"validation split .* fewer than context \+ 1"):
        datasets.text(paths, context=400).prepare()
    datasets.text(paths, context=16).prepare()         # a short one is fine


def test_bad_options_are_refused_before_any_file_is_read(tmp_path):
    for kw in ({"context": 0}, {"stride": 0}, {"split": (0, 0.1)}, {"split": (0.6, 0.5)},
               {"eval_split": "train"}):
        with pytest.raises(ValueError):
            datasets.text(str(tmp_path / "nothing.txt"), **kw)


def test_a_model_whose_embedding_is_smaller_than_the_vocabulary_is_refused(tmp_path):
    ds = datasets.text(write_corpus(tmp_path / "c", files=1), context=8).prepare()
    with pytest.raises(ValueError, match="200 rows for the 256 ids.*vocab_size"):
        ds.check_model({"weights": [[[200, 16], "<f4"], [[8, 16], "<f4"]]})
    ds.check_model({"weights": [[[256, 16], "<f4"]]})
    ds.check_model({"weights": [[[16], "<f4"]]})        # not an embedding: not checked


def test_bpe_dataset_trains_its_tokenizer_on_the_training_split_once(tmp_path):
    pytest.importorskip("tokenizers")
    paths = write_corpus(tmp_path / "c", files=3)
    ds = datasets.text(paths, context=8, tokenizer="bpe:320").prepare()
    assert ds.tokenizer.trained and ds.tokens_per_byte() < 0.7
    trained = ds.tokenizer.to_json()
    ds.prepare()
    assert ds.tokenizer.to_json() == trained          # not trained again
    (x, _), _ = pickle.loads(pickle.dumps(ds)).load_shared()
    assert x.tokens.dtype == np.uint16 and int(x.tokens.max()) < ds.vocab_size


# --------------------------------------------------------------------------- fortunes


def test_fortunes_is_found_in_data_dir_parsed_into_cookies(tmp_path, monkeypatch):
    write_fortunes(tmp_path / "data" / "fortunes")
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "data"))
    source = corpora.CorpusSource("fortunes")
    files = source.resolve(download=False)
    assert [os.path.basename(f) for f in files] == sorted(corpora.CORPORA["fortunes"].required)
    docs = source.documents(files)
    assert len(docs) == 40 * 4 and "Bold words." in docs
    assert not any("%" in d or "\b" in d for d in docs)
    assert docs != sorted(docs) and docs == source.documents(files)   # shuffled, fixed
    ds = datasets.corpus("fortunes", context=8).prepare()
    assert ds.__name__ == "text:fortunes/byte/context=8" and ds.windows("train") > 0


def test_fortunes_lookup_order_cache_then_system_copy(tmp_path):
    write_fortunes(tmp_path / "system" / "fortunes")
    files = corpora.CorpusSource("fortunes").resolve(download=False)
    assert files[0].startswith(str(tmp_path / "system"))
    write_fortunes(tmp_path / "cache" / "fortunes")
    files = corpora.CorpusSource("fortunes").resolve(download=False)
    assert files[0].startswith(str(tmp_path / "cache"))


def test_only_fortunes_min_installed_is_not_taken_for_the_corpus(tmp_path):
    os.makedirs(tmp_path / "system" / "fortunes")
    (tmp_path / "system" / "fortunes" / "fortunes").write_text("A cookie.\n%\n")
    with pytest.raises(DatasetNotFoundError, match="missing .*computers"):
        corpora.CorpusSource("fortunes").resolve(download=False)


def test_a_missing_corpus_that_cannot_be_fetched_says_every_place_and_the_fix(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        datasets.corpus("fortunes").prepare()
    text = str(info.value)
    for part in ("$DDLF_DATA_DIR: not set", str(tmp_path / "cache" / "fortunes"),
                 str(tmp_path / "system" / "fortunes"), "apt disabled in tests",
                 "apt-get install fortunes-min fortunes", "dpkg-deb -x"):
        assert part in text


def test_a_missing_corpus_is_fetched_from_its_packages_into_the_cache(tmp_path, monkeypatch):
    calls = []

    def fake_apt(corpus, dest):
        calls.append(corpus.packages)
        write_fortunes(dest)

    monkeypatch.setattr(corpora, "_apt_fetch_corpus", fake_apt)
    ds = datasets.corpus("fortunes", context=8).prepare()
    assert calls == [("fortunes-min", "fortunes")]
    assert os.path.isfile(tmp_path / "cache" / "fortunes" / "computers")
    datasets.corpus("fortunes", context=8).prepare()
    assert len(calls) == 1 and ds.windows("train") > 0          # fetched once
    assert datasets.fetch("fortunes") == str(tmp_path / "cache" / "fortunes")


def test_an_unknown_corpus_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: fortunes"):
        datasets.corpus("shakespeare")


# --------------------------------------------------------------------------- metrics


class _History:
    def __init__(self, rows=()):
        self.rows = list(rows)


class _Run:
    stop = False


def test_text_metrics_count_tokens_and_turn_the_loss_into_bits_per_byte(tmp_path):
    ds = datasets.text(write_corpus(tmp_path / "c", files=1), context=8).prepare()
    history = _History([{"tokens": 800}])               # a resumed run's last row
    row = {"samples": 50, "samples_per_s": 10.0, "test_loss": math.log(2) * 3}
    TextMetrics(ds, history).on_row(row, _Run())
    assert row["tokens"] == 800 + 50 * 8 and row["tokens_per_s"] == 80.0
    assert row["bits_per_byte"] == pytest.approx(3.0)   # bytes: loss in bits
    assert row["perplexity"] == pytest.approx(8.0)
    unevaluated = {"samples": 5, "samples_per_s": None, "test_loss": None}
    TextMetrics(ds, _History()).on_row(unevaluated, _Run())
    assert unevaluated["bits_per_byte"] is None and unevaluated["tokens_per_s"] is None


def test_target_loss_stops_at_the_first_evaluation_at_or_below_it():
    stop = EarlyStopping(target_loss=1.5)
    run = _Run()
    stop.on_row({"test_accuracy": 0.3, "test_loss": 1.6}, run)
    assert not run.stop
    stop.on_row({"test_accuracy": None, "test_loss": None}, run)
    assert not run.stop
    stop.on_row({"test_accuracy": 0.4, "test_loss": 1.5}, run)
    assert run.stop and "1.5000 reached the target 1.5" in stop.reason


# --------------------------------------------------------------------------- the schedule


def test_warmup_cosine_rises_linearly_then_decays_to_a_tenth():
    f = schedule.warmup_cosine
    assert f(0, 1e-3, 10, 110) == 0.0 and f(5, 1e-3, 10, 110) == pytest.approx(5e-4)
    assert f(10, 1e-3, 10, 110) == pytest.approx(1e-3)
    assert f(60, 1e-3, 10, 110) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert f(110, 1e-3, 10, 110) == pytest.approx(1e-4) == f(500, 1e-3, 10, 110)
    assert f(500, 1e-3, 10, None) == 1e-3
    assert schedule.warmup_for(None, 50) == 5 and schedule.warmup_for(None, None) == 100
    assert schedule.warmup_for(7, 50) == 7


def test_steps_per_trainer_is_each_trainers_share_of_the_batches():
    assert steps_per_trainer(1000, 2, 32, 3) == 16 * 3
    assert steps_per_trainer(1000, 1, 32, 1, worker_epochs=2) == 32 * 2


def test_eval_windows_evaluates_on_the_first_windows_of_the_split(tmp_path):
    paths = write_corpus(tmp_path / "c", files=3)
    ds = datasets.text(paths, context=8, eval_windows=5).prepare()
    (_, _), (xv, yv) = ds.load_shared()
    assert len(xv) == len(yv) == 5 and ds.windows("validation") > 5
    assert ds.__name__.endswith("/eval_windows=5")
    with pytest.raises(ValueError, match="eval_windows"):
        datasets.text(paths, eval_windows=0)


def test_importing_the_text_and_lm_modules_loads_no_framework():
    """A node's forkserver imports ddlf_actors.apps: the text datasets, the GPTs and the
    CLI must not start torch, TensorFlow or tokenizers at import."""
    import subprocess
    import sys

    code = ("import sys\nimport ddlf_actors.apps, ddlf_actors.apps.lm, ddlf_actors.apps.models\n"
            "import ddlf_actors.apps.cli, ddlf_actors.apps.lm.run_files\n"
            "from ddlf_actors.apps import datasets\ndatasets.text('x.txt')\n"
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'jax', 'tokenizers') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
