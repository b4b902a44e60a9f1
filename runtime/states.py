"""Named states: of actors (kept by the head, and by each caller of an actor), of
placement groups (kept by the head), of worker processes (kept by node daemons), of the
calls a worker runs, and of connections.

The states that cross the wire are ``str`` enums, so a state equals its old string
("ALIVE", "idle", "CREATED"). What goes on the wire is always ``.value``, a plain string.
``CallState`` and ``ConnectionState`` never leave their process.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ActorState", "ActorClientState", "GroupState", "GroupSchedulingState", "WorkerState",
           "CallState", "ConnectionState"]


class ActorState(str, Enum):
    """Where an actor is in its life, as the head sees it."""

    # Its name was claimed at .remote(); the create_actor request has not arrived yet.
    # (Only wait_actor answers with it: the head holds no record for the actor then.)
    RESERVED = "RESERVED"
    # Created: waiting for resources, or its node is starting it.
    PENDING = "PENDING"
    ALIVE = "ALIVE"
    # Its process died and max_restarts allows another: being placed and started again.
    RESTARTING = "RESTARTING"
    DEAD = "DEAD"

    def __str__(self) -> str:
        return self.value


class ActorClientState(Enum):
    """Where a caller's link to one actor is (``actor_submitter.ActorClient``)."""

    RESOLVING = "resolving"   # being created, or asking the head where the actor is now
    READY = "ready"           # connected: calls go out
    DEAD = "dead"             # every call fails with the actor's death


class GroupState(str, Enum):
    """Where a placement group is in its life, as the head sees it (Ray's names)."""

    PENDING = "PENDING"             # waits for room for all of its bundles
    CREATED = "CREATED"             # every bundle is reserved on a node
    RESCHEDULING = "RESCHEDULING"   # lost bundles with a node; placing them again
    REMOVED = "REMOVED"

    def __str__(self) -> str:
        return self.value


class GroupSchedulingState(str, Enum):
    """Ray's ``placement_group_table()[...]["stats"]["scheduling_state"]``."""

    FINISHED = "FINISHED"           # CREATED
    REMOVED = "REMOVED"
    NO_RESOURCES = "NO_RESOURCES"   # would fit the live nodes once resources free up
    INFEASIBLE = "INFEASIBLE"       # waits for a node that can hold it to join

    def __str__(self) -> str:
        return self.value


class WorkerState(str, Enum):
    """What a node daemon's worker process is doing."""

    STARTING = "starting"   # its process is starting; not yet ready
    IDLE = "idle"           # ready, in idle_fresh or idle_task
    CLAIMED = "claimed"     # taken for an actor, not yet given its class
    TASK = "task"           # leased for tasks
    ACTOR = "actor"         # is an actor
    DEAD = "dead"           # its process exited

    def __str__(self) -> str:
        return self.value


class CallState(Enum):
    """Where a call is on its worker (``context.CallContext.state``)."""

    QUEUED = "queued"     # arrived; waiting for an execution thread or the loop
    RUNNING = "running"   # its code runs: a cancel now interrupts it, or only flags it
    DONE = "done"         # its code has returned; a cancel can no longer reach it

    def __str__(self) -> str:
        return self.value


class ConnectionState(Enum):
    """Where a connection is in its life (``connection.Connection.state``): the three
    steps of the token handshake (runtime/wire/auth.py), then open, then closed."""

    AWAIT_CHALLENGE = "await challenge"   # client: waiting for the server's challenge
    AWAIT_REPLY = "await reply"           # client: answered; waiting for the server's proof
    AWAIT_RESPONSE = "await response"     # server: challenged; waiting for the client's answer
    OPEN = "open"                         # authenticated: frames flow
    CLOSED = "closed"

    def __str__(self) -> str:
        return self.value
