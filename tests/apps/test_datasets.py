"""ddlf_actors.apps.datasets: file formats, lookup order, fetching, the shared cache, partitions.

No network and no TensorFlow: every dataset is generated small, in the exact on-disk
formats, under tmp_path. Only the boundaries are replaced: ``_download``,
``_apt_fetch_fashion_mnist`` and ``SYSTEM_DIRS`` (plus ``SHM_DIR``, so a fallback
never writes to the real /dev/shm).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib
import multiprocessing as mp
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tarfile
import threading
import time
import warnings

import numpy as np
import psutil
import pytest

from ddlf_actors.apps import datasets
from ddlf_actors.apps.datasets import cache, download, registry

FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# Captured at import, before the fixtures clear the environment, for the real-data test.
_REAL_DATA_DIR = os.environ.get("DDLF_DATA_DIR")
# The real network boundaries, before the autouse fixture replaces them on the module.
_ORIGINAL_DOWNLOAD = download._download
_ORIGINAL_APT = download._apt_fetch_fashion_mnist


# --------------------------------------------------------------------------- helpers


def make_mnist(directory, n_train=12, n_test=5, *, gz=True, dotted=False, seed=0):
    """Write the four IDX files of a tiny MNIST-format dataset; return the raw arrays."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    x[0, 0, 0], x[0, 0, 1] = 0, 255  # so normalised min / max are exactly -0.5 / 0.5
    y = rng.integers(0, 10, n_train).astype(np.uint8)
    xt = rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8)
    yt = rng.integers(0, 10, n_test).astype(np.uint8)
    os.makedirs(directory, exist_ok=True)
    for name, arr in zip(FMNIST_FILES, (x, y, xt, yt)):
        if dotted:  # train-images.idx3-ubyte
            name = name.replace("-idx", ".idx")
        datasets.write_idx(os.path.join(directory, name + (".gz" if gz else "")), arr)
    return (x, y), (xt, yt)


def cifar_batch(n, seed):
    rng = np.random.default_rng(seed)
    return {b"batch_label": b"batch", b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [b"img%d.png" % i for i in range(n)]}


def make_cifar(directory, n=3, protocol=2):
    """Write the six batches of a tiny CIFAR-10 ``cifar-10-batches-py`` directory."""
    os.makedirs(directory, exist_ok=True)
    batches = {}
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        batches[name] = cifar_batch(n, seed=i)
        with open(os.path.join(directory, name), "wb") as f:
            pickle.dump(batches[name], f, protocol=protocol)
    return batches


def fake_server(source_dir, calls):
    """A ``_download`` that serves files from ``source_dir`` by URL basename."""
    def _download(url, dest):
        calls.append(url)
        src = os.path.join(source_dir, url.rsplit("/", 1)[1])
        if not os.path.exists(src):
            raise OSError(f"404 {url}")
        shutil.copyfile(src, dest)
    return _download


def no_network(url, dest):
    raise OSError("network disabled in tests")


def no_apt(dest):
    raise OSError("apt disabled in tests")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test: HOME, cache, system dir and /dev/shm under tmp_path; no network, no apt."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DDLF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DDLF_DATA_DIR", raising=False)
    monkeypatch.setitem(registry.SYSTEM_DIRS, "fashion-mnist", str(tmp_path / "system" / "fashion-mnist"))
    monkeypatch.setattr(cache, "SHM_DIR", str(tmp_path / "shm"))
    monkeypatch.setattr(download, "_download", no_network)
    monkeypatch.setattr(download, "_apt_fetch_fashion_mnist", no_apt)
    monkeypatch.setattr(registry, "_REGISTERED", {})
    return tmp_path


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("dtype,shape", [
    (np.uint8, (7, 28, 28)), (np.uint8, (9,)), (np.int8, (3, 2)), (np.int16, (4, 5)),
    (np.int32, (2, 3, 4)), (np.float32, (6, 1)), (np.float64, (5,)), (np.uint8, (0, 28, 28)),
])
def test_idx_round_trip(tmp_path, gz, dtype, shape):
    arr = (np.arange(int(np.prod(shape))) % 100 - 50 * (np.dtype(dtype).kind != "u")).astype(dtype)
    arr = arr.reshape(shape)
    path = str(tmp_path / ("a.idx" + (".gz" if gz else "")))
    datasets.write_idx(path, arr)
    back = datasets.read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == shape
    np.testing.assert_array_equal(back, arr)
    back[...] = 0  # a writable, native-endian array
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # no temp file left behind


def test_idx_matches_the_published_layout(tmp_path):
    """Bytes exactly as in the MNIST spec: 0x00 0x00 code ndim, big-endian dims, data."""
    labels = np.array([7, 2, 1], dtype=np.uint8)
    datasets.write_idx(str(tmp_path / "l"), labels)
    assert (tmp_path / "l").read_bytes() == b"\x00\x00\x08\x01" + struct.pack(">I", 3) + b"\x07\x02\x01"
    # A hand-made big-endian int32 file reads back native.
    raw = b"\x00\x00\x0c\x02" + struct.pack(">II", 2, 2) + struct.pack(">4i", 1, -2, 3, 70000)
    (tmp_path / "i").write_bytes(raw)
    np.testing.assert_array_equal(datasets.read_idx(str(tmp_path / "i")), [[1, -2], [3, 70000]])
    with gzip.open(tmp_path / "i.gz", "wb") as f:
        f.write(raw)
    np.testing.assert_array_equal(datasets.read_idx(str(tmp_path / "i.gz")), [[1, -2], [3, 70000]])


GOOD = b"\x00\x00\x08\x02" + struct.pack(">II", 2, 3) + bytes(range(6))


# mtime=0: a gzip header holds its creation time, which would otherwise become part of the
# test ids, and pytest-xdist workers that collect in different seconds would disagree.
@pytest.mark.parametrize("raw,gz,match", [
    (GOOD[:-1], False, "truncated"),
    (GOOD + b"\x00", False, "trailing"),
    (GOOD[:6], False, "truncated IDX header"),
    (b"\x00", False, "not an IDX file"),
    (b"<html>404</html>", False, "magic"),
    (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00", False, "dtype code 0x07"),
    (b"\x00\x00\x08\x00", False, "0 dimensions"),
    (gzip.compress(GOOD, mtime=0), False, "gzipped without a .gz name"),
    (gzip.compress(GOOD, mtime=0)[:-12], True, "corrupt or truncated gzip"),
    (b"<html>not gzip</html>", True, "corrupt or truncated gzip"),
    (gzip.compress(GOOD[:-2], mtime=0), True, "truncated"),
])
def test_read_idx_rejects_corrupt_files(tmp_path, raw, gz, match):
    path = tmp_path / ("bad.idx" + (".gz" if gz else ""))
    path.write_bytes(raw)
    with pytest.raises(datasets.DatasetFormatError, match=match) as info:
        datasets.read_idx(str(path))
    assert str(path) in str(info.value)  # the message names the file
    assert isinstance(info.value, ValueError)


def test_read_idx_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        datasets.read_idx(str(tmp_path / "nope.gz"))


def test_write_idx_rejects_types_idx_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="cannot store dtype int64"):
        datasets.write_idx(str(tmp_path / "a"), np.arange(3, dtype=np.int64))
    with pytest.raises(ValueError, match="dimensions"):
        datasets.write_idx(str(tmp_path / "a"), np.uint8(3))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("gz,dotted", [(True, False), (False, False), (True, True), (False, True)])
