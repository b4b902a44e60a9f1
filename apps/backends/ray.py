"""The Ray backend: DDLF's schemes with their trainers on Ray actors.

The mirror image of ``ddlf_actors.compat.ray`` (Ray's API over DDLF's runtime): here
DDLF's training apps call Ray's runtime. Every call is Ray's own; what this adds:

- errors: a call whose actor died (``ray.exceptions.RayActorError``: ``ActorDiedError``,
  ``ActorUnavailableError``) raises DDLF's ``ActorDiedError`` from it, so the pool
  treats a killed Ray trainer as a lost one and replaces it, as on DDLF. When the
  actor's ``__init__`` raised, ``cause`` is Ray's error (a failed start, not a loss);
- the session: a run that finds no Ray session starts a local one
  (``ddlf_actors.ray_session``) and stops it at the end;
- ``nodes()`` in DDLF's shape (``node_id``, ``address``, ``alive``, ``resources``);
- call order: DDLF runs an actor's plain methods one at a time in arrival order, and its
  ``async def`` methods on the actor's event loop meanwhile. Ray makes a class with any
  ``async def`` method (``TrainerActor`` has the Cluster API's) an async actor, whose
  calls may start out of order (a call whose argument is still being fetched lets a
  later one pass: ``set_optimizer_state`` then ``train(w_ref)`` could swap). So
  ``remote`` gives Ray a subclass whose ``async def`` methods are plain methods that run
  the coroutine to its end, in a concurrency group of their own (``"loop"``, one at a
  time): the plain methods stay in order in Ray's default group, and the others run
  meanwhile, as on DDLF (allreduce's ``deliver_chunk`` arrives while ``allreduce_held``
  waits for it).

The dataset never passes through the driver: a trainer gets the dataset's *name* (or the
callable, or the partition directory) and ``datasets.load_shared`` maps it from its
own node's cache, exactly as on DDLF; on a multi-node Ray cluster each node builds its
cache once, from its own copy (``$DDLF_DATA_DIR``, ``~/.cache/ddlf``) or a download.
"""

from __future__ import annotations

import asyncio
import inspect

from ddlf_actors import ray_session
from ddlf_actors.errors import ActorDiedError

from .base import Backend

__all__ = ["RayBackend"]


class RayBackend(Backend):
    name = "ray"

    def __init__(self):
        self._ray = None

    @property
    def ray(self):
        if self._ray is None:
            self._ray = ray_session.import_ray()
        return self._ray

    # -- the session --------------------------------------------------------------------------
    def ensure_session(self) -> bool:
        return ray_session.ensure()

    def shutdown(self) -> None:
        ray_session.stop("run")

    def is_initialized(self) -> bool:
        return self.ray.is_initialized()

    # -- actors and objects -------------------------------------------------------------------
    def remote(self, cls, **options):
        cls, concurrent = _in_order(cls, self.ray)
        if concurrent:
            options = {**options, "concurrency_groups": {_LOOP: 1,
                                                         **options.get("concurrency_groups", {})}}
        return self.ray.remote(**options)(cls) if options else self.ray.remote(cls)

    def get(self, refs, *, timeout=None):
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(refs, timeout=timeout)
        except exceptions.RayActorError as e:
            init_failed = bool(getattr(e, "actor_init_failed", False))
            raise ActorDiedError(f"the Ray actor died: {e}", cause=e if init_failed else None) \
                from e

    def put(self, value):
        return self.ray.put(value)

    def wait(self, refs, *, num_returns=1, timeout=None):
        # fetch_local=False: being done is enough; get() fetches the value when asked.
        return self.ray.wait(list(refs), num_returns=num_returns, timeout=timeout,
                             fetch_local=False)

    def kill(self, handle) -> None:
        self.ray.kill(handle, no_restart=True)

    # -- placement ----------------------------------------------------------------------------
    def placement_group(self, bundles, strategy):
        from ray.util.placement_group import placement_group

        return placement_group(bundles, strategy=strategy)

    def placement_group_table(self, group) -> dict:
        from ray.util.placement_group import placement_group_table

        return placement_group_table(group)

    def remove_placement_group(self, group) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)

    def in_bundle(self, group, index):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

    # -- the cluster --------------------------------------------------------------------------
    def nodes(self):
        return [{"node_id": n.get("NodeID"), "alive": bool(n.get("Alive")),
                 "address": n.get("NodeManagerAddress"), "resources": n.get("Resources", {}),
                 "ray": n} for n in self.ray.nodes()]

    def cluster_resources(self):
        return self.ray.cluster_resources()

    def available_resources(self):
        return self.ray.available_resources()

    def node_id(self):
        try:
            return self.ray.get_runtime_context().get_node_id()
        except Exception:   # no Ray worker context here: the node is not known
            return None


# The concurrency group of the methods that DDLF runs on an actor's event loop.
_LOOP = "loop"


def _in_order(cls: type, ray) -> tuple[type, bool]:
    """``cls``, or a subclass of it whose ``async def`` methods are plain methods (each
    runs its coroutine to the end) in the concurrency group ``"loop"``, so that Ray makes
    a threaded actor of it whose other calls run one at a time, in order; and whether it
    is such a subclass."""
    coros = [name for name, fn in inspect.getmembers(cls, inspect.iscoroutinefunction)
             if not name.startswith("__")]
    if not coros:
        return cls, False

    def plain(fn):
        def method(self, *args, **kwargs):
            coro = fn(self, *args, **kwargs)
            if asyncio._get_running_loop() is not None:
                return coro   # awaited by another of these methods (run_method's _ddlf_call)
            return asyncio.run(coro)
        # Not functools.wraps: Ray follows __wrapped__, finds a coroutine function and
        # makes an async actor again, whose sync methods block its event loop.
        method.__name__, method.__qualname__ = fn.__name__, fn.__qualname__
        method.__doc__, method.__module__ = fn.__doc__, fn.__module__
        return ray.method(concurrency_group=_LOOP)(method)

    namespace = {name: plain(getattr(cls, name)) for name in coros}
    namespace["__module__"] = cls.__module__
    namespace["__qualname__"] = f"{cls.__qualname__}.InOrder"   # not found by name:
    return type(cls.__name__, (cls,), namespace), True          # pickled by value
