"""A worker becoming an actor: its class unpickled and constructed, off the event loop."""

from __future__ import annotations

import asyncio
import inspect

from .. import context
from ..client.dependencies import resolve_args
from ..wire.messages import ActorCreation, ActorStarted
from ..wire.remote_error import encode_error
from ..wire.serialization import loads
from .env import apply_env, apply_sys_path
from .executor import Executor
from .output import log_marker

__all__ = ["start_actor"]


async def start_actor(worker, creation: ActorCreation) -> dict:
    """Make ``worker`` the actor ``creation`` describes; its :class:`ActorStarted`, in wire
    form (with its init error if that failed).

    An ``async def __init__`` is awaited on the worker's loop, where the actor's async
    methods run (as in Ray); an error in it is a creation error like a sync one's.
    """
    worker.is_actor = True
    apply_env(creation.env_setup)
    apply_sys_path(creation.sys_path, creation.cwd)
    ctx = context.worker_context()
    ctx.actor_id = creation.actor_id
    ctx.job_id = creation.job_id
    if creation.scheduling is not None and creation.scheduling.in_group:
        ctx.placement = creation.scheduling.group_context()
    ctx.actor_info = {"name": creation.name, "class_name": creation.class_name,
                      "methods": creation.methods, "resources": creation.resources}
    worker.actor_name = creation.class_name
    log_marker(f"actor:{worker.actor_name}:{ctx.job_id or ''}")
    for obj_id, segs in (creation.objects or {}).items():
        worker.objects.add(obj_id, segs)
    max_conc = int(creation.max_concurrency or 1)
    runner = worker.runner
    runner.semaphore = asyncio.Semaphore(max_conc)
    runner.executor = Executor(worker.loop, max_conc, name="ddlf-actor")
    done = worker.loop.create_future()

    def construct():
        # Unpickling the class may import heavy modules and __init__ may build a model:
        # both run here, so the loop keeps answering the node meanwhile.
        where = f"loading {worker.actor_name} (pid {worker.pid})"
        try:
            cls = loads(creation.class_segments)
            args, kwargs = loads(creation.args_segments)
            args, kwargs = resolve_args(args, kwargs, worker.objects)
            where = f"{worker.actor_name}.__init__ (pid {worker.pid})"
            if inspect.iscoroutinefunction(getattr(cls, "__init__", None)):
                instance = cls.__new__(cls)
                init = instance.__init__(*args, **kwargs)
                return lambda: worker.background.spawn(finish_async(instance, init, where))
            worker.instance = cls(*args, **kwargs)
            reply = ActorStarted(True).to_wire()
        except BaseException as e:
            reply = _init_failed(e, where)
        return lambda: done.done() or done.set_result(reply)

    async def finish_async(instance, init, where):
        try:
            await init
            worker.instance = instance
            reply = ActorStarted(True).to_wire()
        except BaseException as e:
            reply = _init_failed(e, where)
        if not done.done():
            done.set_result(reply)

    runner.executor.submit(construct)
    return await done


def _init_failed(e: BaseException, where: str) -> dict:
    return ActorStarted(False, [bytes(s) for s in encode_error(e, where)]).to_wire()