def test_load_accepts_every_file_spelling(tmp_path, gz, dotted):
    (x, y), (xt, yt) = make_mnist(tmp_path / "d", gz=gz, dotted=dotted)
    (lx, ly), (lxt, lyt) = datasets.load("fashion-mnist", data_dir=str(tmp_path / "d"))
    assert lx.shape == (12, 28, 28, 1) and lx.dtype == np.float32
    assert lxt.shape == (5, 28, 28, 1) and lxt.dtype == np.float32
    assert ly.dtype == np.int64 and lyt.dtype == np.int64
    np.testing.assert_array_equal(lx[..., 0], x.astype(np.float32) / 255 - 0.5)
    assert lx.min() == -0.5 and lx.max() == 0.5
    np.testing.assert_array_equal(ly, y)
    np.testing.assert_array_equal(lyt, yt)


def test_load_reports_a_corrupt_copy_instead_of_skipping_it(tmp_path, monkeypatch):
    make_mnist(tmp_path / "d")
    (tmp_path / "d" / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    make_mnist(tmp_path / "cache" / "fashion-mnist")  # a good copy later in the order
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "d"))
    with pytest.raises(datasets.DatasetFormatError, match="train-labels-idx1-ubyte.gz"):
        datasets.load("fashion-mnist")


def test_load_rejects_mismatched_image_and_label_counts(tmp_path):
    make_mnist(tmp_path / "d")
    datasets.write_idx(str(tmp_path / "d" / "train-labels-idx1-ubyte.gz"), np.zeros(3, np.uint8))
    with pytest.raises(datasets.DatasetFormatError, match="labels for 12 images"):
        datasets.load("mnist", data_dir=str(tmp_path / "d"))


# --------------------------------------------------------------------------- CIFAR-10


@pytest.mark.parametrize("layout", ["flat", "subdir"])
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar10_is_nhwc_and_normalised(tmp_path, layout, protocol):
    target = tmp_path / "c" / ("cifar-10-batches-py" if layout == "subdir" else "")
    batches = make_cifar(target, n=3, protocol=protocol)
    (x, y), (xt, yt) = datasets.load("cifar10", data_dir=str(tmp_path / "c"))
    assert x.shape == (15, 32, 32, 3) and xt.shape == (3, 32, 32, 3)
    assert x.dtype == np.float32 and y.dtype == np.int64 and y.shape == (15,)
    assert -0.5 <= x.min() and x.max() <= 0.5
    data = batches["data_batch_2"][b"data"]  # images 3..5 of the training set
    for ch in range(3):  # channel-first rows of 1024 become the last axis
        plane = data[1, ch * 1024:(ch + 1) * 1024].reshape(32, 32)
        np.testing.assert_array_equal(x[4, :, :, ch], plane.astype(np.float32) / 255 - 0.5)
    np.testing.assert_array_equal(y[3:6], batches["data_batch_2"][b"labels"])
    np.testing.assert_array_equal(yt, batches["test_batch"][b"labels"])


def test_cifar_reader_refuses_foreign_pickles(tmp_path):
    make_cifar(tmp_path / "c")
    with open(tmp_path / "c" / "data_batch_3", "wb") as f:
        pickle.dump({b"data": os.system, b"labels": []}, f)
    with pytest.raises(datasets.DatasetFormatError, match="refusing to load posix.system"):
        datasets.read_cifar10(str(tmp_path / "c"))
    (tmp_path / "c" / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8),
                                                                 b"labels": [1, 2]}))
    with pytest.raises(datasets.DatasetFormatError, match=r"expected uint8 \(N, 3072\)"):
        datasets.read_cifar10(str(tmp_path / "c"))
    os.unlink(tmp_path / "c" / "data_batch_3")
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        datasets.read_cifar10(str(tmp_path / "c"))


def test_fetch_cifar10_extracts_only_the_batches(tmp_path, monkeypatch):
    make_cifar(tmp_path / "src" / "cifar-10-batches-py")
    (tmp_path / "src" / "evil").write_text("x")
    (tmp_path / "srv").mkdir()
    with tarfile.open(tmp_path / "srv" / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        tar.add(tmp_path / "src" / "evil", arcname="cifar-10-batches-py/../../evil")
    calls = []
    monkeypatch.setattr(download, "_download", fake_server(tmp_path / "srv", calls))
    (x, y), (xt, yt) = datasets.load("cifar10")
    assert calls == ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"]
    assert x.shape == (15, 32, 32, 3) and xt.shape == (3, 32, 32, 3)
    cached = tmp_path / "cache" / "cifar10"
    assert sorted(os.listdir(cached)) == ["cifar-10-batches-py"]  # tarball removed
    assert sorted(os.listdir(cached / "cifar-10-batches-py")) == sorted(
        [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"])
    assert not (tmp_path / "evil").exists() and not (tmp_path / "cache" / "evil").exists()


# --------------------------------------------------------------------------- lookup order


def test_lookup_order_data_dir_then_cache_then_system_then_download(tmp_path, monkeypatch):
    """Four copies of different sizes show which one ``load`` picked at each step."""
    data_dir, cache_dir = tmp_path / "data", tmp_path / "cache" / "fashion-mnist"
    system_dir, served = tmp_path / "system" / "fashion-mnist", tmp_path / "served"
    make_mnist(data_dir, n_train=11)
    make_mnist(cache_dir, n_train=12)
    make_mnist(system_dir, n_train=13)
    make_mnist(served, n_train=14)
    calls = []
    monkeypatch.setattr(download, "_download", fake_server(served, calls))
    monkeypatch.setenv("DDLF_DATA_DIR", str(data_dir))

    def n_loaded(**kw):
        return len(datasets.load("fashion-mnist", **kw)[0][0])

    assert n_loaded() == 11
    make_mnist(tmp_path / "arg", n_train=10)
    assert n_loaded(data_dir=str(tmp_path / "arg")) == 10  # the argument beats the env
    shutil.rmtree(data_dir)
    assert n_loaded() == 12
    shutil.rmtree(cache_dir)
    assert n_loaded() == 13
    shutil.rmtree(system_dir)
    assert calls == []
    assert n_loaded() == 14
    assert len(calls) == 4 and all(u.startswith("http://fashion-mnist.s3-website") for u in calls)
    assert sorted(os.listdir(cache_dir)) == sorted(f + ".gz" for f in FMNIST_FILES)
    assert n_loaded() == 14 and len(calls) == 4  # now served from the cache


def test_data_dir_subfolder_named_for_the_dataset(tmp_path, monkeypatch):
    make_mnist(tmp_path / "data" / "mnist", n_train=7)
    make_mnist(tmp_path / "data" / "fashion-mnist", n_train=8)
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "data"))
    assert len(datasets.load("mnist")[0][0]) == 7
    assert len(datasets.load("fashion-mnist")[0][0]) == 8


def test_a_folder_named_for_another_dataset_is_not_taken(tmp_path, monkeypatch):
    """fashion-mnist and mnist share file names: $DDLF_DATA_DIR=.../fashion-mnist is not mnist."""
    make_mnist(tmp_path / "fashion-mnist")
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "fashion-mnist"))
    assert len(datasets.load("fashion-mnist")[0][0]) == 12
    with pytest.raises(datasets.DatasetNotFoundError, match="skipped, it is named for 'fashion-mnist'"):
        datasets.load("mnist")


