"""runtime/node/: the worker pool and the log tailer, with no process.

The pool is driven through a fake launcher (the only part that touches processes); the
tailer reads real files in a temporary folder.
"""

from __future__ import annotations

import asyncio
import os
import select
import sys

import pytest

from ddlf_actors.runtime import config
from ddlf_actors.runtime.errors import DDLFError
from ddlf_actors.runtime.node import LogTailer, WorkerPool, WorkerProc
from ddlf_actors.runtime.states import WorkerState
from ddlf_actors.runtime.wire.conninfo import ConnInfo
from ddlf_actors.runtime.wire.taskgroup import TaskGroup


class FakeLauncher:
    """Records what the pool asks of processes; the test says when they are up or exit."""

    def __init__(self, fail: bool = False):
        self.started: list = []
        self.killed: list = []
        self.closed: list = []
        self.fail = fail
        self.exit_codes: dict = {}
        self._pids = iter(range(1000, 2000))

    async def start(self, w, on_exit):
        if self.fail:
            raise DDLFError("could not start a worker process: no forkserver")
        w.pid = next(self._pids)
        self.started.append(w)
        w.process = on_exit   # how the test makes it exit: w.process(w)

    def kill(self, w):
        self.killed.append(w.worker_id)

    def reap(self, w):
        return self.exit_codes.get(w.worker_id, -9)

    def close(self, w):
        self.closed.append(w.worker_id)

    async def join(self, w, timeout):
        pass


class FakeConn:
    def __init__(self):
        self.info = ConnInfo()
        self.closed = False

    def close(self):
        self.closed = True


def _pool(loop, launcher, prestart=2, on_exit=None, cap=4):
    return WorkerPool(loop, launcher, TaskGroup(loop, "test"), "/logs", idle_task_cap=cap,
                      on_exit=on_exit, prestart=prestart)


async def _settle():
    for _ in range(5):
        await asyncio.sleep(0)


def _announce(pool, w):
    return pool.ready(w.worker_id, w.pid, f"127.0.0.1:{w.pid}", FakeConn())


def _run(scenario):
    async def main():
        return await asyncio.wait_for(scenario(asyncio.get_running_loop()), 10)
    return asyncio.run(main())


def test_the_pool_keeps_workers_started_ahead_of_need():
    async def scenario(loop):
        launcher = FakeLauncher()
        pool = _pool(loop, launcher, prestart=2)
        pool.refill()
        await _settle()
        states = [w.state for w in pool.workers.values()]
        for w in list(pool.workers.values()):
            _announce(pool, w)
        await _settle()
        idle = list(pool.idle_fresh)
        pool.refill()   # enough idle: starts none
        await _settle()
        return states, idle, pool, launcher

    states, idle, pool, launcher = _run(scenario)
    assert states == [WorkerState.STARTING] * 2
    assert len(idle) == 2 and all(w.state is WorkerState.IDLE for w in idle)
    assert len(launcher.started) == 2
    assert all(w.log_prefix == os.path.join("/logs", f"worker-{w.worker_id}") for w in idle)


def test_a_fresh_worker_is_claimed_and_replaced():
    async def scenario(loop):
        launcher = FakeLauncher()
        pool = _pool(loop, launcher, prestart=1)
        pool.refill()
        await _settle()
        (first,) = pool.workers.values()
        _announce(pool, first)
        await _settle()
        got = await pool.fresh()
        await _settle()
        return got, first, pool, launcher

    got, first, pool, launcher = _run(scenario)
    assert got is first and got.state is WorkerState.CLAIMED
    assert len(launcher.started) == 2   # another started to take its place
    assert got not in pool.idle_fresh


def test_with_none_idle_a_claim_waits_for_a_worker_to_start():
    async def scenario(loop):
        pool = _pool(loop, FakeLauncher(), prestart=0)
        claim = asyncio.ensure_future(pool.fresh())
        await _settle()
        assert not claim.done()
        (w,) = pool.workers.values()
        _announce(pool, w)
        return await claim, w

    got, w = _run(scenario)
    assert got is w and got.state is WorkerState.CLAIMED


