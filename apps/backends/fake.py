"""An in-process backend: actors on threads, no cluster and no sockets.

Every scheme's state machine, with the real driver loop, the trainer pool, the wire and
checkpoints, runs on it in unit tests in well under a second a run
(``tests/apps/test_unit_machines.py``). What it keeps of a real runtime:

- each actor runs its plain methods one at a time, in the order they were called, on its
  own thread; ``async def`` methods run on a second thread meanwhile (allreduce's
  ``deliver_chunk`` arrives while ``allreduce_held`` waits for it), as an actor's event
  loop does;
- values passed by ``put`` or returned by a call are copies (``copy.deepcopy``), so no two
  actors, nor the driver, share an array; refs among a call's arguments are resolved;
- an actor that dies fails its call in progress, its queued calls and every later one
  with ``ActorDiedError``; one whose ``__init__`` raised fails them with ``cause`` set;
- CPUs: placement groups reserve ``num_cpus`` CPUs; one the backend cannot hold stays
  pending until :meth:`FakeBackend.add_cpus` makes room (an elastic run grows then).

Faults are injected by the test: :meth:`FakeBackend.kill` ends an actor from outside
(``kill -9``), and ``fail_when=`` (a predicate on ``(actor, method, calls so far)``) kills
an actor right before a chosen call runs, as a trainer dying mid-round would; for method
``"__init__"``, before its constructor runs, as a process killed while starting (its
calls then fail with an ``ActorDiedError`` without ``cause``: nothing raised). The
predicate runs on the actor's thread and may block, to hold an actor back.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import queue
import threading
import time
from typing import Any, Callable, Sequence

from ddlf_actors.errors import ActorDiedError, GetTimeoutError

from .base import Backend, current

__all__ = ["FakeBackend", "FakeRef", "FakeActor"]

_MISSING = object()
_CONSTRUCTING = threading.Lock()


class FakeRef:
    """A call's result or a ``put`` value: settled once, then read (as copies) any time."""

    _ids = itertools.count(1)

    def __init__(self, backend: FakeBackend):
        self.id = next(self._ids)
        self._backend = backend
        self._value: Any = _MISSING
        self._error: BaseException | None = None

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        with self._backend._changed:
            if self.done:
                return
            if error is not None:
                self._error = error
            else:
                self._value = value
            self._backend._changed.notify_all()

    @property
    def done(self) -> bool:
        return self._value is not _MISSING or self._error is not None

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return copy.deepcopy(self._value)

    def __repr__(self) -> str:
        state = "error" if self._error is not None else "done" if self.done else "pending"
        return f"FakeRef({self.id}, {state})"


class _Method:
    def __init__(self, actor: FakeActor, name: str):
        self.actor = actor
        self.name = name

    def remote(self, *args, **kwargs) -> FakeRef:
        return self.actor.submit(self.name, args, kwargs)