def test_cache_defaults_to_home_dot_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("DDLF_CACHE_DIR")
    make_mnist(tmp_path / "home" / ".cache" / "ddlf" / "mnist", n_train=9)
    assert len(datasets.load("mnist")[0][0]) == 9


def test_not_found_lists_every_place_and_how_to_get_it(tmp_path):
    with pytest.raises(datasets.DatasetNotFoundError) as info:
        datasets.load("fashion-mnist")
    msg = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for expected in [
        "$DDLF_DATA_DIR: not set",
        str(tmp_path / "cache" / "fashion-mnist") + " (cache): no such directory",
        str(tmp_path / "system" / "fashion-mnist") + " (system copy, Debian package dataset-fashion-mnist)",
        "download http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/train-images-idx3-ubyte.gz: "
        "OSError: network disabled in tests",
        "apt-get download dataset-fashion-mnist + dpkg-deb -x: OSError: apt disabled in tests",
        "ddlf-train fetch fashion-mnist",
        "apt-get download dataset-fashion-mnist && dpkg-deb -x",
        "put the 4 IDX files (train-images-idx3-ubyte.gz,",
    ]:
        assert expected in msg, f"{expected!r} not in:\n{msg}"
    assert msg.index("(cache)") < msg.index("(system copy") < msg.index("download http")


