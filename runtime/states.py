"""Named states of actors (kept by the head), worker processes (kept by node daemons) and
the calls a worker runs, and connections.

``ActorState`` and ``WorkerState`` are ``str`` enums, so a state equals its old string
("ALIVE", "idle"). What goes on the wire is always ``.value``, a plain string, as before.
``CallState`` and ``ConnectionState`` never leave their process.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ActorState", "WorkerState", "CallState", "ConnectionState"]


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
    steps of the token handshake (runtime/auth.py), then open, then closed."""

    AWAIT_CHALLENGE = "await challenge"   # client: waiting for the server's challenge
    AWAIT_REPLY = "await reply"           # client: answered; waiting for the server's proof
    AWAIT_RESPONSE = "await response"     # server: challenged; waiting for the client's answer
    OPEN = "open"                         # authenticated: frames flow
    CLOSED = "closed"

    def __str__(self) -> str:
        return self.value