def test_a_worker_that_cannot_start_fails_its_claim_and_is_forgotten():
    async def scenario(loop):
        pool = _pool(loop, FakeLauncher(fail=True), prestart=0)
        with pytest.raises(DDLFError, match="could not start a worker process"):
            await pool.fresh()
        return pool.workers

    assert _run(scenario) == {}


def test_task_workers_are_pooled_by_runtime_env_and_bounded():
    async def scenario(loop):
        launcher = FakeLauncher()
        pool = _pool(loop, launcher, prestart=0, cap=2)
        workers = []
        for _ in range(3):
            claim = asyncio.ensure_future(pool.fresh())
            await _settle()
            w = next(w for w in pool.workers.values() if w.state is WorkerState.CLAIMED
                     and w not in workers)
            _announce(pool, w)
            workers.append(await claim)
        a, b, c = workers
        a.env_key, b.env_key, c.env_key = "env1", "env1", "env2"
        for w in workers:
            w.state = WorkerState.TASK
            pool.park_task_worker(w)
        return workers, pool, launcher

    (a, b, c), pool, launcher = _run(scenario)
    # Over the cap of 2: the oldest idle worker of another env than the one just parked
    # is ended; env2's worker stays.
    assert launcher.killed == [a.worker_id]
    assert pool.idle_task == {"env1": [b], "env2": [c]}
    assert pool.take_idle_task("env2") is c and pool.take_idle_task("env2") is None


def test_an_exit_is_booked_once_and_handed_to_the_node():
    seen = []

    async def scenario(loop):
        launcher = FakeLauncher()
        pool = _pool(loop, launcher, prestart=1,
                     on_exit=lambda w, prev, code: seen.append((w.worker_id, prev, code)))
        pool.refill()
        await _settle()
        (w,) = pool.workers.values()
        _announce(pool, w)
        await _settle()
        conn = w.conn
        conn.info.worker = w
        launcher.exit_codes[w.worker_id] = 3
        w.process(w)   # its process ends
        w.process(w)   # its sentinel fired twice: nothing more happens
        await _settle()
        return w, conn, pool, launcher

    w, conn, pool, launcher = _run(scenario)
    assert seen == [(w.worker_id, WorkerState.IDLE, 3)]
    assert w.state is WorkerState.DEAD and w.exited and w not in pool.idle_fresh
    assert w.worker_id not in pool.workers
    assert conn.closed and conn.info.worker is None and w.conn is None   # no cycle left
    assert launcher.closed == [w.worker_id]
    assert len(launcher.started) == 2   # replaced


def test_a_worker_that_exits_while_starting_fails_its_claim():
    async def scenario(loop):
        pool = _pool(loop, FakeLauncher(), prestart=0)
        claim = asyncio.ensure_future(pool.fresh())
        await _settle()
        (w,) = pool.workers.values()
        w.process(w)
        with pytest.raises(DDLFError, match="exited during start-up"):
            await claim

    _run(scenario)


def test_kill_all_kills_every_live_worker_and_empties_the_idle_lists():
    async def scenario(loop):
        launcher = FakeLauncher()
        pool = _pool(loop, launcher, prestart=3)
        pool.refill()
        await _settle()
        for w in list(pool.workers.values()):
            _announce(pool, w)
        await _settle()
        await pool.kill_all()
        return pool, launcher

    pool, launcher = _run(scenario)
    assert sorted(launcher.killed) == sorted(pool.workers)
    assert pool.idle_fresh == [] and pool.idle_task == {}


# -- the log tailer ---------------------------------------------------------------------------
class FakeLoop:
    """The loop calls the tailer makes, recorded; nothing runs unless the test runs it."""

    def __init__(self):
        self.readers: dict = {}
        self.timers: list = []

    def add_reader(self, fd, cb, *args):
        self.readers[fd] = (cb, args)

    def remove_reader(self, fd):
        return self.readers.pop(fd, None) is not None

    def call_later(self, delay, cb, *args):
        handle = _Timer(cb, args)
        self.timers.append(handle)
        return handle

    def run_timers(self):
        timers, self.timers = self.timers, []
        for t in timers:
            if not t.cancelled:
                t.cb(*t.args)


class _Timer:
    def __init__(self, cb, args):
        self.cb, self.args, self.cancelled = cb, args, False

    def cancel(self):
        self.cancelled = True