def test_partial_copy_names_the_missing_files(tmp_path):
    make_mnist(tmp_path / "d")
    os.unlink(tmp_path / "d" / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(datasets.DatasetNotFoundError, match=r"missing t10k-labels-idx1-ubyte\[.gz\]"):
        datasets.load("mnist", data_dir=str(tmp_path / "d"), download=False)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; known: cifar10, fashion-mnist, mnist"):
        datasets.load("imagenet")
    with pytest.raises(ValueError, match="no download known for dataset 'imagenet'"):
        datasets.fetch("imagenet")
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        datasets.load_shared("imagenet")


# --------------------------------------------------------------------------- fetch


def test_fetch_falls_back_to_the_debian_package(tmp_path, monkeypatch):
    make_mnist(tmp_path / "deb", n_train=6)
    order = []
    monkeypatch.setattr(download, "_download", lambda url, dest: (order.append("url"), no_network(url, dest)))

    def apt(dest):
        order.append("apt")
        for f in FMNIST_FILES:
            shutil.copyfile(tmp_path / "deb" / (f + ".gz"), os.path.join(dest, f + ".gz"))

    monkeypatch.setattr(download, "_apt_fetch_fashion_mnist", apt)
    path = datasets.fetch("fashion-mnist")
    assert path == str(tmp_path / "cache" / "fashion-mnist")
    assert order == ["url", "apt"]
    assert len(datasets.load("fashion-mnist")[0][0]) == 6
    assert datasets.fetch("fashion-mnist") == path and order == ["url", "apt"]  # already cached


def test_fetch_fails_with_the_how_to(tmp_path):
    with pytest.raises(datasets.DatasetNotFoundError) as info:
        datasets.fetch("fashion-mnist")
    msg = str(info.value)
    assert "download http://fashion-mnist.s3-website" in msg and "apt disabled in tests" in msg
    assert "ddlf-train fetch fashion-mnist" in msg and "dpkg-deb -x" in msg and "DDLF_DATA_DIR" in msg
    assert os.listdir(tmp_path / "cache" / "fashion-mnist") == []  # nothing half-written


def test_fetch_tries_the_next_mirror_and_rejects_bad_downloads(tmp_path, monkeypatch):
    make_mnist(tmp_path / "good", n_train=4)
    calls = []
    good = fake_server(tmp_path / "good", calls)

    def mirrors(url, dest):
        if "ossci-datasets" in url:  # the first mirror answers with an error page
            calls.append(url)
            with open(dest, "wb") as f:
                f.write(b"<html>AccessDenied</html>")
            return
        good(url, dest)

    monkeypatch.setattr(download, "_download", mirrors)
    assert len(datasets.load("mnist")[0][0]) == 4
    assert calls[:2] == ["https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz",
                         "https://storage.googleapis.com/cvdf-datasets/mnist/train-images-idx3-ubyte.gz"]
    assert len(calls) == 8


def test_download_writes_atomically_from_a_url(tmp_path):
    """The real ``_download`` (file:// URLs need no network)."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    real = _ORIGINAL_DOWNLOAD  # the autouse fixture replaced the module attribute
    real(src.as_uri(), str(tmp_path / "dest.bin"))
    assert (tmp_path / "dest.bin").read_bytes() == src.read_bytes()
    with pytest.raises(OSError):
        real((tmp_path / "missing").as_uri(), str(tmp_path / "dest2.bin"))
    assert sorted(os.listdir(tmp_path)) == ["dest.bin", "src.bin"]


def _fake_tool(bin_dir, name, script):
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_apt_fetch_with_stand_in_apt_get_and_dpkg_deb(tmp_path, monkeypatch):
    """The real ``_apt_fetch_fashion_mnist`` against scripts that behave like apt-get and dpkg-deb."""
    make_mnist(tmp_path / "pkg", n_train=3)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "apt-get", 'test "$1 $2" = "download dataset-fashion-mnist" || exit 100\n'
                                   "touch dataset-fashion-mnist_0.1-1_all.deb\n")
    _fake_tool(bin_dir, "dpkg-deb", 'mkdir -p "$3/usr/share/datasets/fashion-mnist" && '
                                    f'cp {tmp_path}/pkg/*.gz "$3/usr/share/datasets/fashion-mnist/"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    dest = tmp_path / "dest"
    dest.mkdir()
    _ORIGINAL_APT(str(dest))
    assert sorted(os.listdir(dest)) == sorted(f + ".gz" for f in FMNIST_FILES)
    _fake_tool(bin_dir, "apt-get", "echo 'E: Unable to locate package' >&2; exit 100\n")
    with pytest.raises(subprocess.SubprocessError, match="exited 100: E: Unable to locate package"):
        _ORIGINAL_APT(str(dest))


# --------------------------------------------------------------------------- register


def _toy(n=5):
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2, 1)
    return (x, np.arange(n)), (x[:2], np.arange(2))


def test_register_and_load():
    datasets.register("toy", _toy)
    assert datasets.names() == ["cifar10", "fashion-mnist", "mnist", "toy"]
    (x, y), _ = datasets.load("toy")
    assert x.shape == (5, 2, 2, 1)
    with pytest.raises(ValueError, match="already registered; pass overwrite=True"):
        datasets.register("toy", _toy)
    datasets.register("toy", functools.partial(_toy, 3), overwrite=True)
    assert len(datasets.load("toy")[0][0]) == 3
    with pytest.raises(ValueError, match="'mnist' is already registered"):
        datasets.register("mnist", _toy, overwrite=True)
    with pytest.raises(ValueError, match="must be letters"):
        datasets.register("../x", _toy)
    with pytest.raises(TypeError, match="must be callable"):
        datasets.register("y", 3)


# --------------------------------------------------------------------------- load_shared


def _counted_builder(marker_dir, n=64, delay=0.0):
    """A dataset callable that leaves one marker file per build (and can be slow)."""
    with open(os.path.join(marker_dir, f"build-{os.getpid()}-{time.monotonic_ns()}"), "w"):
        pass
    time.sleep(delay)
    x = np.linspace(-0.5, 0.5, n * 28 * 28, dtype=np.float32).reshape(n, 28, 28, 1)
    return (x, np.arange(n) % 10), (x[:8], np.arange(8))


def test_load_shared_returns_read_only_memmaps(tmp_path):
    (tmp_path / "m").mkdir()
    builder = functools.partial(_counted_builder, str(tmp_path / "m"))
    (x, y), (xt, yt) = datasets.load_shared(builder)
    for arr in (x, y, xt, yt):
        assert isinstance(arr, np.memmap) and not arr.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        x[0, 0, 0, 0] = 1.0
    expected = builder()
    np.testing.assert_array_equal(x, expected[0][0])
    np.testing.assert_array_equal(yt, expected[1][1])
    assert len(os.listdir(tmp_path / "m")) == 2  # one build by load_shared, one by us
    (x2, _), _ = datasets.load_shared(builder)
    assert len(os.listdir(tmp_path / "m")) == 2 and x2.filename == x.filename
    entries = os.listdir(tmp_path / "cache" / "arrays")
    assert [e for e in entries if not e.startswith(".")] == [os.path.basename(os.path.dirname(x.filename))]
    # Another callable gets another entry; an explicit key is used as given.
    (x3, _), _ = datasets.load_shared(functools.partial(_counted_builder, str(tmp_path / "m"), 32))
    assert x3.shape == (32, 28, 28, 1) and x3.filename != x.filename
    (x4, _), _ = datasets.load_shared(builder, key="mine-v2")
    assert os.path.dirname(x4.filename) == str(tmp_path / "cache" / "arrays" / "mine-v2")


def test_load_shared_by_name(tmp_path, monkeypatch):
    make_mnist(tmp_path / "d", n_train=9)
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "d"))
    (x, y), (xt, yt) = datasets.load_shared("fashion-mnist")
    assert isinstance(x, np.memmap) and x.shape == (9, 28, 28, 1) and x.dtype == np.float32
    assert y.dtype == np.int64 and xt.shape == (5, 28, 28, 1)
    np.testing.assert_array_equal(x, datasets.load("fashion-mnist")[0][0])
    assert os.path.basename(os.path.dirname(x.filename)).startswith("fashion-mnist-")
    # A new format version (what load returns changed) replaces the entry.
    monkeypatch.setattr(cache, "FORMAT_VERSION", "v-next")
    (x2, _), _ = datasets.load_shared("fashion-mnist")
    assert x2.filename != x.filename and _entries(tmp_path) == [
        os.path.basename(os.path.dirname(x2.filename))]
    datasets.register("toy", _toy, version="3")
    (tx, _), _ = datasets.load_shared("toy")
    assert os.path.basename(os.path.dirname(tx.filename)).startswith("toy-")



# An entry is named by what it was built from. The entry name used to be the dataset's
# name and format version only, so a cache built from one directory was served for
# another: 800 generated images for a run pointed at the real 60,000.


def _entries(tmp_path) -> list:
    return sorted(e for e in os.listdir(tmp_path / "cache" / "arrays") if not e.startswith("."))


def _rewrite_in_place(path, array):
    """Overwrite ``path``'s bytes (same inode) with ``array`` as IDX, gzipped like the file."""
    staged = str(path) + ".staged" + (".gz" if str(path).endswith(".gz") else "")
    datasets.write_idx(staged, array)  # gzip with mtime=0, so the bytes are reproducible
    with open(staged, "rb") as src, open(path, "r+b") as dst:
        data = src.read()
        dst.write(data)
        dst.truncate(len(data))
    os.unlink(staged)


def test_load_shared_follows_the_files_a_name_resolves_to(tmp_path, monkeypatch):
    make_mnist(tmp_path / "small", n_train=8, seed=1, gz=False)  # sizes follow the shapes
    make_mnist(tmp_path / "big", n_train=20, seed=2)

    def shared(**kw):
        return datasets.load_shared("fashion-mnist", **kw)

    def loaded(directory):
        return datasets.load("fashion-mnist", data_dir=str(directory))

    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "small"))
    (x_small, y_small), (xt_small, _) = shared()
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "big"))
    (x_big, y_big), (xt_big, _) = shared()
    assert len(x_small) == 8 and len(x_big) == 20  # the big run used to get the 8 images
    np.testing.assert_array_equal(x_big, loaded(tmp_path / "big")[0][0])
    np.testing.assert_array_equal(y_small, loaded(tmp_path / "small")[0][1])
    # The data_dir argument resolves to the same files as the environment did: same entry.
    (x_arg, _), _ = shared(data_dir=str(tmp_path / "small"))
    assert x_arg.filename == x_small.filename and len(_entries(tmp_path)) == 2
    # A file rewritten in place (same inode; new size and mtime) is picked up ...
    labels = tmp_path / "small" / "train-labels-idx1-ubyte"
    images = tmp_path / "small" / "train-images-idx3-ubyte"
    new_x = np.full((11, 28, 28), 255, np.uint8)
    _rewrite_in_place(images, new_x)
    _rewrite_in_place(labels, np.arange(11, dtype=np.uint8) % 10)
    (x_new, y_new), _ = shared(data_dir=str(tmp_path / "small"))
    assert len(x_new) == 11 and float(x_new.min()) == 0.5
    np.testing.assert_array_equal(y_new, np.arange(11) % 10)
    # ... and so is one of the same size whose only change is its content and times.
    _rewrite_in_place(labels, (np.arange(11, dtype=np.uint8) + 1) % 10)
    os.utime(labels, ns=(time.time_ns(), os.stat(labels).st_mtime_ns + 10**9))
    (_, y_same_size), _ = shared(data_dir=str(tmp_path / "small"))
    np.testing.assert_array_equal(y_same_size, (np.arange(11) + 1) % 10)
    # ... and one replaced by a same-size file that kept the old mtime (cp -p, rsync -t).
    old = os.stat(labels)
    staged = tmp_path / "staged-labels"
    datasets.write_idx(str(staged), (np.arange(11, dtype=np.uint8) + 2) % 10)
    os.utime(staged, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(staged, labels)
    assert (os.stat(labels).st_size, os.stat(labels).st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    (_, y_kept_mtime), _ = shared(data_dir=str(tmp_path / "small"))
    np.testing.assert_array_equal(y_kept_mtime, (np.arange(11) + 2) % 10)
    # The entries of the old file states are gone (their maps stay readable), the big
    # directory's entry is kept.
    assert len(_entries(tmp_path)) == 2
    assert not os.path.exists(x_small.filename) and float(np.asarray(x_small).sum()) != 0
    assert os.path.exists(x_big.filename)


def test_load_shared_cifar_follows_its_batch_files(tmp_path):
    make_cifar(tmp_path / "a", n=3)
    make_cifar(tmp_path / "b" / "cifar-10-batches-py", n=4)
    (xa, _), (xta, _) = datasets.load_shared("cifar10", data_dir=str(tmp_path / "a"))
    (xb, _), (xtb, _) = datasets.load_shared("cifar10", data_dir=str(tmp_path / "b"))
    assert (len(xa), len(xta), len(xb), len(xtb)) == (15, 3, 20, 4)


def test_load_shared_keys_a_fetched_dataset_by_the_fetched_files(tmp_path, monkeypatch):
    """Nothing on the node yet: the files are fetched first, then named in the key."""
    make_mnist(tmp_path / "served", n_train=14)
    calls = []
    monkeypatch.setattr(download, "_download", fake_server(tmp_path / "served", calls))
    (x, _), _ = datasets.load_shared("fashion-mnist")
    assert len(x) == 14 and len(calls) == 4
    (x_again, _), _ = datasets.load_shared("fashion-mnist")  # now found in the cache
    assert x_again.filename == x.filename and len(calls) == 4
    make_mnist(tmp_path / "mine", n_train=9)
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "mine"))
    (x_mine, _), _ = datasets.load_shared("fashion-mnist")
    assert len(x_mine) == 9


