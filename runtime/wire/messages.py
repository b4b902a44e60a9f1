"""The control plane's messages: what drivers, the head, node daemons and workers send
each other as request arguments, replies and push data.

On the wire each message is a plain dict (``to_wire()``), which the wire fuzzer and
hand-built test messages also use. ``from_wire()`` checks a received dict and raises
:class:`MessageError` (a ``DDLFError``, so the RPC layer answers it as a bad request
instead of failing the server) when a field is missing, of the wrong type, or unknown.
Every peer runs the same release (the head refuses a version mismatch when a process
says hello), so a key this release does not know is a malformed message, not a newer
peer's field.

Who sends what:

=================  ==================================  =====================================
message            request / push                      path
=================  ==================================  =====================================
ActorCreation      create_actor, start_actor (x2)      driver -> head -> node -> worker
ActorStarted       the reply to start_actor            worker -> node -> head
LeaseGrant         the reply to lease_worker           node -> head -> driver
ActorView          create/wait/get_actor, list_actors  head -> driver
ActorDeath         ActorView.error                     head -> driver
WorkerDied         push worker_died                    node -> head
ActorLost          push actor_lost                     head -> every driver and worker
LogBatch           push logs                           node -> head -> driver
Heartbeat          push heartbeat                      node -> head
=================  ==================================  =====================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ..errors import (
    ActorDiedError,
    ActorPlacementGroupRemovedError,
    MessageError,
    PlacementGroupRemovedError,
    UnschedulableError,
)
from ..scheduling import Scheduling

__all__ = ["MessageError", "ActorCreation", "ActorStarted", "LeaseGrant", "ActorDeath",
           "ActorView", "WorkerDied", "ActorLost", "LogBatch", "Heartbeat"]


# -- field checks: each returns the value unchanged or raises MessageError ------------------
Check = Callable[[Any, str], Any]


def _type_name(value) -> str:
    return type(value).__name__


def _is(*types, name: str) -> Check:
    def check(value, where):
        # bool is an int to Python, never to a message.
        if isinstance(value, bool) and bool not in types:
            raise MessageError(f"{where} must be {name}, got a bool")
        if not isinstance(value, types):
            raise MessageError(f"{where} must be {name}, got {_type_name(value)}")
        return value
    return check


def _optional(check: Check) -> Check:
    def optional(value, where):
        return None if value is None else check(value, where)
    return optional


def _list_of(item: Check, name: str) -> Check:
    def check(value, where):
        if not isinstance(value, (list, tuple)):
            raise MessageError(f"{where} must be a list of {name}, got {_type_name(value)}")
        for i, v in enumerate(value):
            item(v, f"{where}[{i}]")
        return value
    return check


def _resources(value, where):
    if not isinstance(value, dict):
        raise MessageError(f"{where} must be a dict of resource name -> amount, "
                           f"got {_type_name(value)}")
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise MessageError(f"{where} must map resource names (str) to amounts (numbers), "
                               f"got {k!r}: {v!r}")
    return value


def _non_empty_str(value, where):
    if not isinstance(value, str) or not value:
        raise MessageError(f"{where} must be a non-empty str, got {value!r:.60}")
    return value


_STR = _is(str, name="a str")
_ID = _non_empty_str
_INT = _is(int, name="an int")
_NUM = _is(int, float, name="a number")
_BOOL = _is(bool, name="True or False")
_DICT = _is(dict, name="a dict")
_BYTES = _is(bytes, bytearray, memoryview, name="bytes")
_SEGMENTS = _list_of(_BYTES, "bytes")
_STRS = _list_of(_STR, "str")


def _scheduling(value, where):
    return Scheduling.from_wire(value, where)


def _log_record(value, where):
    # (job id, worker name, pid, "out" | "err", line): what the node reads from a worker.
    if not isinstance(value, (list, tuple)) or len(value) != 5:
        raise MessageError(f"{where} must be a (job_id, name, pid, stream, line) record, "
                           f"got {value!r:.80}")
    return value


class _Message:
    """What every message shares: the checks of ``from_wire`` and the dict of ``to_wire``.

    A subclass is a dataclass whose fields are its wire keys, with ``CHECKS`` giving each
    field's check, ``REQUIRED`` the fields a peer must send, and ``OMIT_IF_NONE`` the
    optional fields that are left off the wire when unset (they were only ever sent
    when present).
    """

    __slots__ = ()
    CHECKS: ClassVar[dict] = {}
    REQUIRED: ClassVar[tuple] = ()
    OMIT_IF_NONE: ClassVar[frozenset] = frozenset()

    @classmethod
    def from_wire(cls, data):
        """The message ``data`` (a received dict) describes; ``MessageError`` if malformed."""
        what = cls.__name__
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise MessageError(f"a {what} message must be a dict, got {_type_name(data)}")
        missing = [k for k in cls.REQUIRED if k not in data]
        if missing:
            raise MessageError(f"a {what} message lacks {', '.join(map(repr, missing))}")
        known = {}
        for key, value in data.items():
            check = cls.CHECKS.get(key)
            if check is None:
                raise MessageError(f"a {what} message has an unknown key {key!r:.60}: every "
                                   "peer runs the same DDLF release, which does not send it")
            known[key] = check(value, f"{what}.{key}")
        return cls(**known)

    def to_wire(self, only: tuple | None = None) -> dict:
        """The plain dict sent on the wire (what a peer's ``from_wire`` reads); with
        ``only``, just those keys (a short answer that has always been sent short)."""
        out = {}
        for f in dataclasses.fields(self):   # type: ignore[arg-type]  # subclasses are dataclasses
            if only is not None and f.name not in only:
                continue
            value = getattr(self, f.name)
            if value is None and f.name in self.OMIT_IF_NONE:
                continue
            out[f.name] = value.to_wire() if isinstance(value, Scheduling) else value
        return out


# -- actors ------------------------------------------------------------------------------------
@dataclass(slots=True)
class ActorCreation(_Message):
    """How to create one actor: sent by its creator to the head (``create_actor``), then
    by the head to a node and by the node to a worker (``start_actor``).

    The head reads the placement fields and keeps the message to restart the actor; the
    worker reads the class, the arguments and the environment.
    """

    actor_id: str
    class_name: str
    class_segments: list = field(default_factory=list)   # the pickled class
    args_segments: list = field(default_factory=list)    # the pickled (args, kwargs)
    resources: dict | None = None                        # its demand, e.g. {"CPU": 1.0}
    max_restarts: int | None = 0                         # -1: unlimited
    max_concurrency: int | None = 1
    name: str | None = None
    max_task_retries: int | None = 0
    detached: bool = False
    node_id: str | None = None       # the older spelling of a hard node affinity
    scheduling: Scheduling | None = None   # node affinity, SPREAD, or a placement group bundle
    methods: dict | None = None      # method name -> is_async, or a dict of its options
    sys_path: list = field(default_factory=list)   # the creator's, so its modules import
    cwd: str | None = None
    job_id: str | None = None
    runtime_env: dict | None = None
    # Objects its arguments refer to, shipped inside the request: object id -> segments.
    objects: dict | None = None
    # What the node set up for its runtime env and GPUs (env vars, paths), for the worker.
    env_setup: dict | None = None

    CHECKS: ClassVar[dict] = {
        "actor_id": _ID, "class_name": _STR, "class_segments": _SEGMENTS,
        "args_segments": _SEGMENTS, "resources": _optional(_resources),
        "max_restarts": _optional(_INT), "max_concurrency": _optional(_INT),
        "name": _optional(_STR), "max_task_retries": _optional(_INT), "detached": _BOOL,
        "node_id": _optional(_STR), "scheduling": _scheduling,
        "methods": _optional(_DICT), "sys_path": _STRS, "cwd": _optional(_STR),
        "job_id": _optional(_STR), "runtime_env": _optional(_DICT),
        "objects": _optional(_DICT), "env_setup": _optional(_DICT),
    }
    REQUIRED: ClassVar[tuple] = ("actor_id", "class_name")
    OMIT_IF_NONE: ClassVar[frozenset] = frozenset({"objects", "env_setup"})

    @property
    def demand(self) -> dict:
        return self.resources or {}

    @property
    def placement(self) -> Scheduling | None:
        """Where it may run; a bare ``node_id`` is a hard node affinity."""
        return self.scheduling or (Scheduling(node_id=self.node_id) if self.node_id else None)


@dataclass(slots=True)
class ActorStarted(_Message):
    """The outcome of ``start_actor``: where the actor listens, or why it did not start.

    A worker answers ``ok`` alone (its node adds where it is), or the encoded error of a
    failed ``__init__`` (``remote_error.encode_error`` segments).
    """

    ok: bool
    error: list | None = None   # encode_error segments when not ok
    address: str | None = None
    pid: int | None = None
    worker_id: str | None = None

    CHECKS: ClassVar[dict] = {
        "ok": _BOOL, "error": _optional(_SEGMENTS), "address": _optional(_STR),
        "pid": _optional(_INT), "worker_id": _optional(_STR),
    }
    REQUIRED: ClassVar[tuple] = ("ok",)
    OMIT_IF_NONE: ClassVar[frozenset] = frozenset({"address", "pid", "worker_id"})

    def check_placed(self) -> ActorStarted:
        """Itself, if it says where a started actor listens (what a node must answer)."""
        if self.ok and not (self.address and self.worker_id):
            raise MessageError("a start_actor reply with ok=True must give the actor's "
                               "address and worker_id")
        return self

    def to_wire(self, only: tuple | None = None) -> dict:
        out = _Message.to_wire(self, only)   # (no bare super(): slots dataclasses are rebuilt classes)
        if self.ok:
            out.pop("error", None)   # only a failure carries an error
        return out


@dataclass(slots=True)
class ActorDeath(_Message):
    """Why an actor is dead, as the head tells its callers (``ActorView.error``)."""

    reason: str
    creation_error: list | None = None   # encode_error segments of a failed __init__
    unschedulable: bool = False          # it could never be placed
    pg_removed: bool = False             # its placement group was removed

    CHECKS: ClassVar[dict] = {
        "reason": _STR, "creation_error": _optional(_SEGMENTS), "unschedulable": _BOOL,
        "pg_removed": _BOOL,
    }
    REQUIRED: ClassVar[tuple] = ("reason",)

    @classmethod
    def of(cls, reason: str, *, creation_error=None, error: BaseException | None = None,
           pg_removed: bool = False) -> ActorDeath:
        """The death of an actor for ``reason``; ``error`` is what stopped its placement."""
        return cls(reason, creation_error,
                   unschedulable=isinstance(error, UnschedulableError),
                   pg_removed=pg_removed or isinstance(error, PlacementGroupRemovedError))

    def to_error(self, class_name: str, actor_id: str) -> BaseException:
        """The exception a caller of the dead actor gets."""
        from .remote_error import decode_error

        reason = self.reason or "it died"
        cause = None
        if self.creation_error:
            try:
                cause = decode_error(self.creation_error)
                reason = f"{reason}:\n{cause}"
            except Exception as e:
                reason = f"{reason} (its error could not be loaded here: {e})"
        if self.unschedulable:
            return UnschedulableError(reason)
        if self.pg_removed:
            return ActorPlacementGroupRemovedError(
                f"actor {class_name} ({actor_id}) is dead: {reason}", cause)
        return ActorDiedError(f"actor {class_name} ({actor_id}) is dead: {reason}", cause)


def _death(value, where):
    ActorDeath.from_wire(value)
    return value


@dataclass(slots=True)
class ActorView(_Message):
    """What the head tells a caller about an actor: its state and where it listens.

    A few answers are short: ``wait_actor`` on a reserved name (``RESERVED_KEYS``) or an
    unknown actor (``UNKNOWN_KEYS``), and ``get_actor`` on a name whose actor is not
    created yet (``STUB_KEYS``: what a handle needs, no state; read back, it is RESERVED).
    """

    RESERVED_KEYS: ClassVar[tuple] = ("actor_id", "state", "epoch", "address")
    UNKNOWN_KEYS: ClassVar[tuple] = RESERVED_KEYS + ("error",)
    STUB_KEYS: ClassVar[tuple] = ("actor_id", "class_name", "methods")

    actor_id: str
    state: str = "RESERVED"    # an ActorState value
    epoch: int = 0             # counts its starts; a restarted actor has a new one
    address: str | None = None
    pid: int | None = None
    name: str | None = None
    class_name: str | None = None
    error: dict | None = None  # an ActorDeath, once it is DEAD
    node_id: str | None = None
    methods: dict | None = None
    max_task_retries: int | None = 0

    CHECKS: ClassVar[dict] = {
        "actor_id": _ID, "state": _STR, "epoch": _INT, "address": _optional(_STR),
        "pid": _optional(_INT), "name": _optional(_STR), "class_name": _optional(_STR),
        "error": _optional(_death), "node_id": _optional(_STR), "methods": _optional(_DICT),
        "max_task_retries": _optional(_INT),
    }
    REQUIRED: ClassVar[tuple] = ("actor_id",)

    @property
    def death(self) -> ActorDeath | None:
        return ActorDeath.from_wire(self.error) if self.error is not None else None


# -- task leases -------------------------------------------------------------------------------
@dataclass(slots=True)
class LeaseGrant(_Message):
    """A worker lent for tasks: the node's reply to ``lease_worker``, which the head
    passes on to the caller with the ``lease_id`` it gives back in ``return_lease``."""

    address: str
    worker_id: str
    pid: int | None = None
    node_id: str | None = None
    lease_id: str | None = None   # set by the head

    CHECKS: ClassVar[dict] = {
        "lease_id": _optional(_ID), "address": _ID, "pid": _optional(_INT),
        "worker_id": _ID, "node_id": _optional(_STR),
    }
    REQUIRED: ClassVar[tuple] = ("address", "worker_id")
    OMIT_IF_NONE: ClassVar[frozenset] = frozenset({"lease_id"})

    def to_wire(self, only: tuple | None = None) -> dict:
        out = _Message.to_wire(self, only)   # (no bare super(): slots dataclasses are rebuilt classes)
        if self.lease_id is not None:   # first, as the head always sent it
            out = {"lease_id": self.lease_id, **out}
        return out


# -- pushes ------------------------------------------------------------------------------------
@dataclass(slots=True)
class WorkerDied(_Message):
    """A node's worker process exited (push ``worker_died``, node -> head)."""

    worker_id: str
    actor_id: str | None = None   # the actor it ran, if any
    exitcode: int | None = None
    state: str | None = None      # the WorkerState it was in
    pid: int | None = None
    on_purpose: bool = False      # the actor announced exit_actor() / sys.exit(0)

    CHECKS: ClassVar[dict] = {
        "worker_id": _STR, "actor_id": _optional(_STR), "exitcode": _optional(_INT),
        "state": _optional(_STR), "pid": _optional(_INT), "on_purpose": _BOOL,
    }
    REQUIRED: ClassVar[tuple] = ("worker_id",)


@dataclass(slots=True)
class ActorLost(_Message):
    """An actor's process is gone (push ``actor_lost``, head -> every core): callers fail
    their calls in flight to it at ``epoch`` or before, even without a closed socket."""

    actor_id: str
    epoch: int
    why: str

    CHECKS: ClassVar[dict] = {"actor_id": _STR, "epoch": _INT, "why": _STR}
    REQUIRED: ClassVar[tuple] = ("actor_id", "epoch", "why")


@dataclass(slots=True)
class LogBatch(_Message):
    """Lines workers printed (push ``logs``, node -> head -> the driver of each line)."""

    records: list   # (job_id, worker name, pid, "out" | "err", line)
    host: str | None = None
    node_id: str | None = None

    CHECKS: ClassVar[dict] = {"records": _list_of(_log_record, "log records"),
                              "host": _optional(_STR), "node_id": _optional(_STR)}
    REQUIRED: ClassVar[tuple] = ("records",)


@dataclass(slots=True)
class Heartbeat(_Message):
    """A node is alive (push ``heartbeat``, node -> head), with a little load data."""

    node_id: str
    cpu_percent: float | None = None
    mem_available: int | None = None
    rss: int | None = None

    CHECKS: ClassVar[dict] = {"node_id": _STR, "cpu_percent": _optional(_NUM),
                              "mem_available": _optional(_INT), "rss": _optional(_INT)}
    REQUIRED: ClassVar[tuple] = ("node_id",)
    OMIT_IF_NONE: ClassVar[frozenset] = frozenset({"cpu_percent", "mem_available", "rss"})
