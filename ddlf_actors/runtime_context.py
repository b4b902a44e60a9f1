"""``ddlf.get_runtime_context()``: who and where the calling code runs (job, node, worker,
task, actor), as Ray's ``RuntimeContext`` says it.

Ids are hex strings. In the driver, the task, worker and actor answers are None (the
driver is no worker), and the node is the one on the driver's host, if any.
"""

from __future__ import annotations

import copy
import json
import warnings

from ddlf_actors.runtime import context
from ddlf_actors.runtime.client.current import get_core
from ddlf_actors.runtime.states import ActorState

from .actor import ActorHandle
from .ids import ActorID, JobID, NodeID, PlacementGroupID, TaskID

__all__ = ["RuntimeContext", "get_runtime_context"]


class RuntimeContext:
    """What the calling code can learn about where it runs. Get it with
    :func:`get_runtime_context`; every answer is read when asked."""

    def get_job_id(self) -> str | None:
        """The id of the driver (job) whose work this is; None before ``ddlf.init``."""
        ctx = context.current
        if ctx is not None:
            return ctx.job_id
        core = get_core(auto=False)
        return core.job_id if core is not None else None

    def get_node_id(self) -> str | None:
        """The id of the node this code runs on (as in ``ddlf.nodes()``); in a driver, as in
        Ray, the node on its own host (None if no live node runs on this host)."""
        ctx = context.current
        if ctx is not None:
            return ctx.node_id
        return _local_node_id()

    def get_worker_id(self) -> str | None:
        """The id of this worker process; None in the driver."""
        ctx = context.current
        return ctx.worker_id if ctx is not None else None

    def get_task_id(self) -> str | None:
        """The id of the task or actor call running here; None in the driver and in an
        actor's ``__init__``. Each call (and each retry) gets its own id."""
        call = context.current_call()
        return call.task_id if call is not None else None

    def get_task_name(self) -> str | None:
        """``"f"`` for a task, ``"Class.method"`` for an actor call; None outside a call."""
        call = context.current_call()
        return call.name if call is not None else None

    def get_task_function_name(self) -> str | None:
        """The running function's qualified name (``"module.f"``, ``"module.Class.method"``)."""
        call = context.current_call()
        if call is None:
            return None
        fn = call.fn
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', call.name)}"

    def get_placement_group_id(self) -> str | None:
        """The id of the placement group this actor or task runs in; None outside one."""
        ctx = context.current
        placement = ctx.placement if ctx is not None else None
        return placement["group_id"] if placement else None

    def get_actor_id(self) -> str | None:
        """The id of the actor this code runs in; None in a task or the driver."""
        ctx = context.current
        return ctx.actor_id if ctx is not None else None

    def get_actor_name(self) -> str | None:
        """The actor's ``name=`` (``""`` if it has none); None outside an actor."""
        info = _actor_info()
        return (info.get("name") or "") if info is not None else None

    @property
    def namespace(self) -> str:
        """Always ``""``: a DDLF cluster has one namespace."""
        return ""

    @property
    def was_current_actor_reconstructed(self) -> bool:
        """True in an actor that was restarted after its process died (``max_restarts``),
        from its ``__init__`` on. Asks the head."""
        ctx = context.current
        if ctx is None or ctx.actor_id is None:
            raise RuntimeError("was_current_actor_reconstructed is only available in an actor")
        core = get_core()
        if core is None:   # an actor's process always joins; only a cleared context stops it
            raise RuntimeError("was_current_actor_reconstructed: this process has no DDLF core "
                               "to ask the head with")
        for view in core.head_call("list_actors"):
            if view["actor_id"] == ctx.actor_id:
                # The head counts successful starts (epoch); while a restart's __init__
                # runs, the actor is not ALIVE yet and that count is still the old one.
                return view["epoch"] >= 2 or (view["state"] != ActorState.ALIVE and view["epoch"] >= 1)
        return False

    @property
    def current_actor(self) -> ActorHandle:
        """A handle to the actor this code runs in (to pass itself to others)."""
        ctx = context.current
        if ctx is None or ctx.actor_id is None:
            raise RuntimeError("current_actor is only available in an actor")
        info = _info_of(ctx)
        return ActorHandle(ctx.actor_id, info["class_name"], info.get("methods") or {})

    def get_assigned_resources(self) -> dict:
        """The resources reserved for this actor, or for the running task (``{"CPU": 1.0}``
        by default); ``{}`` for an actor that asked for none."""
        info = _actor_info()
        if info is not None:
            return dict(info.get("resources") or {})
        call = context.current_call()
        if call is None:
            raise RuntimeError("get_assigned_resources is only available in a task or actor")
        return dict(call.conn.info.demand or {})

    def is_canceled(self) -> bool:
        """True once ``ddlf.cancel`` has reached the running call (a sync actor method that
        runs on checks this). ``RuntimeError`` in the driver and in async calls, as in Ray:
        those are cancelled through their asyncio task."""
        call = context.current_call()
        if call is None:
            raise RuntimeError("is_canceled() is only available inside a task or actor call")
        if call.is_async:
            raise RuntimeError("is_canceled() is not supported in an async task or method: "
                               "cancelling one raises asyncio.CancelledError in it")
        return call.cancelled

    @property
    def head_address(self) -> str | None:
        """The head's ``host:port``; None before ``ddlf.init``."""
        ctx = context.current
        if ctx is not None:
            return ctx.head_address
        core = get_core(auto=False)
        return core.head_address if core is not None else None

    # -- Ray's older spellings: properties that return typed ids ------------------------------
    # Ray keeps them (deprecated, with a warning) and its docs still use them, e.g.
    # NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().node_id, ...).

    @property
    def job_id(self) -> JobID:
        """``JobID`` of :meth:`get_job_id`; ``RuntimeError`` before ``ddlf.init``."""
        _deprecated("job_id", "get_job_id")
        job = self.get_job_id()
        if job is None:
            raise RuntimeError("job_id is not available: DDLF is not initialized; call "
                               "ddlf.init() first")
        return JobID(job)

    @property
    def node_id(self) -> NodeID:
        """``NodeID`` of :meth:`get_node_id`. ``RuntimeError`` before ``ddlf.init``, and in
        a driver whose host runs no node of the cluster (Ray's driver always has one)."""
        _deprecated("node_id", "get_node_id")
        node = self.get_node_id()
        if node is None:
            if context.current is None and get_core(auto=False) is None:
                why = "DDLF is not initialized; call ddlf.init() first"
            else:
                why = ("this driver's host runs no node of the cluster; pick a node from "
                       "ddlf.nodes() instead")
            raise RuntimeError(f"node_id is not available: {why}")
        return NodeID(node)

    @property
    def task_id(self) -> TaskID | None:
        """``TaskID`` of the running task or call; None outside one (in the driver, in an
        actor's ``__init__``)."""
        _deprecated("task_id", "get_task_id")
        task = self.get_task_id()
        return TaskID(task) if task is not None else None

    @property
    def actor_id(self) -> ActorID | None:
        """``ActorID`` of the actor this code runs in; None in a task or the driver."""
        _deprecated("actor_id", "get_actor_id")
        actor = self.get_actor_id()
        return ActorID(actor) if actor is not None else None

    @property
    def current_placement_group_id(self) -> PlacementGroupID:
        """``PlacementGroupID`` of the group this runs in; a nil id (``is_nil()``) outside
        one, as in Ray."""
        _deprecated("current_placement_group_id", "get_placement_group_id")
        group = self.get_placement_group_id()
        return PlacementGroupID(group) if group is not None else PlacementGroupID.nil()

    @property
    def should_capture_child_tasks_in_placement_group(self) -> bool:
        """True in a task or actor placed with ``placement_group_capture_child_tasks=True``:
        what it submits without a strategy joins its group. False elsewhere."""
        ctx = context.current
        placement = ctx.placement if ctx is not None else None
        return bool(placement and placement.get("capture"))

    @property
    def runtime_env(self) -> dict:
        """The runtime env this driver, task or actor runs in, as it travels: ``env_vars``
        as given, ``working_dir`` and ``py_modules`` as package ids (the folders were
        packed and shipped; like Ray's ``gcs://`` URIs). ``{}`` if none."""
        ctx = context.current
        if ctx is not None:
            wire = ctx.runtime_env
        else:
            core = get_core(auto=False)
            wire = core.runtime_env if core is not None else None
        return copy.deepcopy(wire or {})   # callers may change what they get

    def get_runtime_env_string(self) -> str:
        """:attr:`runtime_env` as a JSON string."""
        return json.dumps(self.runtime_env)

    def get(self) -> dict:
        """The ids above as one dict (Ray's deprecated ``get()``)."""
        out = {"job_id": self.get_job_id(), "node_id": self.get_node_id(),
               "namespace": self.namespace}
        if context.current is not None:
            if self.get_task_id() is not None:
                out["task_id"] = self.get_task_id()
            if self.get_actor_id() is not None:
                out["actor_id"] = self.get_actor_id()
        return out


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(f"get_runtime_context().{name} is Ray's deprecated spelling; use "
                  f"{instead}(), which returns the id as a hex string", DeprecationWarning,
                  stacklevel=3)


def _local_node_id() -> str | None:
    core = get_core(auto=False)
    if core is None:
        return None
    import psutil

    local = {"localhost"}
    try:
        for addrs in psutil.net_if_addrs().values():
            local.update(a.address for a in addrs)
    except (OSError, psutil.Error):
        pass
    for n in core.head_call("nodes"):
        host = n["address"].rpartition(":")[0]
        if n["alive"] and (host in local or host.startswith("127.")):
            return n["node_id"]
    return None


def _actor_info() -> dict | None:
    ctx = context.current
    if ctx is None or ctx.actor_id is None:
        return None
    return _info_of(ctx)


def _info_of(ctx: context.WorkerContext) -> dict:
    """An actor's name, class, methods and resources (from its creation spec)."""
    return ctx.actor_info or {"class_name": "", "name": None, "methods": {}, "resources": {}}


_context = RuntimeContext()


def get_runtime_context() -> RuntimeContext:
    """The runtime context of the calling driver, task or actor (see :class:`RuntimeContext`)."""
    return _context