class FakeBackground:
    def __init__(self):
        self.spawned = []

    def spawn(self, coro):
        self.spawned.append(coro)
        coro.close()


def _worker(tmp_path, wid="w1", pid=41):
    # The tailer never looks at the start-up future; one from a closed loop stays inert.
    loop = asyncio.new_event_loop()
    w = WorkerProc(wid, str(tmp_path / f"worker-{wid}"), loop.create_future())
    loop.close()
    w.pid = pid
    return w


def _write(w, suffix, text):
    with open(w.log_prefix + suffix, "a") as f:
        f.write(text)


def test_output_is_read_by_line_with_whose_it_is(tmp_path):
    sent = []
    w = _worker(tmp_path)
    tailer = LogTailer(FakeLoop(), str(tmp_path), {w.worker_id: w}, sent.append,
                       FakeBackground())
    _write(w, ".out", "\x00ddlf:actor:Counter:job7\nhello\nhalf a li")
    _write(w, ".err", "oops\n")
    assert tailer.drain()
    assert sent == [[("job7", "Counter", 41, "out", "hello"), ("job7", "Counter", 41, "err", "oops")]]
    _write(w, ".out", "ne\n\x00ddlf:task:f:\nfrom f\n")
    assert tailer.drain()
    assert sent[1] == [("job7", "Counter", 41, "out", "half a line"),
                       (None, "f", 41, "out", "from f")]
    assert not tailer.drain() and len(sent) == 2   # nothing new: nothing sent


def test_an_exited_workers_last_output_is_sent_and_forgotten(tmp_path):
    sent = []
    w = _worker(tmp_path)
    workers = {w.worker_id: w}
    tailer = LogTailer(FakeLoop(), str(tmp_path), workers, sent.append, FakeBackground())
    _write(w, ".out", "first\n")
    tailer.drain()
    _write(w, ".out", "last words\n")
    del workers[w.worker_id]   # the pool forgets it before the node handles the exit
    tailer.finish(w)
    assert sent[-1] == [(None, "worker", 41, "out", "last words")]
    assert w.worker_id not in tailer._tails


def test_polling_backs_off_while_workers_are_quiet(tmp_path, monkeypatch):
    sleeps = []

    async def sleep(delay):
        sleeps.append(delay)
        if len(sleeps) == 6:
            tailer.close()

    monkeypatch.setattr(config, "LOG_POLL_S", 0.05)
    monkeypatch.setattr(config, "LOG_POLL_MAX_S", 0.4)
    w = _worker(tmp_path)
    tailer = LogTailer(FakeLoop(), str(tmp_path), {w.worker_id: w}, lambda r: None,
                       FakeBackground())
    monkeypatch.setattr(asyncio, "sleep", sleep)
    _write(w, ".out", "busy\n")
    asyncio.run(tailer._poll())
    assert sleeps == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]


# -- the log tailer, event-driven (inotify, Linux) ----------------------------------------------
needs_inotify = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")


