"""Actors' lives, the head's I/O side: creating them in batches, starting them on nodes,
restarting or burying them when their process is lost, killing them.

:class:`~.actors.ActorDirectory` holds the records and decides (names, restarts, dead
records); this class carries those decisions out: it places actors through the
:class:`~.placer.Placer`, asks nodes to start and kill their processes, and tells every
core (driver or worker) when an actor's process is lost, so that calls in flight fail
instead of hanging.

Creation is a pipeline: a caller sends every actor it created in one pass of its I/O
loop as one ``create_actors`` request; their placements are decided in one batch
(``Scheduler.place_batch``); each actor's start then runs on its own, and its view is
pushed to the caller (``actor_started``) when its first start ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .. import config
from ..errors import DDLFError, MessageError, PlacementGroupRemovedError, UnschedulableError
from ..states import ActorState
from ..wire import rpc
from ..wire.messages import (
    ActorCreation,
    ActorDeath,
    ActorLost,
    ActorStarted,
    ActorView,
    WorkerDied,
)
from ..wire.taskgroup import TaskGroup
from .actors import ActorDirectory, ActorRecord
from .nodes import NodeRecord
from .placer import Placer
from .scheduler import WorkKind, actor_load

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["ActorLifecycle", "call_quietly"]

log = logging.getLogger("ddlf.head")

_ALIVE, _DEAD = ActorState.ALIVE, ActorState.DEAD


async def call_quietly(conn: Connection, method, *args):
    """``rpc.call`` whose failure is only logged (debug): for requests to nodes whose
    outcome nobody waits for (kill, release)."""
    try:
        return await rpc.call(conn, method, *args)
    except Exception as e:
        log.debug("%s failed: %s", method, e)


class ActorLifecycle:
    """Creates, starts, restarts and kills the actors of ``actors``."""

    def __init__(self, actors: ActorDirectory, placer: Placer, cores: set,
                 background: TaskGroup):
        self.actors = actors
        self.placer = placer
        self.cores = cores            # every driver's and worker's connection (the head's)
        self.background = background

    # -- creation --------------------------------------------------------------------------
    def create(self, conn: Connection, creations: list, owner: str | None) -> list:
        """Register each actor of ``creations`` (``ActorCreation`` dicts) and start placing
        them, in one batch. Per creation: None (accepted: its view is pushed to ``conn``,
        ``actor_started``, when its first start ends) or the error that refused it (a
        malformed creation, a name already taken)."""
        if not isinstance(creations, (list, tuple)):
            raise MessageError(f"create_actors takes a list of ActorCreation dicts, got "
                               f"{type(creations).__name__}")
        answers: list[DDLFError | None] = []   # per creation: None (accepted) or why not
        accepted = []
        for c in creations:
            try:
                a = self.actors.add(ActorCreation.from_wire(c), owner)
            except DDLFError as e:   # MessageError, ActorNameTakenError
                answers.append(e)
                continue
            except Exception as e:   # one bad creation must not leave the others unstarted
                answers.append(DDLFError(f"the head could not create this actor: "
                                         f"{type(e).__name__}: {e}"))
                continue
            answers.append(None)
            accepted.append(a)
        placed = self.placer.scheduler.place_batch(
            [(a.demand, a.sched, f"actor {a.class_name}") for a in accepted], WorkKind.ACTOR,
            actor_load)
        for a, got in zip(accepted, placed):
            if isinstance(got, (UnschedulableError, PlacementGroupRemovedError)):
                self.set_dead(a, str(got), error_obj=got)
                rpc.push(conn, "actor_started", a.view())
                continue
            if got is not None:
                self._assign(a, *got)
            self.background.spawn(self._first_start(a, conn, got is not None))
        return answers

    async def _first_start(self, a: ActorRecord, conn: Connection, placed: bool):
        try:
            await self.start(a, placed)
        finally:   # its creator waits for this push: it must come, whatever happened
            rpc.push(conn, "actor_started", a.view())

    @staticmethod
    def _assign(a: ActorRecord, node: NodeRecord, charge) -> None:
        a.node, a.charge = node, charge
        node.actors.add(a.actor_id)

    async def start(self, a: ActorRecord, placed: bool = False):
        """Place ``a`` (unless ``placed``) and have its node start it: ALIVE, or dead or
        restarting if that fails."""
        if not placed:
            try:
                node, charge = await self.placer.place(a.demand, a.sched, WorkKind.ACTOR,
                                                       f"actor {a.class_name}", actor_load)
            except (UnschedulableError, PlacementGroupRemovedError) as e:
                if a.state != _DEAD:
                    self.set_dead(a, str(e), error_obj=e)
                return
            if a.state == _DEAD:  # killed while waiting for resources
                self.placer.free(charge, a.demand)
                return
            self._assign(a, node, charge)
        elif a.state == _DEAD:   # killed between its placement and now: resources given back
            return
        node = a.node
        if node is None:
            # Placed, but its node was lost before this start ran: lost() took it off that
            # node and has restarted it (another start) or marked it dead. Nothing to do.
            return
        try:
            reply = ActorStarted.from_wire(
                await rpc.call(node.conn, "start_actor", a.creation.to_wire())).check_placed()
        except Exception as e:
            self.placer.free(self.actors.detach(a), a.demand)
            self.lost(a, f"its node failed to start it: {e}")
            return
        if not reply.ok:
            self.placer.free(self.actors.detach(a), a.demand)
            self.set_dead(a, "its __init__ raised", creation_error=reply.error)
            return
        if a.state == _DEAD:  # killed while starting
            await call_quietly(node.conn, "kill_actor", a.actor_id)
            return
        self.actors.started(a, reply)

    # -- endings ---------------------------------------------------------------------------
    def set_dead(self, a: ActorRecord, why: str, creation_error=None, error_obj=None,
                 pg_removed: bool = False):
        self.actors.mark_dead(a, ActorDeath.of(why, creation_error=creation_error,
                                               error=error_obj, pg_removed=pg_removed))
        if a.node is not None:
            self.placer.free(self.actors.detach(a), a.demand)

    def lost(self, a: ActorRecord, why: str):
        """The actor's process is gone: restart it if allowed, else mark it dead."""
        # Callers holding a connection to it may never see that connection close (a cut
        # link sends no FIN): tell every core, so in-flight calls fail instead of hanging.
        self.push_lost(a, why)
        if a.node is not None:
            self.placer.free(self.actors.detach(a), a.demand)
        if a.killed or a.state == _DEAD:
            self.set_dead(a, a.death.reason if a.death else why)
        elif self.actors.lost(a):
            log.info("restarting actor %s (%s); %d restarts left", a.class_name, why,
                     a.restarts_left)
            self.background.spawn(self.start(a))
        else:
            self.set_dead(a, why)

    def push_lost(self, a: ActorRecord, why: str) -> None:
        data = ActorLost(a.actor_id, a.epoch, why).to_wire()
        for conn in list(self.cores):
            rpc.push(conn, "actor_lost", data)

    def worker_died(self, node: NodeRecord, died: WorkerDied):
        """``node`` says one of its workers exited; it speaks for its own workers only."""
        a = self.actors.get(died.actor_id) if died.actor_id else None
        if (a is None or a.worker_id != died.worker_id or a.state != _ALIVE
                or a.node is not node):
            return
        if died.on_purpose:
            # sys.exit(0) or exit_actor(), announced by the worker: it left on purpose, as
            # in Ray. A bare os._exit(0) is not announced, so it is a crash and restarts.
            a.killed = True
            self.lost(a, f"it exited on purpose (sys.exit(0) or exit_actor(), pid "
                         f"{died.pid}); it is not restarted")
        else:
            self.lost(a, f"its process (pid {died.pid}) died with exit code {died.exitcode}")

    def kill(self, a: ActorRecord, why: str, no_restart: bool = True, pg_removed: bool = False):
        node = a.node
        if no_restart:
            a.killed = True
            self.set_dead(a, why, pg_removed=pg_removed)
        if node is not None and node.alive:
            self.background.spawn(call_quietly(node.conn, "kill_actor", a.actor_id))

    # -- waiting for an actor ----------------------------------------------------------------
    async def wait(self, actor_id: str, after_epoch: int) -> dict:
        """The actor's view once its epoch passes ``after_epoch`` or it is dead (or after
        ``config.WAIT_ACTOR_MAX_S``, whatever it is then)."""
        deadline = time.monotonic() + config.WAIT_ACTOR_MAX_S
        while True:
            a = self.actors.get(actor_id)
            r = self.actors.reserved.get(actor_id) if a is None else None
            if r is not None:
                # Named and reserved, but its creation request has not arrived yet.
                try:
                    await asyncio.wait_for(r.created.wait(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    return ActorView(actor_id, ActorState.RESERVED.value).to_wire(
                        ActorView.RESERVED_KEYS)
                continue
            if a is None:
                death = ActorDeath.of("no such actor in this cluster (it may have been created "
                                      "by a driver that has since disconnected)")
                return ActorView(actor_id, _DEAD.value, error=death.to_wire()).to_wire(
                    ActorView.UNKNOWN_KEYS)
            if a.state == _DEAD or (a.state == _ALIVE and a.epoch > after_epoch):
                return a.view()
            left = deadline - time.monotonic()
            if left <= 0:
                return a.view()
            try:
                await asyncio.wait_for(a.changed.wait(), left)
            except asyncio.TimeoutError:
                pass
