"""Actor calls, caller side: one ``ActorClient`` per actor this process calls.

Ray's ``ActorTaskSubmitter`` plays this part in its core worker. A client resolves its
actor through the head (and again after a restart), connects to the actor's process,
and sends calls in the order they were submitted: a call whose arguments are pending
holds the ones behind it. Calls in flight are failed, or retried (``max_task_retries``),
when the connection is lost. Results settle the caller's entries in the object store;
a generator method's items go to the core's ``Streams``.

Creations go out in batches (``ActorCreations``): every actor created in one pass of the
I/O loop leaves in one ``create_actors`` request, with no round trip per actor, and each
actor's view comes back as an ``actor_started`` push once its first start ends.

Everything runs on the core's I/O thread. A client is handed the owning core, of which
it uses only public attributes: ``store`` and ``streams``; ``head``, ``token`` and
``hello`` (connections); ``loop`` and ``background`` (tasks); ``msg_ids`` and ``closed``;
``creations`` (its ``ActorCreations``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING

from .. import config, shm_store
from ..errors import ActorDiedError, ConnectionLostError, DDLFError, TaskCancelledError
from ..states import ActorClientState, ActorState
from ..wire import protocol, rpc
from ..wire.address import split_address
from ..wire.connection import connect
from ..wire.frames import TableFrameHandler
from ..wire.messages import ActorCreation, ActorDeath, ActorView, MessageError
from ..wire.serialization import dumps, loads
from .dependencies import await_deps, deps_objects, deps_state, ship_deps
from .object_store import Entry

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["ActorCall", "ActorClient", "ActorCreations"]

log = logging.getLogger("ddlf.core")

_STATES = frozenset(s.value for s in ActorState)
RESOLVING, READY, DEAD = ActorClientState.RESOLVING, ActorClientState.READY, ActorClientState.DEAD


class ActorCall:
    __slots__ = ("obj_id", "payload", "refs", "retries")

    def __init__(self, obj_id, payload, refs):
        self.obj_id = obj_id
        self.payload = payload
        self.refs = refs
        self.retries = None   # set from the actor's max_task_retries when first sent


class ActorClient(TableFrameHandler):
    """The caller's side of one actor: resolution, connection, ordered queue, in-flight calls."""

    def __init__(self, core, actor_id: str, class_name: str):
        self.core = core
        self.store = core.store
        self.actor_id = actor_id
        self.class_name = class_name
        self.state = RESOLVING
        self.conn: Connection | None = None
        self.queue: collections.deque = collections.deque()
        # msg id -> object id, or the ActorCall itself when the actor retries calls
        # (max_task_retries): only then is the payload kept until the reply.
        self.inflight: dict[int, object] = {}
        self.max_task_retries = 0
        self.epoch = 0
        self.dead_error: BaseException | None = None
        self.blocked = False
        self.cancelled: set = set()   # object ids of in-flight calls asked to cancel
        # msg ids of in-flight calls whose actor exited in them (sys.exit) and that are
        # retried when its connection closes: their exit reply is not their outcome.
        self.exited: set = set()

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self, creation: ActorCreation, refs) -> None:
        """Have the head create the actor, once the objects its arguments refer to exist."""
        if refs:
            self.core.background.spawn(self._create_after(creation, refs))
        else:
            self.core.creations.add(self, creation)

    async def _create_after(self, creation: ActorCreation, refs):
        try:
            await await_deps(self.store, self.core.loop, refs)
            _, failed = deps_state(self.store, refs)
            if failed is not None:
                self.creation_failed(self._dep_error(failed), creation)
                return
            creation.objects = deps_objects(self.store, refs, {})
        except Exception as e:
            self.creation_failed(e, creation)
            return
        self.core.creations.add(self, creation)

    def creation_failed(self, e: BaseException, creation: ActorCreation) -> None:
        """The actor was never created (refused, its arguments failed, the head is gone)."""
        self.die_with(e if isinstance(e, DDLFError) else
                       DDLFError(f"creating {self.class_name} failed: {e}"))
        self._release_name(creation)

    def started(self, data) -> None:
        """The head's ``actor_started`` push: the view of the actor after its first start."""
        view = self._read_view(data, "create_actors")
        if view is None:
            return
        if self.state is DEAD and view.state != ActorState.DEAD:
            # ddlf.kill() ran before the head knew the actor (its arguments were pending,
            # or its creation was still on its way): the kill must follow the creation.
            self.core.background.spawn(self._kill_late())
            return
        self.core.background.spawn(self._apply(view))

    async def _kill_late(self):
        try:
            await rpc.call(self.core.head, "kill_actor", self.actor_id, True)
        except Exception as e:
            log.debug("could not kill actor %s created after its kill: %s", self.actor_id, e)

    def _release_name(self, creation: ActorCreation) -> None:
        """Give back a name reserved at .remote() for an actor that was never created."""
        if creation.name and self.core.head is not None and not self.core.head.closed:
            rpc.push(self.core.head, "release_name", {"actor_id": self.actor_id})

    def _dep_error(self, e: Entry) -> BaseException:
        return self.store.error_of(e)

    def resolve(self, after_epoch: int) -> None:
        self.state = RESOLVING
        self.core.background.spawn(self._resolve(after_epoch))

    async def _resolve(self, after_epoch):
        for _attempt in range(1000):
            try:
                view = await rpc.call(self.core.head, "wait_actor", self.actor_id, after_epoch)
            except Exception as e:
                self.die_with(ActorDiedError(
                    f"actor {self.class_name} ({self.actor_id}) is unreachable: the head did not "
                    f"answer ({e})"))
                return
            view = self._read_view(view, "wait_actor")
            if view is None:
                return
            if view.state == ActorState.ALIVE or view.state == ActorState.DEAD:
                await self._apply(view)
                return

    def _read_view(self, data, request: str) -> ActorView | None:
        """The head's answer to ``request`` as an ActorView; None, with every call to the
        actor failed, if it is malformed (a get must fail, never wait for a reply that
        cannot be understood)."""
        try:
            view = ActorView.from_wire(data)
            if view.state not in _STATES:
                raise MessageError(f"ActorView.state must be one of {sorted(_STATES)}, "
                                   f"got {view.state!r:.40}")
            if view.state == ActorState.ALIVE:
                split_address(view.address or "")
        except (MessageError, ValueError) as e:
            log.warning("the head answered %s for actor %s with a malformed view: %s",
                        request, self.actor_id, e)
            self.die_with(MessageError(
                f"actor {self.class_name} ({self.actor_id}) cannot be reached: the head's "
                f"answer to {request} is malformed ({e}). Check that the head runs the same "
                f"DDLF release as this process."))
            return None
        return view

    async def _apply(self, view: ActorView) -> None:
        if view.state == ActorState.DEAD:
            self.die_with((view.death or ActorDeath("")).to_error(self.class_name,
                                                                   self.actor_id))
            return
        if view.state != ActorState.ALIVE:
            self.resolve(self.epoch)
            return
        assert view.address is not None  # _read_view checked an ALIVE view's address
        self.epoch = view.epoch
        self.max_task_retries = view.max_task_retries or 0
        host, port = split_address(view.address)
        for attempt in range(config.ACTOR_CONNECT_TRIES):
            try:
                conn = await connect(host, port, self.core.token, self)
                break
            except (OSError, asyncio.TimeoutError, DDLFError) as e:
                last = e
                await asyncio.sleep(0.05 * (attempt + 1))
        else:
            log.debug("could not reach actor %s at %s: %s", self.actor_id, view.address, last)
            self.resolve(self.epoch)
            return
        conn.send_msg(protocol.PUSH, 0, dumps(("hello", self.core.hello)))
        await shm_store.wait_hello(conn)
        if self.state is DEAD:   # ddlf.kill() ran while we connected: stay dead
            conn.close()
            return
        if conn.closed:   # it went away while answering our hello
            self.resolve(self.epoch)
            return
        self.conn = conn
        self.state = READY
        self.pump()

    def die_with(self, exc: BaseException) -> None:
        self.state = DEAD
        self.dead_error = exc
        while self.queue:
            self.store.fail(self.queue.popleft().obj_id, exc)

    def killed(self) -> None:
        """ddlf.kill() from this process: fail queued, in-flight and later calls now."""
        err = ActorDiedError(f"actor {self.class_name} ({self.actor_id}) is dead: "
                             "it was killed with ddlf.kill()")
        self.die_with(err)
        if self.conn is not None:
            self.conn.abort(err)

    def close(self):
        if self.conn is not None:
            self.conn.close()

    # -- calls -------------------------------------------------------------------------------
    def enqueue(self, call: ActorCall) -> None:
        if self.state is DEAD:
            self.store.fail(call.obj_id, self.dead_error)
            return
        self.queue.append(call)
        if self.state is READY and not self.blocked:
            self.pump()

    def pump(self) -> None:
        store = self.store
        conn = self.conn
        if conn is None:
            # The connection is gone, and connection_closed is failing the calls that were
            # on it: a call queued behind one of them unblocks and pumps from there while
            # the state still reads READY. Queued calls wait for the next connection
            # (_apply pumps once it is up), or fail with the actor if it is dead.
            return
        queue = self.queue
        inflight = self.inflight
        while queue and self.state is READY:
            call = queue[0]
            if call.refs:
                pending, failed = deps_state(store, call.refs)
                if pending is not None:
                    # Head-of-line wait keeps calls from one caller in submission order.
                    self.blocked = True
                    if not store.on_done(pending, self._unblock):
                        self.blocked = False
                        continue
                    return
                if failed is not None:
                    queue.popleft()
                    store.copy_outcome(call.obj_id, failed)
                    continue
                ship_deps(store, conn, call.refs)
            queue.popleft()
            msg_id = next(self.core.msg_ids)
            if self.max_task_retries:
                if call.retries is None:
                    call.retries = self.max_task_retries
                inflight[msg_id] = call
            else:
                inflight[msg_id] = call.obj_id
            conn.send_msg(protocol.CALL, msg_id, call.payload)

    def _unblock(self):
        self.blocked = False
        self.pump()

    def cancel(self, obj_id: bytes, recursive: bool) -> None:
        """Drop a queued call, or ask the actor to cancel one it has (queued or running)."""
        for i, call in enumerate(self.queue):
            if call.obj_id == obj_id:
                del self.queue[i]
                self.store.fail_cancelled(obj_id, f"a call to actor {self.class_name}")
                if i == 0 and self.blocked:
                    # It held the queue waiting for its arguments: let the next one go.
                    self.blocked = False
                    if self.state is READY:
                        self.pump()
                return
        for msg_id, call in self.inflight.items():
            if (call.obj_id if isinstance(call, ActorCall) else call) == obj_id:
                if isinstance(call, ActorCall):
                    call.retries = 0   # as in Ray, a cancelled call is never retried
                self.cancelled.add(obj_id)
                if self.conn is not None and not self.conn.closed:
                    flags = protocol.CANCEL_RECURSIVE if recursive else 0
                    self.conn.send_msg(protocol.CANCEL, msg_id, [bytes((flags,))])
                return

    # -- frames from the actor (dispatched through FRAMES, runtime/wire/frames.py) -----------------
    def _on_push(self, conn: Connection, kind, msg_id, segs):
        event, data = loads(segs[1:])
        if event == "hello":
            shm_store.client_hello(conn, data)
            return
        if event != "exiting" or conn is not self.conn:
            return
        # The actor called sys.exit/exit_actor: its replies so far still arrive here, but
        # later calls wait for the head's next view of the actor (restarted or dead),
        # resolved when this connection closes.
        self.state = RESOLVING
        if data.get("status") and data.get("msg_id") in self.inflight:
            # A crash (non-zero exit) in a call the actor may retry: retry it on the
            # restarted actor instead of taking the exit's error reply. It stays in flight
            # until the connection closes, so that it is retried with the calls sent after
            # it, in the order they were sent (queued for its retry now, it would run
            # after them: Ray's actor_checkpointing.py then read a key its crashed
            # update had not written yet).
            call = self.inflight[data["msg_id"]]
            if isinstance(call, ActorCall) and call.retries != 0:
                self.exited.add(data["msg_id"])

    def _on_stream(self, conn: Connection, kind, msg_id, segs):
        entry = (self.inflight.get if kind == protocol.STREAM_ITEM else self.inflight.pop)(
            msg_id, None)
        if entry is not None:
            self.core.streams.frame(conn, kind, msg_id, entry.obj_id if isinstance(
                entry, ActorCall) else entry, segs)

    def _on_result(self, conn: Connection, kind, msg_id, segs):
        if msg_id in self.exited:
            return   # the exit's error reply: the call is retried (connection_closed)
        entry = self.inflight.pop(msg_id, None)
        if entry is None:
            return
        obj_id = entry.obj_id if isinstance(entry, ActorCall) else entry
        if self.cancelled:
            self.cancelled.discard(obj_id)
        self.store.complete_result(obj_id, kind, segs)

    def _on_shm_result(self, conn: Connection, kind, msg_id, segs):
        kind, segs = shm_store.client_result(conn, segs)
        self._on_result(conn, kind, msg_id, segs)

    def _on_shm_ack(self, conn: Connection, kind, msg_id, segs):
        shm_store.on_ack(conn, segs)

    FRAMES = {protocol.PUSH: _on_push, protocol.STREAM_ITEM: _on_stream,
              protocol.STREAM_END: _on_stream, protocol.RESULT_OK: _on_result,
              protocol.RESULT_ERR: _on_result, protocol.RESULT_REFS: _on_result,
              protocol.RESULT_MULTI: _on_result, protocol.RESULT_SHM: _on_shm_result,
              protocol.SHM_ACK: _on_shm_ack}

    def _retry(self, calls) -> None:
        """Queue calls lost with the actor's process again, in the order they were sent
        (``calls``), ahead of newer ones."""
        for call in calls:
            if call.retries > 0:
                call.retries -= 1
        self.queue.extendleft(reversed(calls))

    def connection_closed(self, conn: Connection, exc):
        if conn is not self.conn:
            return
        self.conn = None
        inflight, self.inflight = self.inflight, {}
        self.exited.clear()
        if self.core.closed:
            return
        retry = [c for c in inflight.values() if isinstance(c, ActorCall) and c.retries != 0]
        # Chosen before _retry counts the attempt down: max_task_retries=1 retries once.
        lost = [c for c in inflight.values() if not (isinstance(c, ActorCall) and c.retries != 0)]
        if retry:
            self._retry(retry)
        if lost:
            why = str(exc) if isinstance(exc, ActorDiedError) else (
                "its connection closed (the process exited or was killed)")
            err = ActorDiedError(
                f"actor {self.class_name} ({self.actor_id}) died while running this call: {why}")
            cancelled, self.cancelled = self.cancelled, set()
            for c in lost:
                obj_id = c.obj_id if isinstance(c, ActorCall) else c
                if obj_id in cancelled:
                    self.store.fail(obj_id, TaskCancelledError(
                        f"a call to actor {self.class_name} ({self.actor_id}) was cancelled "
                        f"with ddlf.cancel(), and the actor's process then went away: {why}"))
                else:
                    self.store.fail(obj_id, err)
        if self.state is not DEAD:
            self.resolve(self.epoch)


