"""Same-host objects in shared memory: create, map, recycle, unlink and sweep segments.

A *segment* is a plain file in ``<root>/ddlf-<uid>-<pidns>/`` (root: ``/dev/shm``) that
holds the pickle-5 out-of-band buffers of one large object, 64-byte aligned; the small
pickle payload still travels in the frame. Its name starts with the creator's pid and
start time (``<pid>-<start>-<n>``), so a sweep can tell a dead creator's segments by
their names alone.

* **Writing.** ``put`` (and an actor or task returning a large value to a caller on the
  same host) copies the buffers once into a segment: that copy replaces ``put``'s
  snapshot. The creator keeps a writable mapping of each of its segments for reuse.
* **Reading.** A receiver on the same host opens the segment by name, takes a shared
  ``flock`` on it and maps it read-only: numpy arrays unpickled from it are read-only
  views of the mapping, with no copy. ``mmap`` keeps a duplicate of the descriptor, so
  the shared lock lives exactly as long as the mapping (the last array over it), and
  the kernel drops it if the process dies.
* **Handing over.** A descriptor sent to a peer is *pinned* by the sender (it keeps a
  reference to the object's mapped segments) until the peer acknowledges that it has
  mapped it (``SHM_ACK``), so a segment can never be recycled or unlinked between
  "sent" and "mapped".
* **Recycling.** Fresh shared-memory pages cost far more than the copy itself (page
  faults and zeroing: ~100 ms per 100 MB here, against 12 ms for the copy). A creator
  therefore reuses a segment once nobody uses it any more: no view of it is alive in
  the creator and an exclusive ``flock`` succeeds (no other process maps it). Idle
  segments are unlinked after ``SHM_POOL_IDLE_S`` or when idle ones exceed
  ``SHM_POOL_BYTES``; all of a process's segments are unlinked at ``shutdown``/exit.
* **Unlinking** never invalidates a mapping (POSIX): a receiver that still holds an
  array keeps it, valid and unchanged, until it drops it; only the name disappears.
* **Sweeping.** Node daemons call :func:`sweep` every ``SHM_SWEEP_INTERVAL_S`` and as they
  stop: it unlinks the segments whose creator has exited (SIGKILL), reaped or not.
* **Bound.** New segments are created only while all of this user's segments stay
  within ``SHM_CAPACITY`` (30 % of RAM by default) and the file system keeps
  ``_RESERVE`` bytes free. Past it, objects take the old path: an in-process snapshot
  for ``put``, the TCP stream for results (logged once).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import mmap
import os
import pickle
import threading
import time
import weakref
from typing import TYPE_CHECKING

import numpy as np

from . import config
from .wire import protocol

if TYPE_CHECKING:
    from .wire.connection import Connection

try:
    import fcntl
    _HAVE_FLOCK = True
except ImportError:  # Windows: no flock, no /dev/shm; the path stays off (so fcntl is
    _HAVE_FLOCK = False  # only used once a store exists, which needs _HAVE_FLOCK)

__all__ = ["enabled", "local_info", "same_host", "store", "ship", "wrap_result",
           "client_result", "client_hello", "worker_object", "on_ack", "send_hello", "wait_hello",
           "release_all", "sweep", "reset"]

log = logging.getLogger("ddlf.shm")

_ALIGN = 64
_RESERVE = 64 << 20        # bytes always left free on the shared-memory file system
_JANITOR_S = 1.0
_HELLO_TIMEOUT_S = 5.0


class _Block:
    """A segment this process created: its file, a writable mapping, who uses it."""

    __slots__ = ("name", "path", "size", "fd", "mm", "use", "used_at")

    def __init__(self, name, path, size, fd, mm):
        self.name = name
        self.path = path
        self.size = size
        self.fd = fd
        self.mm = mm
        self.use = None          # weakref to the ndarray all views of the current use derive from
        self.used_at = 0.0


class _Store:
    def __init__(self, root: str):
        self.root = root
        uid = os.getuid()
        try:
            pidns = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            pidns = 0
        self.rel = f"ddlf-{uid}-{pidns}"
        self.dir = os.path.join(root, self.rel)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        config.check_private_dir(self.dir)
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
        except OSError:
            boot = "?"
        st = os.stat(root)
        self.host = config.SHM_HOST_ID or f"{boot}:{st.st_dev}:{st.st_ino}:{root}:{uid}"
        self.tag = f"{os.getpid()}-{_start_time(os.getpid())}"
        self.lock = threading.Lock()
        self.blocks: list[_Block] = []
        self.seq = itertools.count(1)
        self.janitor = False
        self.full_logged = False


_store: _Store | None = None
_state_lock = threading.Lock()
_tried = False
# id(view) -> (weakref(view), segment name, offset, length): lets a sender recognise an
# object's buffers as views of a segment (and describe them) without changing its type.
_views: dict = {}


def _get() -> _Store | None:
    global _store, _tried
    if _tried:
        return _store
    with _state_lock:
        if not _tried:
            if config.SHM_ENABLED and _HAVE_FLOCK and os.path.isdir(config.SHM_ROOT):
                try:
                    _store = _Store(config.SHM_ROOT)
                    sweep(_store)   # whoever starts first cleans up after killed processes
                except Exception as e:
                    log.warning("shared memory for same-host objects is off: %s", e)
                    _store = None
            _tried = True
    return _store


def reset() -> None:
    """Forget this process's store without touching its files (tests)."""
    global _store, _tried, _copier
    with _state_lock:
        _store = None
        _tried = False
        _copier = None   # its threads do not survive a fork