def _readable(fd, timeout=5.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def _events_tailer(tmp_path, workers, sent):
    loop = FakeLoop()
    background = FakeBackground()
    tailer = LogTailer(loop, str(tmp_path), workers, sent.append, background)
    tailer.start()
    assert tailer.event_driven, "inotify refused (fs.inotify.max_user_instances reached?)"
    return tailer, loop, background


@needs_inotify
def test_a_quiet_node_does_no_work(tmp_path):
    w = _worker(tmp_path)
    tailer, loop, background = _events_tailer(tmp_path, {w.worker_id: w}, [])
    try:
        # Nothing scheduled, nothing polled: only the inotify descriptor, waited on.
        assert list(loop.readers) == [tailer._watch.fd]
        assert loop.timers == [] and background.spawned == []
        assert not _readable(tailer._watch.fd, 0.2)
    finally:
        tailer.close()
    assert loop.readers == {}


@needs_inotify
def test_a_write_wakes_the_tailer_which_sends_the_burst_in_one_batch(tmp_path):
    sent = []
    w1, w2 = _worker(tmp_path, "w1", 41), _worker(tmp_path, "w2", 42)
    tailer, loop, _ = _events_tailer(tmp_path, {"w1": w1, "w2": w2}, sent)
    try:
        fd = tailer._watch.fd
        _write(w1, ".out", "one\n")
        assert _readable(fd)
        woken, args = loop.readers[fd]
        woken(*args)
        # Gathering: no longer listening, one flush due after LOG_BATCH_S.
        assert fd not in loop.readers and len(loop.timers) == 1
        _write(w1, ".out", "two\n")
        _write(w2, ".err", "three\n")
        (tmp_path / "unrelated.txt").write_text("not a worker's\n")
        loop.run_timers()
        assert sorted(sent[0]) == [(None, "worker", 41, "out", "one"),
                                   (None, "worker", 41, "out", "two"),
                                   (None, "worker", 42, "err", "three")]
        assert len(sent) == 1
        assert fd in loop.readers and loop.timers == []   # listening again
        assert not _readable(fd, 0.2)   # the events of the batch were consumed
    finally:
        tailer.close()


@needs_inotify
def test_output_past_a_chunk_is_read_on_without_another_write(tmp_path):
    sent = []
    w = _worker(tmp_path)
    tailer, loop, _ = _events_tailer(tmp_path, {w.worker_id: w}, sent)
    try:
        line = "x" * 1023 + "\n"
        _write(w, ".out", line * 1500)   # 1.5 MiB: more than one read takes
        assert _readable(tailer._watch.fd)
        woken, args = loop.readers[tailer._watch.fd]
        woken(*args)
        loop.run_timers()
        # The rest is read at the next batch, with no event to wait for.
        assert tailer._watch.fd not in loop.readers and len(loop.timers) == 1
        loop.run_timers()
        assert sum(len(batch) for batch in sent) == 1500
        assert tailer._watch.fd in loop.readers
    finally:
        tailer.close()


def test_without_events_the_tailer_polls(tmp_path):
    loop, background = FakeLoop(), FakeBackground()
    tailer = LogTailer(loop, str(tmp_path), {}, lambda r: None, background, events=False)
    tailer.start()
    assert not tailer.event_driven and loop.readers == {}
    assert [c.__name__ for c in background.spawned] == ["_poll"]


@pytest.mark.parametrize("name,wid", [("worker-ab12.out", "ab12"), ("worker-ab12.err", "ab12"),
                                      ("worker-ab12.log", None), ("runtime_env", None),
                                      ("head.err", None)])
def test_only_worker_output_files_count(name, wid):
    from ddlf_actors.runtime.node.logs import _worker_id

    assert _worker_id(name) == wid


@needs_inotify
def test_lost_events_make_the_tailer_read_every_worker(tmp_path):
    sent = []
    w1, w2 = _worker(tmp_path, "w1", 41), _worker(tmp_path, "w2", 42)
    _write(w2, ".out", "quiet one\n")   # before the watch: no event names it
    tailer, loop, _ = _events_tailer(tmp_path, {"w1": w1, "w2": w2}, sent)
    try:
        limit = int(open("/proc/sys/fs/inotify/max_queued_events").read())
        fds = [os.open(w1.log_prefix + s, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for s in
               (".out", ".err")]
        try:
            for _ in range(limit // 2 + 100):   # alternating files: the kernel cannot merge
                os.write(fds[0], b"o\n")
                os.write(fds[1], b"e\n")
        finally:
            for fd in fds:
                os.close(fd)
        woken, args = loop.readers[tailer._watch.fd]
        woken(*args)
        loop.run_timers()
        lines = [r for batch in sent for r in batch]
        # No event named w2's file (the kernel dropped some): it was read all the same.
        assert (None, "worker", 42, "out", "quiet one") in lines
    finally:
        tailer.close()


def test_a_worker_marks_whose_output_follows_only_when_it_changes(capsys, monkeypatch):
    from ddlf_actors.runtime.worker import output

    monkeypatch.setattr(output, "_last_marker", "")
    for text in ("task:f:j1", "task:f:j1", "task:g:j1", "task:f:j1", "task:f:j1"):
        output.log_marker(text)
    out = capsys.readouterr().out
    assert out.split("\n")[:-1] == [f"{output.MARKER}task:{x}:j1" for x in ("f", "g", "f")]