class ActorCreations:
    """Actor creations on their way to the head, sent in batches.

    Every creation added in one pass of the I/O loop leaves in one ``create_actors``
    request at the end of that pass. The head answers at once, per creation, with None
    (accepted) or the error that refused it; each accepted actor's view follows as an
    ``actor_started`` push when its first start ends (:meth:`started`). If the head's
    connection is lost first, every creation still waiting fails (:meth:`head_lost`).
    """

    def __init__(self, core):
        self.core = core
        self._batch: list[tuple[ActorClient, ActorCreation]] = []
        self.waiting: dict[str, ActorClient] = {}   # sent; the actor's view not back yet

    def add(self, client: ActorClient, creation: ActorCreation) -> None:
        self._batch.append((client, creation))
        self.waiting[client.actor_id] = client
        if len(self._batch) == 1:
            self.core.loop.call_soon(self._flush)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if batch:
            self.core.background.spawn(self._send(batch))

    async def _send(self, batch: list) -> None:
        try:
            answers = await rpc.call(self.core.head, "create_actors",
                                     [creation.to_wire() for _, creation in batch])
            if not isinstance(answers, list) or len(answers) != len(batch):
                raise MessageError(f"the head answered create_actors for {len(batch)} actors "
                                   f"with {answers!r:.80}, not one answer per actor. Check that "
                                   "the head runs the same DDLF release as this process.")
        except Exception as e:
            answers = [e] * len(batch)
        for (client, creation), answer in zip(batch, answers):
            if answer is None:
                continue
            waiting = self.waiting.pop(client.actor_id, None)
            if waiting is not None and waiting is client:
                client.creation_failed(answer, creation)

    def started(self, data) -> None:
        """The head's ``actor_started`` push (an ``ActorView``): hand it to its client."""
        actor_id = data.get("actor_id") if isinstance(data, dict) else None
        if isinstance(actor_id, str) and actor_id:
            client = self.waiting.pop(actor_id, None)
            if client is None:
                raise MessageError(f"an actor_started push for actor {actor_id!r:.40}, which "
                                   "is not being created here")
            client.started(data)
            return
        # Addressed to no actor: a head that speaks another protocol. Every creation still
        # waiting fails with what is wrong (ActorClient.started reads it), rather than wait
        # for a view that cannot come.
        waiting, self.waiting = self.waiting, {}
        for client in waiting.values():
            client.started(data)

    def head_lost(self) -> None:
        """The head's connection closed: creations whose view never came fail."""
        waiting, self.waiting = self.waiting, {}
        err = ConnectionLostError(f"lost the connection to the DDLF head at "
                                  f"{self.core.head_address} before the actor started")
        for client in waiting.values():
            client.die_with(err)
