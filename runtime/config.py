"""Tunable limits, read once from the environment so every process of a host agrees."""

from __future__ import annotations

import logging
import math
import os
import stat

from .errors import DDLFError

__all__ = ["MAX_FRAME_BYTES", "MAX_SEGMENTS", "HEARTBEAT_INTERVAL_S", "NODE_DEAD_AFTER_S",
           "NODE_DEAD_AFTER_MISSED", "NODE_REJOIN_TIMEOUT_S", "HANDSHAKE_TIMEOUT_S",
           "REJECT_LOG_INTERVAL_S", "MAX_LENT_TASKS_PER_NODE", "TASK_PIPELINE_DEPTH",
           "LEASE_IDLE_S", "ACTOR_CONNECT_TRIES", "WAIT_ACTOR_MAX_S", "WAIT_GROUP_MAX_S",
           "REMOVED_GROUPS_KEPT", "DEAD_ACTORS_KEPT", "IDLE_TASK_MIN_CAP", "GPU_WAIT_S",
           "PRESTART_WORKERS", "LOG_BATCH_S", "LOG_POLL_S", "LOG_POLL_MAX_S",
           "REJOIN_REFUSED_TRIES", "START_TIMEOUT_S", "session_root", "raise_open_file_limit"]

log = logging.getLogger("ddlf.config")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


# Largest frame a peer may declare. Checked before anything is allocated for it, so a
# hostile or corrupt length cannot make a process allocate gigabytes. 1 GiB by default:
# a 100 MB array passes with room to spare.
MAX_FRAME_BYTES = _env_int("DDLF_MAX_FRAME_BYTES", 1 << 30)
# Segments (pickle payload plus out-of-band buffers) one frame may carry.
MAX_SEGMENTS = _env_int("DDLF_MAX_SEGMENTS", 4096)
HEARTBEAT_INTERVAL_S = _env_float("DDLF_HEARTBEAT_INTERVAL_S", 1.0)
NODE_DEAD_AFTER_S = _env_float("DDLF_NODE_DEAD_AFTER_S", 10.0)
# The head judges a node by *missed heartbeat intervals*, counted on its own clock ticks,
# not by wall seconds since the last beat: a head whose loop was starved (CPU overload, a
# stop signal, a suspended laptop) then wakes up to one missed interval, not to "silent
# for 30 s" for every node at once. A node that dies closes its connection and is noticed
# at once; heartbeats only have to catch hangs and cut links, so they can be patient.
NODE_DEAD_AFTER_MISSED = max(1, math.ceil(NODE_DEAD_AFTER_S / HEARTBEAT_INTERVAL_S - 1e-9))
# A node that lost its head connection keeps trying to register again for this long
# (a head that refuses connections outright is taken to be gone much sooner).
NODE_REJOIN_TIMEOUT_S = _env_float("DDLF_NODE_REJOIN_TIMEOUT_S", 60.0)
# A server drops a peer that has not finished the handshake by then.
HANDSHAKE_TIMEOUT_S = _env_float("DDLF_HANDSHAKE_TIMEOUT_S", 5.0)
# Rejected connections are logged once per source, then summed up once per interval.
REJECT_LOG_INTERVAL_S = _env_float("DDLF_REJECT_LOG_INTERVAL_S", 10.0)
# A task waiting in get/wait lends its CPU to other work, so the node may start another
# worker. At most this many tasks per node lend at once; past it a waiting task keeps its
# CPU. Each extra worker costs about 30 MB RSS, so 32 bounds that at about 1 GB a node.
MAX_LENT_TASKS_PER_NODE = _env_int("DDLF_MAX_LENT_TASKS_PER_NODE", 32)

# -- the client core (core.py) --
# Tasks pipelined to one leased worker, once the head has said no CPU is free.
TASK_PIPELINE_DEPTH = max(1, _env_int("DDLF_TASK_PIPELINE_DEPTH", 16))
# An idle task lease goes back to the head after this long.
LEASE_IDLE_S = _env_float("DDLF_LEASE_IDLE_S", 0.5)
# Attempts to connect to an actor's address the head gave, before asking the head again.
ACTOR_CONNECT_TRIES = max(1, _env_int("DDLF_ACTOR_CONNECT_TRIES", 5))

# -- the head (head/) --
# The longest one wait_actor request waits for an actor to change; callers then ask again.
WAIT_ACTOR_MAX_S = _env_float("DDLF_WAIT_ACTOR_MAX_S", 30.0)
# Likewise for a wait_placement_group request.
WAIT_GROUP_MAX_S = _env_float("DDLF_WAIT_GROUP_MAX_S", 30.0)
# Removed placement groups placement_group_table() still lists (oldest dropped first).
REMOVED_GROUPS_KEPT = _env_int("DDLF_REMOVED_GROUPS_KEPT", 1000)
# Dead actors the head still answers for with why they died (wait_actor, list_actors);
# older ones are forgotten, as Ray's maximum_gcs_destroyed_actor_cached_count does. A dead
# record keeps no pickled class or arguments: about 1 KB each.
DEAD_ACTORS_KEPT = max(0, _env_int("DDLF_DEAD_ACTORS_KEPT", 10_000))