class FakeActor:
    """One actor: its instance, its two threads, its state. Handles are the actor itself
    (``handle.method.remote(...)``)."""

    def __init__(self, backend: FakeBackend, cls: type, args: tuple, kwargs: dict,
                 node: str, group: Any = None, bundle: int = 0, cpus: float = 0.0):
        self._backend = backend
        self.cls = cls
        self.args = args                          # what __init__ gets (a trainer's slot...)
        self.node = node
        self.group = group
        self.bundle = bundle
        self.cpus = cpus
        self.calls: dict[str, int] = {}          # method -> calls started
        self.running: FakeRef | None = None       # the plain call in progress
        self.instance: Any = None
        self.dead: ActorDiedError | None = None
        self._queue: queue.Queue = queue.Queue()
        self._async: queue.Queue = queue.Queue()
        self._ready = FakeRef(backend)            # settled when __init__ is done
        self._thread = threading.Thread(target=self._run, args=(args, kwargs), daemon=True,
                                        name=f"fake-actor-{cls.__name__}")
        self._loop = threading.Thread(target=self._run_async, daemon=True,
                                      name=f"fake-actor-loop-{cls.__name__}")
        self._thread.start()
        self._loop.start()

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    # -- calls ---------------------------------------------------------------------------------
    def submit(self, method: str, args: tuple, kwargs: dict) -> FakeRef:
        ref = FakeRef(self._backend)
        if self.dead is not None:
            ref.settle(error=self.dead)
            return ref
        fn = getattr(self.cls, method, None)
        if fn is None:
            ref.settle(error=AttributeError(f"{self.cls.__name__} has no method {method!r}"))
            return ref
        target = self._async if inspect.iscoroutinefunction(fn) else self._queue
        target.put((ref, method, args, kwargs))
        return ref

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, FakeRef):
            self._backend.wait([value], num_returns=1, timeout=None)
            return value.result()
        return value

    def _invoke(self, ref: FakeRef, method: str, args: tuple, kwargs: dict) -> None:
        if self.dead is not None:
            ref.settle(error=self.dead)
            return
        self.calls[method] = self.calls.get(method, 0) + 1
        if self._backend.fail_when is not None and \
                self._backend.fail_when(self, method, self.calls[method]):
            self.die(f"injected fault before call {self.calls[method]} of {method}")
            ref.settle(error=self.dead)
            return
        try:
            args = tuple(self._resolve(a) for a in args)
            kwargs = {k: self._resolve(v) for k, v in kwargs.items()}
            out = getattr(self.instance, method)(*args, **kwargs)
            if inspect.iscoroutine(out):
                out = asyncio.run(out)
        except BaseException as e:   # the caller gets it, as a remote error
            ref.settle(error=self.dead or e)
            return
        # A result that comes back after the actor died never reaches the caller.
        ref.settle(error=self.dead) if self.dead is not None else ref.settle(copy.deepcopy(out))

    def _enter(self) -> None:
        """This thread is the actor's: ``backends.here()`` is the fake backend, and
        ``node_id()`` this actor's node."""
        current.backend = self._backend
        threading.current_thread()._fake_actor = self  # type: ignore[attr-defined]

    def _run(self, args: tuple, kwargs: dict) -> None:
        self._enter()
        if self.group is not None:   # it starts once its placement group is placed
            with self._backend._changed:
                while not (self.group.created or self.group.removed or self.dead):
                    self._backend._changed.wait()
            if self.group.removed and self.dead is None:
                self.dead = ActorDiedError("its placement group was removed")
        if self.dead is None and self._backend.fail_when is not None:
            self.calls["__init__"] = 1
            if self._backend.fail_when(self, "__init__", 1):
                # Its process died while starting: nothing raised, so no cause.
                self.dead = ActorDiedError("the actor's process died while starting "
                                           "(injected fault)")
        try:
            # One constructor at a time: a real actor builds in a process of its own, and a
            # trainer's __init__ parses code (its dataset's identity) with ast, which
            # CPython 3.11 does not make thread-safe ("AST constructor recursion depth
            # mismatch").
            with _CONSTRUCTING:
                if self.dead is None:
                    self.instance = self.cls(*(self._resolve(a) for a in args),
                                             **{k: self._resolve(v) for k, v in kwargs.items()})
        except BaseException as e:
            self.dead = ActorDiedError(f"the actor's __init__ raised {type(e).__name__}: {e}",
                                       cause=e)
        self._ready.settle(True)
        while True:
            item = self._queue.get()
            if item is None:
                return
            self.running = item[0]
            self._invoke(*item)
            self.running = None

    def _run_async(self) -> None:
        self._enter()
        self._ready_wait()
        while True:
            item = self._async.get()
            if item is None:
                return
            self._invoke(*item)

    def _ready_wait(self) -> None:
        self._backend.wait([self._ready], num_returns=1, timeout=None)

    def die(self, why: str) -> None:
        """The actor is gone: every call not finished fails with ``ActorDiedError``."""
        with self._backend._changed:
            if self.dead is None:
                self.dead = ActorDiedError(f"the actor died: {why}")
            running = self.running
            if running is not None:   # its result will never come back
                running.settle(error=self.dead)
            self._backend.release(self)
        for q in (self._queue, self._async):
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].settle(error=self.dead)
            q.put(None)


class _ActorClass:
    def __init__(self, backend: FakeBackend, cls: type, options: dict):
        self._backend = backend
        self._cls = cls
        self._options = options

    def options(self, **options) -> _ActorClass:
        return _ActorClass(self._backend, self._cls, {**self._options, **options})

    def remote(self, *args, **kwargs) -> FakeActor:
        return self._backend.create(self._cls, args, kwargs, self._options)


class _Group:
    """A placement group: ``bundles`` reserved together, or pending."""

    _ids = itertools.count(1)

    def __init__(self, backend: FakeBackend, bundles: list[dict]):
        self.id = next(self._ids)
        self._backend = backend
        self.cpus = sum(float(b.get("CPU", 0.0)) for b in bundles)
        self.created = False
        self.removed = False

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._backend._changed:
            while not self.created:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._backend._changed.wait(left)
        return True


