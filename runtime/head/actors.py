"""The head's directory of actors: their records, their names, and their restarts.

An actor's life, as the head sees it (``ActorState``)::

    (name RESERVED) -> PENDING -> ALIVE -> RESTARTING -> ALIVE ... -> DEAD
                               \\-> DEAD (init raised, unschedulable, killed)

* **Names.** A name is claimed at ``.remote()`` (a :class:`NameReservation`, before the
  creation request arrives) or by the creation itself; it is held until the actor dies
  or its reservation is given back by the connection that made it.
* **Restarts.** An actor whose process is lost restarts while ``max_restarts`` allows
  (-1: without limit) unless it was killed or exited on purpose (:meth:`lost`).
* **Dead records are bounded.** A dead actor keeps answering ``wait_actor`` and
  ``list_actors`` with why it died, but only the newest ``keep_dead`` of them are kept
  (Ray's ``maximum_gcs_destroyed_actor_cached_count``), and a record keeps no pickled
  class or arguments once they can no longer be needed: at death, or once started if
  it may not restart.

Pure state with no I/O: the head's shell starts and kills processes and frees resources.
"""

from __future__ import annotations

import asyncio
import collections

from ..errors import ActorNameTakenError
from ..scheduling import Scheduling
from ..states import ActorState
from ..wire.messages import ActorCreation, ActorDeath, ActorStarted, ActorView
from .nodes import NodeRecord

__all__ = ["ActorRecord", "NameReservation", "ActorDirectory"]


class NameReservation:
    """A name claimed at ``.remote()`` for an actor whose creation has not arrived yet."""

    __slots__ = ("actor_id", "name", "class_name", "methods", "owner", "created")

    def __init__(self, actor_id: str, name: str, class_name: str, methods, owner: str | None):
        self.actor_id = actor_id
        self.name = name
        self.class_name = class_name
        self.methods = methods
        self.owner = owner
        self.created = asyncio.Event()   # set when the creation arrives or it is given back

    def view(self) -> dict:
        """What ``get_actor(name)`` answers before the actor exists: enough for a handle."""
        return ActorView(self.actor_id, class_name=self.class_name,
                         methods=self.methods).to_wire(ActorView.STUB_KEYS)


class ActorRecord:
    def __init__(self, wire: ActorCreation | dict, owner: str | None):
        creation = ActorCreation.from_wire(wire)
        self.actor_id = creation.actor_id
        self.creation = creation   # kept to start it again on a restart
        self.name = creation.name
        self.class_name = creation.class_name
        self.demand = creation.demand
        # Where it may run (node affinity, SPREAD, a placement group's bundle).
        self.sched: Scheduling | None = creation.placement
        self.charge = None         # what its demand was taken from: its node, or a bundle
        self.restarts_left = int(creation.max_restarts or 0)
        self.detached = creation.detached
        self.owner = owner
        self.state = ActorState.PENDING
        self.epoch = 0
        self.node: NodeRecord | None = None
        self.address: str | None = None
        self.pid: int | None = None
        self.worker_id: str | None = None
        self.death: ActorDeath | None = None   # why it is dead, once it is
        self.killed = False
        self.changed = asyncio.Event()

    @property
    def error(self) -> dict | None:
        return self.death.to_wire() if self.death is not None else None

    @property
    def group_id(self) -> str | None:
        return self.sched.group_id if self.sched is not None else None

    def view(self) -> dict:
        return ActorView(self.actor_id, self.state.value, self.epoch, self.address, self.pid,
                         self.name, self.class_name, self.error,
                         self.node.node_id if self.node else None, self.creation.methods,
                         self.creation.max_task_retries).to_wire()

    def touch(self):
        """Wake whoever waits for this actor to change (``wait_actor``)."""
        self.changed.set()
        self.changed = asyncio.Event()

    def drop_payload(self) -> None:
        """Forget the pickled class, arguments and shipped objects (never needed again)."""
        c = self.creation
        c.class_segments, c.args_segments, c.objects = [], [], None