def _after_fork() -> None:
    # No lock here: another thread of the parent may have held it at fork time.
    global _store, _tried, _copier, _state_lock
    _state_lock = threading.Lock()
    _store, _tried, _copier = None, False, None


os.register_at_fork(after_in_child=_after_fork)


def enabled() -> bool:
    return _get() is not None


def local_info():
    """What a process says about itself in its hello: its shared-memory host key."""
    s = _get()
    return s.host if s is not None else None


def same_host(key) -> bool:
    s = _get()
    return s is not None and key is not None and key == s.host


def _start_time(pid: int) -> int:
    """The start of ``pid`` in a segment's name: hundredths of ``process_identity``'s
    (ticks since boot on Linux), steady when the wall clock moves."""
    from . import process_identity

    return round(process_identity.start_time(pid) * 100)


# -- creating and reusing segments -------------------------------------------------------------
def _idle(b: _Block) -> bool:
    if b.use is not None and b.use() is not None:
        return False
    try:
        fcntl.flock(b.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False   # another process still maps it
    fcntl.flock(b.fd, fcntl.LOCK_UN)
    return True


def _unlink(s: _Store, b: _Block) -> None:
    s.blocks.remove(b)
    try:
        os.unlink(b.path)
    except OSError:
        pass
    try:
        os.close(b.fd)
    except OSError:
        pass
    try:
        b.mm.close()
    except (BufferError, ValueError):
        pass   # a view is still alive: the mapping goes with it


def _used_bytes(s: _Store) -> int:
    total = 0
    try:
        with os.scandir(s.dir) as it:
            for e in it:
                try:
                    total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


def _fits(s: _Store, nbytes: int) -> bool:
    if _used_bytes(s) + nbytes > config.SHM_CAPACITY:
        return False
    try:
        st = os.statvfs(s.dir)
        return st.f_bavail * st.f_frsize >= nbytes + _RESERVE
    except OSError:
        return False


def _alloc(s: _Store, nbytes: int):
    """A block of at least ``nbytes`` and a fresh writable ndarray over it, or None."""
    with s.lock:
        best = None
        for b in s.blocks:
            # Reuse a block up to twice the size asked for (plus a page).
            if nbytes <= b.size <= 2 * nbytes + mmap.PAGESIZE and (best is None or b.size < best.size):
                if _idle(b):
                    best = b
        if best is None:
            if not _fits(s, nbytes):
                for b in [b for b in s.blocks if _idle(b)]:
                    _unlink(s, b)
                if not _fits(s, nbytes):
                    if not s.full_logged:
                        s.full_logged = True
                        log.warning(
                            "shared-memory object store is full (%d MB of this user's segments, "
                            "limit DDLF_SHM_CAPACITY=%d MB, or %s is nearly full): objects that do "
                            "not fit are kept in-process and sent over TCP", _used_bytes(s) >> 20,
                            config.SHM_CAPACITY >> 20, s.root)
                    return None
            best = _create(s, nbytes)
            if best is None:
                return None
        base = np.frombuffer(best.mm, np.uint8)
        best.use = weakref.ref(base)
        best.used_at = time.monotonic()
        if not s.janitor:
            s.janitor = True
            threading.Thread(target=_janitor, args=(s,), name="ddlf-shm-janitor", daemon=True).start()
        return best, base


def _create(s: _Store, nbytes: int) -> _Block | None:
    size = max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
    name = f"{s.tag}-{next(s.seq)}-{os.urandom(3).hex()}"
    path = os.path.join(s.dir, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as e:
        log.warning("could not create a shared-memory segment %s: %s", path, e)
        return None
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        log.warning("could not map a shared-memory segment of %d bytes: %s", size, e)
        return None
    b = _Block(f"{s.rel}/{name}", path, size, fd, mm)
    s.blocks.append(b)
    return b


def _janitor(s: _Store) -> None:
    while True:
        time.sleep(_JANITOR_S)
        if _store is not s:
            return
        trim(s)


def trim(s: _Store | None = None) -> None:
    """Unlink idle blocks: those idle for ``SHM_POOL_IDLE_S``, and the oldest beyond
    ``SHM_POOL_BYTES`` of idle blocks."""
    s = s or _store
    if s is None:
        return
    now = time.monotonic()
    with s.lock:
        idle = sorted((b for b in s.blocks if _idle(b)), key=lambda b: b.used_at)
        kept = sum(b.size for b in idle)
        for b in idle:
            if now - b.used_at > config.SHM_POOL_IDLE_S or kept > config.SHM_POOL_BYTES:
                kept -= b.size
                _unlink(s, b)


def release_all() -> None:
    """Unlink every segment this process created (its mappings stay valid)."""
    s = _store
    if s is None:
        return
    with s.lock:
        for b in list(s.blocks):
            _unlink(s, b)


atexit.register(release_all)


# -- writing an object ---------------------------------------------------------------------------
def _register(view: memoryview, name: str, off: int, n: int) -> memoryview:
    key = id(view)

    def gone(_ref, key=key):
        entry = _views.get(key)
        if entry is not None and entry[0] is _ref:
            _views.pop(key, None)

    _views[key] = (weakref.ref(view, gone), name, off, n)
    return view


def _write(segs):
    """Copy the out-of-band buffers of ``segs`` into a segment; return (name, layout,
    read-only views), or None."""
    s = _get()
    if s is None or len(segs) < 2:
        return None
    bufs = [memoryview(b).cast("B") for b in segs[1:]]
    if sum(b.nbytes for b in bufs) < config.SHM_MIN_BYTES:
        return None
    layout, end = [], 0
    for b in bufs:
        end = -(-end // _ALIGN) * _ALIGN
        layout.append((end, b.nbytes))
        end += b.nbytes
    got = _alloc(s, end)
    if got is None:
        return None
    block, base = got
    views = []
    for (off, n), b in zip(layout, bufs):
        dst = base[off:off + n]
        _copy(dst, np.frombuffer(b, np.uint8))
        views.append(_register(memoryview(dst).toreadonly(), block.name, off, n))
    return block.name, layout, views


_copier = None
_PAR_MIN = 16 << 20     # buffers at least this large are copied by several threads


def _copy(dst, src) -> None:
    """``dst[:] = src``; large buffers in parallel chunks (as Ray's memcopy_threads)."""
    global _copier
    k = config.SHM_COPY_THREADS
    n = src.nbytes
    if k <= 1 or n < _PAR_MIN:
        np.copyto(dst, src)
        return
    if _copier is None:
        from concurrent.futures import ThreadPoolExecutor

        _copier = ThreadPoolExecutor(k - 1, thread_name_prefix="ddlf-shm-copy")
    step = -(-n // k // _ALIGN) * _ALIGN
    futs = [_copier.submit(np.copyto, dst[i:i + step], src[i:i + step]) for i in range(step, n, step)]
    np.copyto(dst[:step], src[:step])   # numpy releases the GIL while copying
    for f in futs:
        f.result()


def store(segs):
    """``put``: the object's segments with its buffers in shared memory, or None
    (shared memory off, object too small, or the bound reached)."""
    written = _write(segs)
    if written is None:
        return None
    return [bytes(segs[0]), *written[2]]


def _describe(segs):
    """(name, layout) when every buffer of ``segs`` is a registered view of one segment."""
    name, layout = None, []
    for v in segs[1:]:
        entry = _views.get(id(v))
        if entry is None or entry[0]() is not v or (name is not None and entry[1] != name):
            return None
        name = entry[1]
        layout.append((entry[2], entry[3]))
    return (name, layout) if name is not None else None


def _pin(conn: Connection, segs) -> bytes:
    pin = os.urandom(8)
    pins = conn.info.shm_pins
    if pins is None:
        pins = conn.info.shm_pins = {}
    pins[pin] = segs
    return pin


def ship(conn: Connection, obj_id: bytes, segs) -> bool:
    """Send an object to a same-host peer as a descriptor (``OBJ_SHM``); False if it must
    go by value (peer elsewhere, or the object is not in shared memory)."""
    if not conn.info.shm_peer or len(segs) < 2:
        return False
    desc = _describe(segs)
    if desc is None:
        return False
    s = _get()
    if s is None or not os.path.exists(os.path.join(s.root, desc[0])):
        return False   # e.g. a result whose creating worker died: send the bytes instead
    pin = _pin(conn, segs)
    conn.send_msg(protocol.OBJ_SHM, 0, [obj_id, segs[0], pickle.dumps((desc[0], pin, desc[1]))])
    return True


def wrap_result(conn: Connection, kind: int, segs):
    """A worker's reply: put a large return value for a same-host caller in shared memory."""
    if kind != protocol.RESULT_OK or len(segs) < 2 or not conn.info.shm_peer:
        return kind, segs
    try:
        written = _write(segs)
    except Exception as e:   # never lose a result to the fast path: send it by value
        log.warning("could not write a result to shared memory: %s", e)
        written = None
    if written is None:
        return kind, segs
    name, layout, views = written
    # Pinned until the caller has mapped it; the creator may reuse it once the caller's
    # mapping is gone too.
    pin = _pin(conn, views)
    return protocol.RESULT_SHM, [segs[0], pickle.dumps((name, pin, layout))]


# -- reading an object ---------------------------------------------------------------------------
def _map(name: str, layout) -> list:
    s = _get()
    if s is None:
        raise OSError("shared memory is off in this process")
    rel, _, file = name.partition("/")
    if not rel.startswith("ddlf-") or not file or "/" in file or file.startswith("."):
        raise OSError(f"bad shared-memory segment name {name!r}")
    path = os.path.join(s.root, rel, file)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        for _attempt in range(50):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.001)
        else:
            raise OSError(f"shared-memory segment {name} is locked by its creator")
        size = os.fstat(fd).st_size
        # mmap keeps a duplicate of fd: the shared lock lives as long as the mapping.
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    base = np.frombuffer(mm, np.uint8)
    out = []
    for off, n in layout:
        if off < 0 or n < 0 or off + n > size:
            raise OSError(f"shared-memory segment {name} is smaller than its descriptor says")
        out.append(_register(base[off:off + n].data, name, off, n))
    return out


def _receive(conn: Connection, payload, desc):
    name, pin, layout = pickle.loads(desc)
    try:
        views = _map(name, layout)
    finally:
        if not conn.closed:
            conn.send_msg(protocol.SHM_ACK, 0, [pin])
    return [payload, *views]


def on_ack(conn: Connection, segs) -> None:
    pins = conn.info.shm_pins
    if pins is not None:
        pins.pop(bytes(segs[1]), None)


def client_result(conn: Connection, segs):
    """The caller's side of a ``RESULT_SHM`` frame (or a ``STREAM_ITEM`` holding one): its
    value mapped from shared memory, as ``(RESULT_OK, segs)``; ``(RESULT_ERR, segs)`` saying
    why if it cannot be mapped."""
    try:
        return protocol.RESULT_OK, [segs[0], *_receive(conn, segs[1], segs[2])]
    except Exception as e:
        from .errors import DDLFError
        from .wire.remote_error import encode_error

        err = DDLFError(f"the result could not be mapped from shared memory: {e}")
        return protocol.RESULT_ERR, [segs[0], *encode_error(err, f"pid {os.getpid()}")]


def client_hello(conn: Connection, data) -> None:
    """The caller's side of the worker's ``hello`` push: does it share our memory?"""
    info = conn.info
    info.shm_peer = same_host(data.get("shm"))
    waiter, info.hello_waiter = info.hello_waiter, None
    info.hello_seen = True
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


async def wait_hello(conn: Connection) -> None:
    """Wait (briefly) for the worker's hello, which says whether it shares our memory."""
    if conn.info.hello_seen or conn.closed:
        return
    import asyncio

    fut = conn.info.hello_waiter = conn.loop.create_future()
    deadline = time.monotonic() + _HELLO_TIMEOUT_S
    while not fut.done() and not conn.closed:   # the caller checks conn.closed after us
        if time.monotonic() > deadline:
            log.debug("no hello from %s: objects go to it over TCP", conn.peer)
            return
        try:
            await asyncio.wait_for(asyncio.shield(fut), 0.1)
        except asyncio.TimeoutError:
            pass


def send_hello(conn: Connection) -> None:
    """Worker: answer a caller's hello with ours (only callers that greet get one)."""
    from .wire.serialization import dumps

    conn.send_msg(protocol.PUSH, 0, dumps(("hello", {"shm": local_info()})))


def worker_object(conn: Connection, segs):
    """Worker: an ``OBJ_SHM`` frame. Returns (object id, segments), segments None if the
    segment could not be mapped."""
    obj_id = bytes(segs[1])
    try:
        return obj_id, _receive(conn, segs[2], segs[3])
    except Exception as e:
        import sys

        print(f"ddlf: could not map object {obj_id.hex()} from shared memory: {e}",
              file=sys.stderr, flush=True)
        return obj_id, None


# -- sweeping ------------------------------------------------------------------------------------
def sweep(s: _Store | None = None) -> int:
    """Unlink the segments whose creator (pid and start time in the name) is gone."""
    from . import process_identity

    s = s or _get()
    if s is None:
        return 0
    removed = 0
    alive: dict = {}
    try:
        names = os.listdir(s.dir)
    except OSError:
        return 0
    for name in names:
        parts = name.split("-")
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        key = (int(parts[0]), int(parts[1]))
        ok = alive.get(key)
        if ok is None:
            # Zombies and exiting processes are gone: a node wakes on its killed driver's
            # closed lifeline before the kernel marks the driver a zombie, and sweeps last.
            ok = (process_identity.is_running(key[0], key[1] / 100)
                  and not process_identity.is_exiting(key[0]))
            alive[key] = ok
        if not ok:
            try:
                os.unlink(os.path.join(s.dir, name))
                removed += 1
            except OSError:
                pass
    return removed