class FakeBackend(Backend):
    """In-process actors with ``num_cpus`` CPUs between them (see the module docstring).

    ``fail_when(actor, method, n)``: called before the ``n``-th call of ``method`` on an
    actor; True kills the actor there (that call and the later ones fail)."""

    name = "fake"

    def __init__(self, num_cpus: float = 4.0,
                 fail_when: Callable[[FakeActor, str, int], bool] | None = None):
        self.capacity = float(num_cpus)
        self.fail_when = fail_when
        self.actors: list[FakeActor] = []
        self.groups: list[_Group] = []
        self._changed = threading.Condition(threading.RLock())

    # -- the session: always there --------------------------------------------------------------
    def ensure_session(self) -> bool:
        return False

    def shutdown(self) -> None:
        for actor in list(self.actors):
            actor.die("the session ended")

    def is_initialized(self) -> bool:
        return True

    # -- actors and objects ---------------------------------------------------------------------
    def remote(self, cls: type, **options) -> _ActorClass:
        return _ActorClass(self, cls, options)

    def create(self, cls: type, args: tuple, kwargs: dict, options: dict) -> FakeActor:
        strategy = options.get("scheduling_strategy")
        group, bundle = strategy if isinstance(strategy, tuple) else (None, 0)
        cpus = 0.0 if group is not None else float(options.get("num_cpus", 1) or 0)
        with self._changed:
            if group is None and cpus > self.available():
                raise RuntimeError(f"the fake backend has {self.available():g} free CPUs for "
                                   f"an actor that needs {cpus:g}")
            actor = FakeActor(self, cls, args, kwargs, node=f"fake-node-{len(self.actors) % 2}",
                              group=group, bundle=bundle, cpus=cpus)
            self.actors.append(actor)
        return actor

    def get(self, refs, *, timeout: float | None = None):
        many = isinstance(refs, (list, tuple))
        items = list(refs) if many else [refs]
        ready, _ = self.wait(items, num_returns=len(items), timeout=timeout)
        if len(ready) < len(items):
            raise GetTimeoutError(f"{len(items) - len(ready)} of {len(items)} not ready "
                                  f"within {timeout} s")
        values = [r.result() for r in items]
        return values if many else values[0]

    def put(self, value) -> FakeRef:
        ref = FakeRef(self)
        ref.settle(copy.deepcopy(value))
        return ref

    def wait(self, refs: Sequence, *, num_returns: int = 1,
             timeout: float | None = None) -> tuple[list, list]:
        refs = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                ready = [r for r in refs if r.done]
                if len(ready) >= num_returns:
                    ready = ready[:num_returns]
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
        chosen = set(map(id, ready))
        return ready, [r for r in refs if id(r) not in chosen]

    def kill(self, handle: FakeActor) -> None:
        handle.die("killed")

    # -- placement ------------------------------------------------------------------------------
    def available(self) -> float:
        used = sum(g.cpus for g in self.groups if g.created and not g.removed)
        used += sum(a.cpus for a in self.actors if a.dead is None)
        return self.capacity - used

    def placement_group(self, bundles: list[dict], strategy: str) -> _Group:
        group = _Group(self, bundles)
        with self._changed:
            self.groups.append(group)
            self._place()
        return group

    def _place(self) -> None:
        for g in self.groups:
            if not g.created and not g.removed and g.cpus <= self.available():
                g.created = True
        self._changed.notify_all()

    def quiesce(self, timeout_s: float = 10.0) -> None:
        """Wait until every live, placed actor has finished ``__init__`` and has no call
        queued or running: what a test uses to make "a trainer is ready now" deterministic.
        ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while any(a.dead is None and (a.group is None or a.group.created)
                      and (not a._ready.done or a.running is not None or not a._queue.empty())
                      for a in self.actors):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the fake backend's actors were still busy after "
                                       f"{timeout_s} s")
                self._changed.wait(min(left, 0.01))

    def add_cpus(self, n: float) -> None:
        """More capacity (a node joined): pending placement groups are placed now."""
        with self._changed:
            self.capacity += n
            self._place()

    def release(self, actor: FakeActor) -> None:
        with self._changed:
            self._place()

    def placement_group_table(self, group: _Group) -> dict:
        state = "REMOVED" if group.removed else "CREATED" if group.created else "PENDING"
        never = group.cpus > self.capacity
        return {"state": state, "stats": {"scheduling_state": "INFEASIBLE" if never
                                          else "FINISHED" if group.created else "PENDING"}}

    def remove_placement_group(self, group: _Group) -> None:
        with self._changed:
            group.removed = True
            self._place()

    def in_bundle(self, group: _Group, index: int) -> tuple:
        return (group, index)

    # -- the cluster ----------------------------------------------------------------------------
    def nodes(self) -> list[dict]:
        return [{"node_id": f"fake-node-{i}", "alive": True,
                 "resources": {"CPU": self.capacity / 2}} for i in range(2)]

    def cluster_resources(self) -> dict:
        return {"CPU": self.capacity}

    def available_resources(self) -> dict:
        return {"CPU": self.available()}

    def node_id(self) -> str | None:
        actor = _current_actor()
        return actor.node if actor is not None else None


def _current_actor() -> FakeActor | None:
    return getattr(threading.current_thread(), "_fake_actor", None)