def test_concurrent_fetches_on_a_node_download_once(tmp_path, monkeypatch):
    """Processes fetching one dataset at once (trainers starting together) each downloaded
    every file, and one that finished first saw the others' files still in flight and
    reported the dataset missing. Now one downloads while the others wait, then find it."""
    make_mnist(tmp_path / "served")
    calls = []
    serve = fake_server(tmp_path / "served", calls)

    def slow(url, dest):
        time.sleep(0.05)
        serve(url, dest)

    monkeypatch.setattr(download, "_download", slow)
    paths, errors = [], []

    def fetch():
        try:
            paths.append(datasets.fetch("fashion-mnist"))
        except Exception as e:  # pragma: no cover - shown by the assert below
            errors.append(e)

    threads = [threading.Thread(target=fetch) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(paths) == 3 and len(set(paths)) == 1
    assert len(calls) == 4, calls


_MODULE = """
import numpy as np

SHAPE = {{"rows": {rows}}}  # not a plain value: only the module's source hash sees it
FILL = {fill}


def load():
    x = np.full((SHAPE["rows"], 2, 2, 1), FILL, np.float32)
    return (x, np.arange(len(x)) % 3), (x[:2], np.arange(2))
"""


@pytest.fixture
def data_module(tmp_path, monkeypatch):
    """``write(rows, fill)`` (re)writes module ``ddlf_test_dsmod`` in a folder on sys.path
    and returns it, imported; ``write(..., reload=False)`` changes only the file."""
    name = "ddlf_test_dsmod"
    folder = tmp_path / "mods"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)

    def write(rows, fill, *, reload=True):
        (folder / f"{name}.py").write_text(_MODULE.format(rows=rows, fill=fill))
        shutil.rmtree(folder / "__pycache__", ignore_errors=True)  # no stale bytecode
        importlib.invalidate_caches()
        if name not in sys.modules:
            return importlib.import_module(name)
        return importlib.reload(sys.modules[name]) if reload else sys.modules[name]

    yield write
    sys.modules.pop(name, None)


def test_load_shared_follows_a_module_functions_source(tmp_path, data_module):
    """A module-level function pickles by reference (its qualified name), so its body or
    its module's constants can change under the same name."""
    mod = data_module(4, 1.0)
    (x, y), _ = datasets.load_shared(mod.load)
    assert x.shape == (4, 2, 2, 1) and float(x.max()) == 1.0
    mod = data_module(6, 1.0)
    (x2, _), _ = datasets.load_shared(mod.load)
    assert x2.shape == (6, 2, 2, 1)
    mod = data_module(6, 2.0)
    (x3, _), _ = datasets.load_shared(mod.load)
    assert x3.shape == (6, 2, 2, 1) and float(x3.min()) == 2.0
    assert len({x.filename, x2.filename, x3.filename}) == 3
    assert _entries(tmp_path) == [os.path.basename(os.path.dirname(x3.filename))]


def test_a_process_running_old_code_does_not_poison_the_entry(tmp_path, data_module):
    """A notebook edits the module's file but has not reloaded it: its load() still makes
    the old data. That data must not be filed under the new source, or a fresh run would
    get it."""
    mod = data_module(4, 1.0)
    datasets.load_shared(mod.load)
    data_module(4, 3.0, reload=False)  # the file says FILL = 3.0, the process runs 1.0
    (x_stale, _), _ = datasets.load_shared(mod.load)
    assert float(x_stale.max()) == 1.0  # what this process's code makes
    mod = data_module(4, 3.0)
    (x_fresh, _), _ = datasets.load_shared(mod.load)
    assert float(x_fresh.max()) == 3.0


_SEEDED_MODULE = """
import numpy as np


def load():
    n = 5 if "zeta" in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"} else 3
    x = np.zeros((n, 2, 2, 1), np.float32)
    return (x, np.arange(n)), (x[:1], np.arange(1))
"""