# -- node daemons (node/) --
# Idle task workers a node keeps across all runtime envs: at least this many (or 2 per CPU).
IDLE_TASK_MIN_CAP = _env_int("DDLF_IDLE_TASK_MIN_CAP", 4)
# How long a GPU demand waits for a GPU to be given back before it shares one.
GPU_WAIT_S = _env_float("DDLF_GPU_WAIT_S", 5.0)
# Idle fresh workers a node keeps started, so creating an actor does not start Python.
PRESTART_WORKERS = max(0, _env_int("DDLF_PRESTART_WORKERS", 2))
# Worker output a node reads as workers write it (inotify) is gathered this long after
# the first new line, so a burst of prints goes to the driver as one batch.
LOG_BATCH_S = _env_float("DDLF_LOG_BATCH_S", 0.05)
# Where inotify is not available, worker output is polled this often while workers print,
# backing off to LOG_POLL_MAX_S while they are quiet (the worst added delay for the first
# line after a quiet spell).
LOG_POLL_S = _env_float("DDLF_LOG_POLL_S", 0.05)
LOG_POLL_MAX_S = _env_float("DDLF_LOG_POLL_MAX_S", 0.4)
# A node that lost its head and is refused this many times in a row takes it to be gone.
REJOIN_REFUSED_TRIES = max(1, _env_int("DDLF_REJOIN_REFUSED_TRIES", 3))

# -- starting processes (process.py) --
# A head or node that has not printed its ready line by then is killed and reported.
START_TIMEOUT_S = _env_float("DDLF_START_TIMEOUT_S", 60.0)

# Same-host objects in shared memory (see shm_store). DDLF_SHM=0 turns the path off.
SHM_ENABLED = os.environ.get("DDLF_SHM", "1") not in ("0", "false", "no", "off")
SHM_ROOT = os.environ.get("DDLF_SHM_ROOT") or "/dev/shm"
# Objects whose out-of-band buffers add up to at least this go through shared memory.
SHM_MIN_BYTES = _env_int("DDLF_SHM_MIN_BYTES", 1 << 20)
# Bound on all of this user's segments on the host (30 % of RAM by default, like Ray's
# object store). Past it, objects fall back to the in-process / TCP path.
SHM_CAPACITY = _env_int("DDLF_SHM_CAPACITY", 0) or int(0.3 * (
    os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 8 << 30))
# A process keeps segments nobody uses any more for reuse (fresh shared-memory pages
# cost far more than the copy): at most this many bytes, for at most this long.
SHM_POOL_BYTES = _env_int("DDLF_SHM_POOL_BYTES", 1 << 30)
SHM_POOL_IDLE_S = _env_float("DDLF_SHM_POOL_IDLE_S", 10.0)
# Threads that copy one large buffer (>= 16 MB) into shared memory, as Ray's memcopy_threads.
SHM_COPY_THREADS = max(1, _env_int("DDLF_SHM_COPY_THREADS", min(4, os.cpu_count() or 1)))
# How often node daemons unlink the segments of processes that died.
SHM_SWEEP_INTERVAL_S = _env_float("DDLF_SHM_SWEEP_INTERVAL_S", 2.0)
# Two processes use shared memory between them only if their host ids match. Default:
# boot id + the shared-memory file system + user; set it to tell same-host nodes apart.
SHM_HOST_ID = os.environ.get("DDLF_SHM_HOST_ID", "")


def session_root() -> str:
    """Per-user folder for token files and session records, created with mode 0700.

    Raises ``DDLFError`` if the folder exists but belongs to another user or is writable
    by group or others (as OpenSSH refuses such a ``~/.ssh``): whoever can write there
    could plant a ``head.json`` that ``ddlf.init(address="auto")`` would trust.
    """
    root = os.environ.get("DDLF_TEMP_DIR") or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"ddlf-{os.getuid()}"
    )
    os.makedirs(root, mode=0o700, exist_ok=True)
    check_private_dir(root)
    return root


def check_private_dir(path: str) -> None:
    """Raise ``DDLFError`` unless ``path`` is a folder owned by us that only we can write."""
    uid = os.getuid()
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError as e:
        raise DDLFError(f"cannot use the DDLF session folder {path}: {e}") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (uid, 0):
        raise DDLFError(
            f"refusing the DDLF session folder {path}: it is a symlink owned by uid "
            f"{link.st_uid}, not by you (uid {uid}). Someone else may have created it: remove "
            "it, or set DDLF_TEMP_DIR to a private folder.")
    if not stat.S_ISDIR(st.st_mode):
        raise DDLFError(f"refusing the DDLF session folder {path}: it is not a directory")
    if st.st_uid != uid:
        raise DDLFError(
            f"refusing the DDLF session folder {path}: it is owned by uid {st.st_uid}, not by "
            f"you (uid {uid}). Someone else may have created it to plant session records: "
            "remove it, or set DDLF_TEMP_DIR to a private folder.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DDLFError(
            f"refusing the DDLF session folder {path}: it is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}). Make it private with `chmod 700 {path}`, "
            "or set DDLF_TEMP_DIR to a private folder.")


def raise_open_file_limit() -> None:
    """Raise the soft limit on open files to the hard limit (as Ray does at start-up).

    A node holds about two descriptors per live worker and a driver one per actor it
    talks to: the common soft limit of 1024 would cap a node at a few hundred actors.
    """
    try:
        import resource
    except ImportError:  # Windows
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard
        if hard == resource.RLIM_INFINITY:
            target = 1 << 20  # macOS refuses "infinity"; a large finite limit works
        if soft == resource.RLIM_INFINITY or soft >= target:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            if hard != resource.RLIM_INFINITY or soft >= 10240:
                raise
            resource.setrlimit(resource.RLIMIT_NOFILE, (10240, hard))  # macOS's OPEN_MAX
    except (ValueError, OSError) as e:
        log.debug("could not raise the open-file limit: %s", e)
