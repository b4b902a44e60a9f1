"""``ActorPool``: spread work over a fixed set of actors, one call per actor at a time.

The semantics are Ray's ``ray.util.ActorPool``: ``submit`` runs ``fn(actor, value)`` on an
idle actor or queues it until one is free; results come back in submission order
(``get_next``) or as they finish (``get_next_unordered``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from ddlf_actors.runtime.errors import ActorDiedError

__all__ = ["ActorPool"]

_TIMEOUT_MSG = "timed out waiting for a result from the ActorPool"


class ActorPool:
    """A pool of actor handles; ``fn(actor, value)`` must return one ``ObjectRef``.

    ``map``/``map_unordered`` return generators over all results. An actor whose call
    raised ``ActorDiedError`` leaves the pool (the error re-raises to the caller).
    """

    def __init__(self, actors: Iterable):
        self._idle_actors = list(actors)
        self._future_to_actor: dict = {}      # ref -> (task index, actor)
        self._index_to_future: dict = {}      # task index -> ref
        self._next_task_index = 0
        self._next_return_index = 0
        self._pending_submits: list = []

    # -- submitting -------------------------------------------------------------------------
    def map(self, fn: Callable[[Any, Any], Any], values: Iterable) -> Iterator:
        """Submit ``fn(actor, v)`` for every ``v``; yield the results in ``values`` order."""
        self._drop_pending()
        for v in values:
            self.submit(fn, v)
        return self._drain(self.get_next)

    def map_unordered(self, fn: Callable[[Any, Any], Any], values: Iterable) -> Iterator:
        """Like :meth:`map`, but yield each result as soon as it is ready."""
        self._drop_pending()
        for v in values:
            self.submit(fn, v)
        return self._drain(self.get_next_unordered)

    def _drain(self, get):
        while self.has_next():
            yield get()

    def _drop_pending(self):
        # As in Ray, a new map discards the results of earlier submissions that are not
        # ready yet (their actors come back to the pool as those calls finish).
        while self.has_next():
            try:
                self.get_next_unordered(timeout=0, ignore_if_timedout=True)
            except TimeoutError:
                pass

    def submit(self, fn: Callable[[Any, Any], Any], value: Any) -> None:
        """Run ``fn(actor, value)`` on an idle actor, or queue it until an actor is free."""
        if self._idle_actors:
            actor = self._idle_actors.pop()
            future = fn(actor, value)
            key = tuple(future) if isinstance(future, list) else future
            self._future_to_actor[key] = (self._next_task_index, actor)
            self._index_to_future[self._next_task_index] = future
            self._next_task_index += 1
        else:
            self._pending_submits.append((fn, value))

    # -- collecting -------------------------------------------------------------------------
    def has_next(self) -> bool:
        """Whether a submitted call's result has not been collected yet."""
        return bool(self._future_to_actor)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False):
        """The next result in submission order.

        Raises ``StopIteration`` when nothing is pending, ``TimeoutError`` if the result is
        not ready within ``timeout`` seconds (with ``ignore_if_timedout=True`` that result
        is skipped for good), and ``ValueError`` after a ``get_next_unordered``.
        """
        from ddlf_actors import api

        if not self.has_next():
            raise StopIteration("No more results to get")
        if self._next_return_index >= self._next_task_index:
            raise ValueError("get_next() cannot follow get_next_unordered(): results were "
                             "already taken out of order; keep using get_next_unordered()")
        future = self._index_to_future[self._next_return_index]
        timed_out = False
        if timeout is not None:
            ready, _ = api.wait(_refs(future), num_returns=len(_refs(future)), timeout=timeout)
            if len(ready) < len(_refs(future)):
                if not ignore_if_timedout:
                    raise TimeoutError(_TIMEOUT_MSG)
                timed_out = True
        del self._index_to_future[self._next_return_index]
        self._next_return_index += 1
        _, actor = self._future_to_actor.pop(_key(future))
        if timed_out:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}; the call {future} is ignored")
        return self._get_result(future, actor)

    def get_next_unordered(self, timeout: float | None = None, ignore_if_timedout: bool = False):
        """Whichever pending result is ready first.

        Raises ``StopIteration`` when nothing is pending and ``TimeoutError`` if no result
        is ready within ``timeout`` seconds (with ``ignore_if_timedout=True`` the oldest
        pending call is dropped and its actor returns to the pool).
        """
        from ddlf_actors import api

        if not self.has_next():
            raise StopIteration("No more results to get")
        refs = [r for key in self._future_to_actor for r in _refs(key)]
        ready, _ = api.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            future = next(self._index_to_future[i] for i, _ in self._future_to_actor.values()
                          if ready[0] in _refs(self._index_to_future[i]))
        elif not ignore_if_timedout:
            raise TimeoutError(_TIMEOUT_MSG)
        else:
            future = self._index_to_future[min(i for i, _ in self._future_to_actor.values())]
        i, actor = self._future_to_actor.pop(_key(future))
        del self._index_to_future[i]
        self._next_return_index = max(self._next_return_index, i + 1)
        if not ready:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}; the call {future} is ignored")
        return self._get_result(future, actor)

    def _get_result(self, future, actor):
        from ddlf_actors import api

        alive = True
        try:
            return api.get(future)
        except ActorDiedError:
            alive = False
            raise
        finally:
            self._return_actor(actor, alive)

    def _return_actor(self, actor, alive: bool = True) -> None:
        if alive:
            self._idle_actors.append(actor)
        if self._pending_submits and self._idle_actors:
            self.submit(*self._pending_submits.pop(0))

    # -- managing actors --------------------------------------------------------------------
    def has_free(self) -> bool:
        """Whether an actor is idle and no submission is waiting for one."""
        return bool(self._idle_actors) and not self._pending_submits

    def pop_idle(self):
        """Take an idle actor out of the pool (``None`` if none is free)."""
        if self.has_free():
            return self._idle_actors.pop()
        return None

    def push(self, actor) -> None:
        """Add ``actor`` to the pool; ``ValueError`` if it is already in it."""
        busy = [a for _, a in self._future_to_actor.values()]
        if actor in self._idle_actors or actor in busy:
            raise ValueError("the actor already belongs to this ActorPool")
        self._return_actor(actor)


def _refs(future) -> list:
    return list(future) if isinstance(future, (list, tuple)) else [future]


def _key(future):
    return tuple(future) if isinstance(future, list) else future