# Loads identity.py on its own (it needs only the standard library and cloudpickle), so
# each process starts in a fraction of a second instead of importing ddlf_actors.
_STAMP_IN_A_PROCESS = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("identity", sys.argv[1])
identity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(identity)
sys.path.insert(0, sys.argv[2])
import ddlf_test_seeded
print(identity.code_stamp(ddlf_test_seeded.load))
"""


def test_a_callables_code_stamp_is_the_same_in_every_process(tmp_path):
    """Trainers on a node must agree on the key, or each builds its own entry and removes
    the others'. A set of strings in the code iterates in an order that depends on the
    process's hash seed; the stamp must not."""
    from ddlf_actors.apps.datasets import identity

    (tmp_path / "ddlf_test_seeded.py").write_text(_SEEDED_MODULE)
    stamps = set()
    for seed in ("1", "2", "3"):
        out = subprocess.run(
            [sys.executable, "-c", _STAMP_IN_A_PROCESS, identity.__file__, str(tmp_path)],
            env=dict(os.environ, PYTHONHASHSEED=seed), capture_output=True, text=True,
            timeout=60, check=True)
        stamps.add(out.stdout.strip())
    assert len(stamps) == 1 and len(next(iter(stamps))) == 64, stamps


_BY_VALUE_MODULE = """
import numpy as np

size = 3  # a plain global that shares its name with an attribute the lambda reads


def make():
    return lambda: ((np.zeros((2, 2, 2, 1), np.float32), np.zeros(np.ones(2).size)),
                    (np.zeros((1, 2, 2, 1), np.float32), np.zeros(1)))
"""


def test_a_function_shipped_by_value_keeps_its_code_stamp(tmp_path, monkeypatch):
    """A lambda travels by value and arrives with only the globals it uses, so the
    trainer's stamp must not depend on other names of the driver's module."""
    import cloudpickle

    from ddlf_actors.apps.datasets import identity

    (tmp_path / "ddlf_test_by_value.py").write_text(_BY_VALUE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ddlf_test_by_value", raising=False)
    fn = importlib.import_module("ddlf_test_by_value").make()
    shipped = cloudpickle.loads(cloudpickle.dumps(fn))
    assert "np" in shipped.__globals__ and "size" not in shipped.__globals__
    assert identity.code_stamp(shipped) == identity.code_stamp(fn)
    sys.modules.pop("ddlf_test_by_value", None)


def _dir_loader(data_dir=None):
    """A registered loader reading one ``.npy`` from its data_dir."""
    x = np.load(os.path.join(data_dir, "x.npy"))
    return (x, np.arange(len(x))), (x[:1], np.arange(1))


def test_load_shared_registered_datasets(tmp_path):
    for name, rows in (("a", 3), ("b", 5)):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "x.npy", np.zeros((rows, 2, 2, 1), np.float32))
    datasets.register("dirs", _dir_loader)
    (xa, _), _ = datasets.load_shared("dirs", data_dir=str(tmp_path / "a"))
    (xb, _), _ = datasets.load_shared("dirs", data_dir=str(tmp_path / "b"))
    assert (len(xa), len(xb)) == (3, 5)  # the data_dir is part of the key
    # Another loader under the same name: another entry, the old one superseded.
    datasets.register("toy", functools.partial(_toy, 3))
    (x3, _), _ = datasets.load_shared("toy")
    datasets.register("toy", functools.partial(_toy, 4), overwrite=True)
    (x4, _), _ = datasets.load_shared("toy")
    assert (len(x3), len(x4)) == (3, 4) and not os.path.exists(x3.filename)
    # An explicit version overrides the loader's identity: same version, same entry.
    datasets.register("toy", functools.partial(_toy, 5), version="1", overwrite=True)
    assert len(datasets.load_shared("toy")[0][0]) == 5
    datasets.register("toy", functools.partial(_toy, 6), version="1", overwrite=True)
    assert len(datasets.load_shared("toy")[0][0]) == 5  # the caller said: same data
    datasets.register("toy", functools.partial(_toy, 6), version="2", overwrite=True)
    assert len(datasets.load_shared("toy")[0][0]) == 6


def test_the_cli_dataset_follows_its_files(tmp_path, monkeypatch):
    """``ddlf-train run --data-dir D`` or ``--limit N`` trains on a NamedDataset, a callable:
    its key names the files it reads (its ``source_files``), not just its arguments."""
    from ddlf_actors.apps.cli import NamedDataset

    make_mnist(tmp_path / "d", n_train=8, seed=1)
    dataset = NamedDataset("fashion-mnist", str(tmp_path / "d"))
    assert len(datasets.load_shared(dataset)[0][0]) == 8
    make_mnist(tmp_path / "d", n_train=10, seed=2)  # replaced (rename over the old files)
    assert len(datasets.load_shared(dataset)[0][0]) == 10
    make_mnist(tmp_path / "e", n_train=30, seed=3)
    limited = NamedDataset("fashion-mnist", None, limit=25)
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "d"))
    assert len(datasets.load_shared(limited)[0][0]) == 10
    monkeypatch.setenv("DDLF_DATA_DIR", str(tmp_path / "e"))
    assert len(datasets.load_shared(limited)[0][0]) == 25


def test_load_shared_rebuilds_a_damaged_entry(tmp_path):
    (tmp_path / "m").mkdir()
    builder = functools.partial(_counted_builder, str(tmp_path / "m"))
    (x, _), _ = datasets.load_shared(builder)
    entry = os.path.dirname(x.filename)
    del x
    os.unlink(os.path.join(entry, "y_test.npy"))
    (tmp_path / "cache" / "arrays" / ".stale.tmp-1-ab").mkdir()  # another key's leftovers stay
    (x, _), (_, yt) = datasets.load_shared(builder)
    assert len(yt) == 8 and len(os.listdir(tmp_path / "m")) == 2


def test_load_shared_rejects_bad_inputs(tmp_path):
    with pytest.raises(TypeError, match="dataset name, a callable"):
        datasets.load_shared(42)
    with pytest.raises(TypeError, match=r"must return \(\(x, y\), \(x_test, y_test\)\)"):
        datasets.load_shared(lambda: (1, 2, 3))
    ds = datasets.write_partitions(tmp_path / "p", np.zeros((4, 1)), np.zeros(4), 2)
    with pytest.raises(TypeError, match=r"pass ds.partition\(k\)"):
        datasets.load_shared(ds)


