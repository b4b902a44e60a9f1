"""From a ``CALL`` frame to a :class:`~call.Call`: the body decoded once into its spec
(runtime/callspec.py), the code to run found, the arguments resolved.

Arguments are resolved here, on the loop, in frame order: a ``FREE`` frame that follows
a call on its connection must not drop an object the call still needs.
"""

from __future__ import annotations

import inspect

from ..callspec import CallSpec, TaskSpec
from ..dependencies import resolve_args
from ..serialization import loads
from .call import Call

__all__ = ["CallDecoder"]


class CallDecoder:
    """Decodes the calls one worker receives; holds the code they run.

    ``functions`` is task code shipped by callers (``FUNC`` frames, by function id), loaded
    on first use; ``methods`` caches an actor's bound methods by name.
    """

    def __init__(self, worker):
        self.worker = worker
        self.functions: dict[bytes, list] = {}   # function id -> shipped segments
        self.loaded: dict[bytes, object] = {}    # function id -> the function
        self.methods: dict[str, tuple] = {}      # name -> (method, is coroutine fn, is async gen fn)

    def decode(self, conn, msg_id: int, segs) -> Call | None:
        """The call a CALL frame asks for; None if it cannot run (its error is sent)."""
        if self.worker.is_actor:
            return self._actor_call(conn, msg_id, segs)
        return self._task_call(conn, msg_id, segs)

    def _actor_call(self, conn, msg_id, segs) -> Call | None:
        w = self.worker
        try:
            spec = CallSpec.from_wire(loads(segs[1:]))
            args, kwargs = resolve_args(spec.args, spec.kwargs, w.objects)
            spec.args = spec.kwargs = None   # the Call holds them, until its code has them
            if w.instance is None:
                raise RuntimeError(f"actor {w.actor_name} is not constructed")
            entry = self.methods.get(spec.method)
            if entry is None:
                fn = getattr(w.instance, spec.method)
                entry = self.methods[spec.method] = (
                    fn, inspect.iscoroutinefunction(fn), inspect.isasyncgenfunction(fn))
            fn, is_coroutine, is_async_gen = entry
        except BaseException as e:
            w.runner.fail(conn, msg_id, e, f"{w.actor_name} (pid {w.pid})")
            return None
        name = f"{w.actor_name}.{spec.method}"
        return Call(conn, msg_id, spec, fn, args, kwargs, name=name,
                    where=f"{name} (pid {w.pid})", is_task=False,
                    on_loop=is_async_gen if spec.streaming else is_coroutine)

    def _task_call(self, conn, msg_id, segs) -> Call | None:
        w = self.worker
        fn_name = "task"
        try:
            spec = TaskSpec.from_wire(loads(segs[1:]))
            fn_name = spec.fn_name
            fn = self.loaded.get(spec.fn_id)
            if fn is None:
                code = self.functions.get(spec.fn_id)
                if code is None:
                    raise RuntimeError(
                        f"task code {spec.fn_id.hex()} was never shipped to this worker")
                fn = self.loaded[spec.fn_id] = loads(code)
            args, kwargs = resolve_args(spec.args, spec.kwargs, w.objects)
            spec.args = spec.kwargs = None
        except BaseException as e:
            w.runner.fail(conn, msg_id, e, f"task {fn_name} (pid {w.pid})")
            return None
        # A generator task runs on a thread even when it is an async one (driven there on
        # a private event loop): the worker's loop only does I/O.
        return Call(conn, msg_id, spec, fn, args, kwargs, name=fn_name,
                    where=f"task {fn_name} (pid {w.pid})", is_task=True,
                    on_loop=not spec.streaming and inspect.iscoroutinefunction(fn))