class ActorDirectory:
    """Every actor the head knows, by id, and the names that lead to them."""

    def __init__(self, keep_dead: int):
        self.keep_dead = keep_dead
        self.actors: dict[str, ActorRecord] = {}
        self.names: dict[str, str] = {}               # name -> actor id
        self.reserved: dict[str, NameReservation] = {}   # actor id -> its reservation
        self._dead: collections.OrderedDict = collections.OrderedDict()   # oldest death first

    def get(self, actor_id: str) -> ActorRecord | None:
        return self.actors.get(actor_id)

    # -- names -----------------------------------------------------------------------------
    def claim_name(self, name: str, actor_id: str) -> None:
        """Give ``name`` to ``actor_id``; ``ActorNameTakenError`` if a live or reserved
        actor holds it."""
        existing = self.names.get(name)
        if existing is not None and existing != actor_id:
            a = self.actors.get(existing)
            if existing in self.reserved or (a is not None and a.state != ActorState.DEAD):
                raise ActorNameTakenError(
                    f"an actor named {name!r} already exists; pick another name or use "
                    "ddlf.get_actor(name) to reach it")
        self.names[name] = actor_id

    def reserve(self, name: str, actor_id: str, class_name: str, methods,
                owner: str | None) -> None:
        """Claim ``name`` for an actor whose creation is about to follow."""
        self.claim_name(name, actor_id)
        self.reserved[actor_id] = NameReservation(actor_id, name, class_name, methods, owner)

    def unreserve(self, actor_id: str) -> None:
        """Drop ``actor_id``'s reservation (created, or given back), waking its waiters."""
        r = self.reserved.pop(actor_id, None)
        if r is not None:
            if self.names.get(r.name) == actor_id and actor_id not in self.actors:
                self.names.pop(r.name, None)
            r.created.set()

    def release(self, actor_id: str, owner: str | None) -> bool:
        """Give back a reservation: only its owner may. True if it was given back."""
        r = self.reserved.get(actor_id)
        if r is None or r.owner != owner:
            return False
        self.unreserve(actor_id)
        return True

    def named(self, name: str) -> dict | None:
        """``get_actor(name)``'s answer: the actor's view, a reservation's stub, or None."""
        actor_id = self.names.get(name)
        if actor_id is None:
            return None
        r = self.reserved.get(actor_id)
        return r.view() if r is not None else self.actors[actor_id].view()

    # -- life ------------------------------------------------------------------------------
    def add(self, creation: ActorCreation, owner: str | None) -> ActorRecord:
        """Record a new actor (PENDING), taking its name; ``ActorNameTakenError`` if the
        name is held by another actor."""
        if creation.name:
            self.claim_name(creation.name, creation.actor_id)
        a = ActorRecord(creation, owner)
        self.actors[a.actor_id] = a
        self.unreserve(a.actor_id)
        return a

    def started(self, a: ActorRecord, reply: ActorStarted) -> None:
        """Its process answered: ALIVE at ``reply.address``, in a new epoch."""
        a.address, a.pid, a.worker_id = reply.address, reply.pid, reply.worker_id
        a.state = ActorState.ALIVE
        a.epoch += 1
        if a.restarts_left == 0:
            a.drop_payload()   # it is never started again
        a.touch()

    def detach(self, a: ActorRecord):
        """Take ``a`` off its node; what its demand was charged to (to give it back)."""
        charge = a.charge
        if a.node is not None:
            a.node.actors.discard(a.actor_id)
        a.node = a.charge = None
        return charge

    def lost(self, a: ActorRecord) -> bool:
        """Its process is gone: True if it restarts (now RESTARTING, one restart used),
        False if it must die (killed, exited on purpose, or out of restarts)."""
        if a.killed or a.state == ActorState.DEAD or a.restarts_left == 0:
            return False
        if a.restarts_left > 0:   # -1: unlimited, as in Ray
            a.restarts_left -= 1
        a.state = ActorState.RESTARTING
        a.address = None
        a.touch()
        return True

    def mark_dead(self, a: ActorRecord, death: ActorDeath) -> list[str]:
        """``a`` is DEAD for ``death``: its name is free, its payload dropped, and it joins
        the bounded list of dead records. The ids of the oldest dead actors forgotten to
        keep that bound."""
        first = a.state != ActorState.DEAD
        a.state = ActorState.DEAD
        a.death = death
        a.address = None
        if a.name and self.names.get(a.name) == a.actor_id:
            self.names.pop(a.name, None)
        a.drop_payload()
        a.touch()
        if not first:
            return []
        self._dead[a.actor_id] = None
        forgotten = []
        while len(self._dead) > self.keep_dead:
            old, _ = self._dead.popitem(last=False)
            self.actors.pop(old, None)
            forgotten.append(old)
        return forgotten

    # -- queries ---------------------------------------------------------------------------
    def owned_by(self, owner: str) -> list[ActorRecord]:
        """The live actors that die with ``owner`` (not detached ones)."""
        return [a for a in self.actors.values()
                if a.owner == owner and not a.detached and a.state != ActorState.DEAD]

    def reserved_by(self, owner: str) -> list[str]:
        return [actor_id for actor_id, r in self.reserved.items() if r.owner == owner]

    def in_group(self, group_id: str) -> list[ActorRecord]:
        return [a for a in self.actors.values()
                if a.group_id == group_id and a.state != ActorState.DEAD]

    def on_node(self, node: NodeRecord) -> list[ActorRecord]:
        """The actors placed on ``node`` that are running or starting there."""
        out = []
        for actor_id in list(node.actors):
            a = self.actors.get(actor_id)
            if a is not None and a.state in (ActorState.ALIVE, ActorState.PENDING):
                out.append(a)
        return out

    def views(self) -> list[dict]:
        return [a.view() for a in self.actors.values()]