def test_load_shared_falls_back_when_the_cache_is_not_writable(tmp_path, monkeypatch):
    # A regular file where the cache directory should be: unwritable even for root.
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("DDLF_CACHE_DIR", str(tmp_path / "blocked"))
    (tmp_path / "m").mkdir()
    builder = functools.partial(_counted_builder, str(tmp_path / "m"))
    with pytest.warns(RuntimeWarning, match="not writable.*trying"):
        (x, _), _ = datasets.load_shared(builder)
    assert isinstance(x, np.memmap) and x.filename.startswith(str(tmp_path / "shm"))
    monkeypatch.setattr(cache, "SHM_DIR", str(tmp_path / "blocked"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (x, y), _ = datasets.load_shared(builder)
    assert [w.category for w in caught] == [RuntimeWarning, RuntimeWarning]
    assert "trying" in str(caught[0].message) and "using a private copy" in str(caught[1].message)
    assert not isinstance(x, np.memmap) and not x.flags.writeable and len(y) == 64


def _in_children(ctx, target, arg, n: int) -> list:
    """Run ``target(arg, barrier, results)`` in ``n`` processes of ``ctx`` started together;
    return what each put on ``results``, and check that all exited cleanly."""
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(arg, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return got


@pytest.fixture
def spawn_ctx():
    """A spawn context whose resource tracker (a helper process that lives for the whole
    session once started) already runs, so ``no_leaks`` does not count it as leaked."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    return mp.get_context("spawn")


def _build_in_child(builder, barrier, results):
    barrier.wait()  # start together, so they race for the lock
    (x, y), (xt, yt) = datasets.load_shared(builder)
    digest = hashlib.sha256(np.ascontiguousarray(x).tobytes() + y.tobytes() + xt.tobytes()).hexdigest()
    results.put((os.getpid(), digest, x.filename, isinstance(x, np.memmap)))


def test_concurrent_builders_make_one_consistent_entry(tmp_path, spawn_ctx, no_leaks):
    (tmp_path / "m").mkdir()
    builder = functools.partial(_counted_builder, str(tmp_path / "m"), 256, 0.3)
    got = _in_children(spawn_ctx, _build_in_child, builder, n=4)
    assert len(os.listdir(tmp_path / "m")) == 1, "built more than once"
    assert len({digest for _, digest, _, _ in got}) == 1
    assert len({fn for _, _, fn, _ in got}) == 1 and all(m for *_, m in got)
    arrays = tmp_path / "cache" / "arrays"
    assert not [e for e in os.listdir(arrays) if ".tmp-" in e]
    np.testing.assert_array_equal(np.load(got[0][2]), builder()[0][0])


def _uss_child(ds_path, barrier, results):
    proc = psutil.Process()
    before = proc.memory_full_info().uss
    (x, _), _ = datasets.load_shared(datasets.partitioned(ds_path).partition(0))
    checksum = float(x.sum(dtype=np.float64))  # touches every page
    barrier.wait()  # both children now map every page
    shared_growth = proc.memory_full_info().uss - before
    barrier.wait()  # both measured before either one makes a copy or exits
    copy = np.array(x)  # the baseline: what each process would hold without the cache
    copy_growth = proc.memory_full_info().uss - before - shared_growth
    results.put((shared_growth, copy_growth, x.nbytes, checksum, float(copy[-1].sum())))


def test_load_shared_keeps_one_copy_per_node(tmp_path, spawn_ctx, no_leaks):
    """Two processes mapping a 40 MB dataset each add far less than 40 MB to their USS;
    a private copy adds the full 40 MB (so the check can fail)."""
    x = np.arange(10240 * 32 * 32, dtype=np.float32).reshape(10240, 32, 32, 1)
    ds = datasets.write_partitions(tmp_path / "big", x, np.arange(10240) % 10, 1)
    del x
    (built, _), _ = datasets.load_shared(ds.partition(0))  # build once, then unmap
    nbytes = built.nbytes
    del built
    got = _in_children(spawn_ctx, _uss_child, ds.path, n=2)
    for shared_growth, copy_growth, size, _, _ in got:
        assert size == nbytes > 40e6
        assert shared_growth < 0.5 * size, f"USS grew {shared_growth / 1e6:.1f} MB of {size / 1e6:.1f}"
        assert copy_growth > 0.9 * size, f"a private copy grew USS only {copy_growth / 1e6:.1f} MB"
    assert got[0][3] == got[1][3]


# --------------------------------------------------------------------------- partitions


def test_write_and_read_partitions(tmp_path):
    x = np.arange(10 * 4, dtype=np.float32).reshape(10, 2, 2, 1)
    y = np.arange(10)
    ds = datasets.write_partitions(tmp_path / "p", x, y, 3, x_test=x[:4], y_test=y[:4])
    assert isinstance(ds, datasets.PartitionedDataset)
    assert ds.path == str(tmp_path / "p") and ds.num_partitions == 3 and len(ds) == 3
    assert sorted(os.listdir(ds.path)) == ["part-00000.npz", "part-00001.npz", "part-00002.npz", "test.npz"]
    parts = [ds.load_partition(k) for k in range(3)]
    assert [len(px) for px, _ in parts] == [4, 3, 3]
    np.testing.assert_array_equal(np.concatenate([px for px, _ in parts]), x)
    np.testing.assert_array_equal(np.concatenate([py for _, py in parts]), y)
    np.testing.assert_array_equal(ds.load_test()[1], y[:4])
    # Shipped to remote trainers: only the path travels.
    blob = pickle.dumps(ds)
    assert len(blob) < 300 and pickle.loads(blob) == ds
    assert datasets.partitioned(str(tmp_path / "p")) == ds
    with pytest.raises(IndexError, match=r"partition 3 out of range: .* has 3 partitions \(0..2\)"):
        ds.load_partition(3)
    with pytest.raises(IndexError):
        ds.partition(-1)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        datasets.write_partitions(tmp_path / "p", x, y, 2)
    ds2 = datasets.write_partitions(tmp_path / "p", x, y, 2, overwrite=True)
    assert ds2.num_partitions == 2 and not ds2.has_test
    with pytest.raises(FileNotFoundError, match="no test.npz"):
        ds2.load_test()


def test_partition_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _ = datasets.partitioned(tmp_path / "none").num_partitions
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no partition files"):
        datasets.partitioned(tmp_path / "empty").load_partition(0)
    ds = datasets.write_partitions(tmp_path / "p", np.zeros((6, 1)), np.zeros(6), 3)
    os.unlink(os.path.join(ds.path, "part-00001.npz"))
    with pytest.raises(datasets.DatasetFormatError, match="missing part-00001.npz"):
        _ = ds.num_partitions
    np.savez(os.path.join(ds.path, "part-00001.npz"), a=np.zeros(2))
    with pytest.raises(datasets.DatasetFormatError, match="expected x and y"):
        ds.load_partition(1)
    (tmp_path / "p" / "part-00001.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(datasets.DatasetFormatError, match="part-00001.npz"):
        ds.load_partition(1)
    for bad_k in (0, 7):
        with pytest.raises(ValueError, match="k must be in 1..6"):
            datasets.write_partitions(tmp_path / "q", np.zeros((6, 1)), np.zeros(6), bad_k)
    with pytest.raises(ValueError, match="x has 6 rows but y has 5"):
        datasets.write_partitions(tmp_path / "q", np.zeros((6, 1)), np.zeros(5), 2)
    with pytest.raises(ValueError, match="both x_test and y_test"):
        datasets.write_partitions(tmp_path / "q", np.zeros((6, 1)), np.zeros(6), 2, x_test=np.zeros(1))
    with pytest.raises(TypeError, match="must be an int"):
        ds.load_partition("0")


def test_load_shared_partitions_share_one_test_set(tmp_path):
    x = np.arange(8 * 4, dtype=np.float32).reshape(8, 2, 2, 1)
    ds = datasets.write_partitions(tmp_path / "p", x, np.arange(8), 2, x_test=x[:3], y_test=np.arange(3))
    (x0, y0), (xt0, yt0) = datasets.load_shared(ds.partition(0))
    (x1, y1), (xt1, _) = datasets.load_shared((ds, 1))
    assert all(isinstance(a, np.memmap) for a in (x0, y0, xt0, yt0, x1, y1))
    np.testing.assert_array_equal(np.concatenate([x0, x1]), x)
    assert xt0.filename == xt1.filename  # one cached test set for all partitions
    assert x0.filename != x1.filename
    # Rewriting the files gives a new key, not stale arrays.
    time.sleep(0.01)
    datasets.write_partitions(tmp_path / "p", x + 1, np.arange(8), 2, overwrite=True)
    (x0b, _), test = datasets.load_shared(ds.partition(0))
    np.testing.assert_array_equal(x0b, x[:4] + 1)
    assert test == (None, None)


# --------------------------------------------------------------------------- misc


def test_importing_the_package_starts_no_tensorflow():
    code = ("import sys; import ddlf_actors.apps.datasets; "
            "bad = [m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules]; "
            "sys.exit(str(bad) if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _sibling_imports(path: str, siblings: set) -> set:
    """The modules of ``path``'s own package that it imports, at any depth."""
    import ast

    with open(path) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            out.update(n.split(".")[0] for n in names)
    return out & siblings


def test_the_datasets_modules_import_each_other_without_a_cycle():
    """registry and download imported each other (ensure lived in download and needed
    load); a cycle makes import order matter and hides which module owns what."""
    package = os.path.dirname(datasets.__file__)
    modules = {f[:-3] for f in os.listdir(package) if f.endswith(".py") and f != "__init__.py"}
    graph = {m: _sibling_imports(os.path.join(package, m + ".py"), modules) for m in modules}
    assert graph["registry"] >= {"download"}  # the walk below does see the imports

    def cycle_from(module, path):
        for nxt in sorted(graph[module]):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            found = cycle_from(nxt, path + [nxt])
            if found:
                return found
        return None

    cycles = [c for m in sorted(modules) if (c := cycle_from(m, [m]))]
    assert not cycles, " -> ".join(cycles[0])


def _real_fashion_mnist_dir():
    for base in (_REAL_DATA_DIR, "/usr/share/datasets/fashion-mnist"):
        if not base:
            continue
        for d in (os.path.join(base, "fashion-mnist"), base):
            if os.path.isdir(d) and registry.BUILTIN["fashion-mnist"].probe(d)[0]:
                return d
    return None


@pytest.mark.skipif(_real_fashion_mnist_dir() is None,
                    reason="real Fashion-MNIST not found (set DDLF_DATA_DIR)")
def test_real_fashion_mnist():
    (x, y), (xt, yt) = datasets.load("fashion-mnist", data_dir=_real_fashion_mnist_dir(), download=False)
    assert x.shape == (60000, 28, 28, 1) and xt.shape == (10000, 28, 28, 1)
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.min() == -0.5 and x.max() == 0.5
    assert set(np.unique(y)) == set(range(10)) and np.bincount(y).tolist() == [6000] * 10
    assert yt.shape == (10000,)


def test_warnings_are_not_raised_on_the_happy_path(tmp_path):
    make_mnist(tmp_path / "d")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        datasets.load_shared("mnist", data_dir=str(tmp_path / "d"))


def test_ensure_fetches_only_what_is_missing(tmp_path, monkeypatch):
    make_mnist(tmp_path / "deb", n_train=6)
    calls = []

    def apt(dest):
        calls.append("apt")
        for f in FMNIST_FILES:
            shutil.copyfile(tmp_path / "deb" / (f + ".gz"), os.path.join(dest, f + ".gz"))

    monkeypatch.setattr(download, "_apt_fetch_fashion_mnist", apt)
    datasets.ensure("fashion-mnist")          # missing: URL fails, apt fills the cache
    assert calls == ["apt"]
    datasets.ensure("fashion-mnist")          # present: nothing fetched again
    assert calls == ["apt"]
    # An explicit folder that lacks the files is an error, even with a copy in the cache:
    # not a reason to download, nor to use another copy.
    with pytest.raises(datasets.DatasetNotFoundError, match="data_dir given"):
        datasets.ensure("fashion-mnist", data_dir=str(tmp_path / "empty"))
    assert calls == ["apt"]
    make_mnist(tmp_path / "mine")
    datasets.ensure("fashion-mnist", data_dir=str(tmp_path / "mine"))  # there: fine


def test_locate_names_the_directory_load_would_read(tmp_path, monkeypatch):
    assert datasets.locate("fashion-mnist") is None
    make_mnist(tmp_path / "cache" / "fashion-mnist")
    assert datasets.locate("fashion-mnist") == str(tmp_path / "cache" / "fashion-mnist")
    make_mnist(tmp_path / "mine")
    assert datasets.locate("fashion-mnist", data_dir=str(tmp_path / "mine")) == str(
        tmp_path / "mine")
    with pytest.raises(ValueError):
        datasets.locate("no-such-set")



def test_source_files_names_what_load_reads(tmp_path, monkeypatch):
    make_mnist(tmp_path / "d", dotted=True)
    make_mnist(tmp_path / "cache" / "mnist", gz=False)
    assert datasets.source_files("mnist", data_dir=str(tmp_path / "d")) == [
        str(tmp_path / "d" / f.replace("-idx", ".idx")) + ".gz" for f in FMNIST_FILES]
    assert datasets.source_files("mnist") == [str(tmp_path / "cache" / "mnist" / f)
                                             for f in FMNIST_FILES]
    make_cifar(tmp_path / "c" / "cifar-10-batches-py")
    files = datasets.source_files("cifar10", data_dir=str(tmp_path / "c"))
    assert [os.path.basename(f) for f in files] == [f"data_batch_{i}" for i in range(1, 6)] + [
        "test_batch"] and all(os.path.dirname(f).endswith("cifar-10-batches-py") for f in files)
    with pytest.raises(datasets.DatasetNotFoundError, match="download=False"):
        datasets.source_files("fashion-mnist", download=False)
    with pytest.raises(ValueError, match="unknown dataset"):
        datasets.source_files("imagenet")
