"""DDLF's schemes with their trainers on Ray actors (``backend="ray"``, apps/backends).

One local Ray instance serves the whole module (Ray takes seconds to start); each DDLF
run next to it starts and stops its own embedded cluster (a process is on one runtime
at a time, and ``ddlf.init(backend="ray")`` is tested here too). The module's fixture
checks that ``ray.shutdown()`` leaves none of Ray's processes behind. Skipped without Ray
(``pip install 'ddlf-actors[ray]'``; CI installs it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

import numpy as np
import psutil
import pytest
from helpers_modules.numpy_trainer import (
    NumpyTrainer,
    SigkillOnce,
    blobs_dataset,
    hard_blobs_dataset,
    softmax_model_fn,
)
from helpers_modules.readme_trainer import ReadmeTrainer, readme_model_fn

import ddlf_actors as ddlf
from ddlf_actors import ray_session
from ddlf_actors.apps import backends, train, train_async, train_sync
from ddlf_actors.apps.backends.fake import FakeBackend
from ddlf_actors.errors import ActorDiedError

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'ddlf-actors[ray]'")

MODEL = softmax_model_fn(64, 4)
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def ray_cluster(private_cache, tmp_path_factory):
    """A local 2-CPU Ray instance for the module; afterwards, none of its processes.

    Ray's workers inherit the environment of the raylet that ``ray.init`` starts: they
    import the test trainers (``helpers_modules``) through ``PYTHONPATH``, and
    ``SigkillOnce`` reads its settings from there (a per-actor ``runtime_env`` would
    make Ray start new worker processes, seconds each on 2 busy cores).
    """
    kill_dir = tmp_path_factory.mktemp("ray-kill")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH"))
                                         if p),
           "DDLF_TEST_KILL_DIR": str(kill_dir), "DDLF_TEST_FIT_SLEEP": "0.15",
           "DDLF_TEST_KILL_SLOT": "1", "DDLF_TEST_KILL_CALL": "2"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ray_session.start(num_cpus=2, owner="test", object_store_memory=100 * 2**20,
                          log_to_driver=False)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ray.kill_dir = kill_dir
    ours = psutil.Process().children(recursive=True)
    assert ours, "ray.init started no processes?"
    try:
        yield ray
    finally:
        ray_session.stop("test")
        assert not ray.is_initialized()
        _, alive = psutil.wait_procs(ours, timeout=30)
        # Ray's shutdown does not wait for all of its helpers (one was seen still exiting
        # 20 s later on a busy CI machine): end what is left, ours by pid, and fail only if
        # something outlives that.
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        _, alive = psutil.wait_procs(alive, timeout=10)
        left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"Ray left processes behind: {[(p.pid, p.name()) for p in left]}"


def _run(fn, backend, dataset=blobs_dataset, **kw):
    options = dict(workers=2, master_epochs=2, rounds_per_epoch=2, trainer_cls=NumpyTrainer,
                   progress=False, seed=7)
    options.update(kw)
    return fn(MODEL, dataset, backend=backend, **options)


def _kinds(result, kind):
    return [e for e in result.events if e["kind"] == kind]


def test_ddlf_init_backend_ray_makes_the_apps_use_ray(ray_cluster):
    ddlf.init(backend="ray")               # joins the module's running Ray
    try:
        assert ddlf.is_initialized() and backends.select().name == "ray"
        with pytest.raises(ddlf.errors.AlreadyInitializedError, match="backend='ray'"):
            ddlf.init()                    # one runtime per process
        with pytest.raises(ddlf.errors.DDLFError, match="backend='ray'"):
            ddlf.put(1)                    # no DDLF cluster is started behind our back
        result = train_sync(MODEL, blobs_dataset, workers=2, trainer_cls=NumpyTrainer,
                            progress=False)
        assert result.history[-1]["test_accuracy"] > 0.5
    finally:
        ddlf.shutdown()
    assert backends.select().name == "ddlf" and not ddlf.is_initialized()
    assert ray.is_initialized()            # not ours to stop: the module started it


def test_sync_gives_the_same_weights_on_both_backends(ray_cluster):
    on_ddlf = _run(train_sync, "ddlf")
    on_ray = _run(train_sync, "ray")
    assert [r["round"] for r in on_ray.history] == [1, 2, 3, 4]
    for a, b in zip(on_ddlf.weights, on_ray.weights):
        np.testing.assert_array_equal(a, b)
    assert [r["test_accuracy"] for r in on_ray.history] == \
        [r["test_accuracy"] for r in on_ddlf.history]
    assert not np.allclose(MODEL().get_weights()[0], on_ray.weights[0])   # it trained
    assert ray.is_initialized()          # the module's Ray was used, not stopped


def test_allreduce_on_ray_equals_sync(ray_cluster):
    """The ring's chunks go trainer to trainer through Ray (each trainer's backend, its
    async methods in a concurrency group of their own): at K = 2 the result is sync's
    bit for bit, here with sync run in-process on the fake backend."""
    ring = _run(train_allreduce_fn, "ray", hard_blobs_dataset, master_epochs=2)
    sync = _run(train_sync, FakeBackend(), hard_blobs_dataset, master_epochs=2)
    assert [r["round"] for r in ring.history] == [1, 2, 3, 4]
    assert all(r["ring_bytes"] > 0 for r in ring.history)
    for a, b in zip(ring.weights, sync.weights):
        np.testing.assert_array_equal(a, b)


def test_the_readmes_subclass_trains_on_ray(ray_cluster):
    """The README's TrainerActor subclass, with no framework adapter
    (test_readme_hooks.py's contract), on Ray actors: the weights of the in-process run,
    bit for bit."""
    options = dict(workers=2, master_epochs=2, rounds_per_epoch=2, trainer_cls=ReadmeTrainer,
                   overlap=True, progress=False, seed=7)
    on_ray = train_sync(readme_model_fn(), hard_blobs_dataset, backend="ray", **options)
    in_process = train_sync(readme_model_fn(), hard_blobs_dataset, backend=FakeBackend(),
                            **options)
    assert on_ray.framework is None and on_ray.history[-1]["test_accuracy"] > 0.5
    for a, b in zip(on_ray.weights, in_process.weights):
        np.testing.assert_array_equal(a, b)


def train_allreduce_fn(model_fn, dataset, **options):
    return train(model_fn, dataset, "allreduce", **options)


@pytest.mark.parametrize("spec", ["int8:ef", ("fp16", "topk:0.1")])
def test_compression_on_ray_matches_the_other_backends(ray_cluster, spec):
    on_ray = _run(train_sync, "ray", hard_blobs_dataset, compression=spec)
    in_process = _run(train_sync, FakeBackend(), hard_blobs_dataset, compression=spec)
    for a, b in zip(on_ray.weights, in_process.weights):
        np.testing.assert_array_equal(a, b)
    assert on_ray.history[-1]["bytes_received"] < 0.5 * _run(
        train_sync, FakeBackend(), hard_blobs_dataset).history[-1]["bytes_received"]


@pytest.mark.parametrize("scheme,options", [
    ("allreduce", dict(compression="int4")),
    ("allreduce", dict(overlap=True, fragments=2, compression="int8:ef")),
    ("sync", dict(overlap=True, fragments=2, compression="int4:ef")),
])
def test_compressed_and_streamed_runs_on_ray_equal_in_process(ray_cluster, scheme, options):
    """The ring's codec per hop, and streamed rounds (with allreduce, the collective on
    each trainer's own thread, calling its neighbour through Ray while it trains): bit
    for bit the in-process run."""
    fn = train_allreduce_fn if scheme == "allreduce" else train_sync
    on_ray = _run(fn, "ray", hard_blobs_dataset, **options)
    in_process = _run(fn, FakeBackend(), hard_blobs_dataset, **options)
    for a, b in zip(on_ray.weights, in_process.weights):
        np.testing.assert_array_equal(a, b)
    assert on_ray.history[-1]["test_accuracy"] > 0.5


@pytest.mark.parametrize("scheme", ["async", "easgd", "downpour"])
def test_asynchronous_schemes_compress_on_ray(ray_cluster, scheme):
    """Weights down as fp16, deltas up as int4 with each trainer's error feedback. The
    order of updates follows the trainers' timing: no bit-for-bit comparison here."""
    def run(backend, **options):
        return train(MODEL, blobs_dataset, scheme, backend=backend, workers=2, master_epochs=3,
                     trainer_cls=NumpyTrainer, progress=False, seed=7, **options)

    coded = run("ray", compression=("fp16", "int4:ef"))
    plain = run(FakeBackend())
    assert [r["epoch"] for r in coded.history] == [1, 2, 3]
    assert sum(r["samples"] for r in coded.history) == 3 * 400
    assert coded.history[-1]["test_accuracy"] > 0.5
    up = sum(r["bytes_received"] for r in coded.history[1:])
    assert up < sum(r["bytes_received"] for r in plain.history[1:]) / 5


def test_async_finishes_on_both_backends(ray_cluster):
    for backend in ("ddlf", "ray"):
        result = _run(train_async, backend, master_epochs=3)
        assert [r["epoch"] for r in result.history] == [1, 2, 3], backend
        assert sum(r["samples"] for r in result.history) == 3 * 400, backend
        assert result.history[-1]["test_accuracy"] > 0.5, backend


def test_a_sigkilled_ray_trainer_is_replaced_as_on_ddlf(ray_cluster):
    """As tests/apps/test_training_faults.py does on DDLF: trainer 1 SIGKILLs its own
    process in its second fit (once: the fixture's kill directory holds the marker)."""
    result = _run(train_sync, "ray", hard_blobs_dataset, master_epochs=3,
                  batch_size=25,   # whole batches cut 600 rows into 150s
                  trainer_cls=SigkillOnce)
    killed_pid = int((ray_cluster.kill_dir / "killed").read_text())   # it really happened
    assert [r["round"] for r in result.history] == [1, 2, 3, 4, 5, 6]
    lost = _kinds(result, "trainer_lost")
    joined = _kinds(result, "trainer_joined")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and lost[0]["round"] == 2
    assert "ActorDiedError" in lost[0]["detail"]
    # The node is Ray's: the trainer asked its own runtime where it runs.
    assert lost[0]["node"] in {n["NodeID"] for n in ray.nodes()}
    # Its replacement (a new Ray worker process: slower to start than DDLF's) joins
    # when it is up, which may be after the last round of so short a run.
    assert [e["trainer"] for e in joined] in ([], [1])
    assert all(f"pid {killed_pid}" not in e["detail"] for e in joined)
    h = result.history
    assert h[0]["workers"] == 2 and h[1]["workers"] == 1 and h[1]["samples"] == 150
    assert not psutil.pid_exists(killed_pid) or \
        psutil.Process(killed_pid).status() == psutil.STATUS_ZOMBIE


def test_ray_kill_from_outside_is_a_loss_and_async_goes_on(ray_cluster, monkeypatch):
    """``ray.kill`` of a trainer mid-run, as an operator would: the pool sees DDLF's
    ActorDiedError, replaces the trainer, and the run finishes with every sample."""
    from ddlf_actors.apps.callbacks import Callback
    from ddlf_actors.apps.schemes.pool import TrainerPool

    pools = []
    real_start = TrainerPool.start

    def start_and_keep(self):      # the run's pool, to reach its trainers' handles
        pools.append(self)
        return real_start(self)

    monkeypatch.setattr(TrainerPool, "start", start_and_keep)

    class KillAfterFirstEpoch(Callback):
        killed = None

        def on_row(self, row, run):
            if self.killed is None:
                self.killed = pools[0].slots[1].info["pid"]
                ray.kill(pools[0].slots[1].handle)

    killer = KillAfterFirstEpoch()
    result = _run(train_async, "ray", master_epochs=4, callbacks=[killer])
    assert killer.killed is not None
    assert [r["epoch"] for r in result.history] == [1, 2, 3, 4]
    lost = _kinds(result, "trainer_lost")
    assert len(lost) == 1 and lost[0]["trainer"] == 1 and "ActorDiedError" in lost[0]["detail"]
    joined = _kinds(result, "trainer_joined")
    assert all(f"pid {killer.killed}" not in e["detail"] for e in joined)
    assert sum(r["samples"] for r in result.history) == 4 * 400


def test_ray_errors_become_ddlf_errors(ray_cluster):
    backend = backends.select("ray")

    class Fails:
        def __init__(self):
            raise ZeroDivisionError("on purpose")

        def ping(self):
            return 1

    class Fine:
        def ping(self):
            return os.getpid()

    broken = backend.remote(Fails, num_cpus=0).remote()
    with pytest.raises(ActorDiedError) as e:
        backend.get(broken.ping.remote())
    assert e.value.cause is not None and "on purpose" in str(e.value)   # a failed start
    fine = backend.remote(Fine, num_cpus=0).remote()
    assert backend.get(fine.ping.remote()) > 0
    backend.kill(fine)
    with pytest.raises(ActorDiedError) as e:
        # Ray's kill takes effect asynchronously: a call sent right after may still run.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            backend.get(fine.ping.remote())
            time.sleep(0.05)
    assert e.value.cause is None                                          # a loss
    ready, rest = backend.wait([backend.put(1), backend.put(2)], num_returns=2, timeout=5)
    assert len(ready) == 2 and not rest
    assert {n["node_id"] for n in backend.nodes()} == {n["NodeID"] for n in ray.nodes()}


def test_ray_actors_of_classes_with_async_methods_run_calls_in_order(ray_cluster):
    """TrainerActor has async methods (the Cluster API's, allreduce's deliver_chunk),
    which would make it an async actor on Ray, where a call waiting for its argument lets
    later calls pass. The backend keeps DDLF's order: each plain call runs after the one
    submitted before it, and the async methods run meanwhile, one at a time, as on DDLF's
    event loop (a chunk must reach a trainer busy in its collective)."""
    backend = backends.select("ray")

    class Log:
        def __init__(self):
            self.seen = []

        async def note_async(self, x):
            self.seen.append(x)
            return list(self.seen)

        def note(self, x):
            self.seen.append(x)
            return list(self.seen)

    @ray.remote(num_cpus=0)
    def late(x):
        time.sleep(0.5)
        return x

    log = backend.remote(Log, num_cpus=0).remote()
    backend.get(log.note.remote(0))                  # started
    first = log.note.remote(late.remote(1))          # its argument arrives in 0.5 s
    second = log.note.remote(2)
    third = log.note_async.remote(3)
    first, second, third = backend.get([first, second, third])
    plain = [x for x in second if x != 3]
    assert plain == [0, 1, 2] and first[-1] == 1     # the plain calls, in order
    # Ray starts one caller's calls in the order they were sent, so this one waited for
    # `first`'s argument too; calls from another caller (a ring neighbour's chunks) run
    # while a plain call runs: test_allreduce_on_ray_equals_sync.
    assert third[-1] == 3
    trainer = backend.remote(NumpyTrainer, num_cpus=0).remote(MODEL, blobs_dataset)
    # The Cluster API on a Ray trainer (a lambda: pickled by value, Ray's workers do not
    # import this test module).
    assert backend.get(trainer.run_method.remote(lambda self, a: self.index + a,
                                                 {"a": 5})) == 5
    backend.kill(trainer)
    backend.kill(log)


def test_cli_backend_and_address_are_checked_first():
    from ddlf_actors.apps import cli

    def check(*argv):
        args = cli._parser().parse_args(["run", *argv])
        cli._check_args(args)
        return args

    with pytest.raises(cli._UsageError, match="Ray Client address: add --backend ray"):
        check("--address", "ray://head:10001")
    with pytest.raises(cli._UsageError, match="takes none"):
        check("--backend", "ray", "--token-file", "/dev/null")
    with pytest.raises(cli._UsageError, match="with --backend ray use auto"):
        check("--backend", "ray", "--address", "head")
    for ok in ("auto", "ray://head:10001", "10.0.0.5:6379"):
        assert check("--backend", "ray", "--address", ok).backend == "ray"


def test_an_unreachable_ray_address_fails_in_seconds_naming_it():
    """Ray retries a GCS that does not answer for minutes; the probe fails at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]            # closed once the block ends
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ray_session.RayUnreachableError, match=f"127.0.0.1:{port}.*ray start"):
            ray_session._probe(address)
    with pytest.raises(ValueError, match="use 'auto'"):
        ray_session._probe("head-without-port")


def test_bad_backend_names_are_refused():
    with pytest.raises(ValueError, match="backend must be"):
        train_sync(MODEL, blobs_dataset, backend="spark")
    with pytest.raises(ValueError, match="backend must be"):
        ddlf.init(backend="spark")
    with pytest.raises(ValueError, match="backend must be"):
        backends.select("spark")
