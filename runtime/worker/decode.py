"""From a ``CALL`` frame to a :class:`~call.Call`: the body decoded once into its spec
(runtime/wire/callspec.py), the code to run found, the arguments resolved.

Arguments are resolved here, on the loop, in frame order: a ``FREE`` frame that follows
a call on its connection must not drop an object the call still needs.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, NamedTuple

from ..client.dependencies import resolve_args
from ..wire.callspec import CallSpec, TaskSpec
from ..wire.serialization import loads
from .call import Call

if TYPE_CHECKING:
    from ..wire.connection import Connection

__all__ = ["CallDecoder"]


class _Method(NamedTuple):
    """An actor method as calls to it need it, looked up once per name."""

    fn: object
    name: str                 # "Counter.incr"
    where: str                # "Counter.incr (pid 12)"
    on_loop: bool             # an async def: runs on the event loop
    on_loop_streaming: bool   # an async generator: streams from the event loop


class CallDecoder:
    """Decodes the calls one worker receives; holds the code they run.

    ``functions`` is task code shipped by callers (``FUNC`` frames, by function id), loaded
    on first use; ``methods`` caches an actor's bound methods by name.
    """

    def __init__(self, worker):
        self.worker = worker
        self.functions: dict[bytes, list] = {}   # function id -> shipped segments
        self.loaded: dict[bytes, object] = {}    # function id -> the function
        self.methods: dict[str, _Method] = {}    # an actor's methods by name

    def actor_call(self, conn: Connection, msg_id: int, segs) -> Call | None:
        """The actor method call a CALL frame asks for; None if it cannot run (its error
        is sent)."""
        w = self.worker
        try:
            spec = CallSpec.from_wire(loads(segs[1:]))
            args, kwargs = resolve_args(spec.args, spec.kwargs, w.objects)
            spec.args = spec.kwargs = None   # the Call holds them, until its code has them
            if w.instance is None:
                raise RuntimeError(f"actor {w.actor_name} is not constructed")
            method = self.methods.get(spec.method)
            if method is None:
                method = self.methods[spec.method] = self._method(spec.method)
        except BaseException as e:
            w.runner.fail(conn, msg_id, e, f"{w.actor_name} (pid {w.pid})")
            return None
        return Call(conn, msg_id, spec, method.fn, args, kwargs, method.name, method.where,
                    False, method.on_loop_streaming if spec.streaming else method.on_loop)

    def _method(self, name: str) -> _Method:
        w = self.worker
        fn = getattr(w.instance, name)
        full = f"{w.actor_name}.{name}"
        return _Method(fn, full, f"{full} (pid {w.pid})", inspect.iscoroutinefunction(fn),
                       inspect.isasyncgenfunction(fn))

    def task_call(self, conn: Connection, msg_id: int, segs) -> Call | None:
        """The task a CALL frame asks for; None if it cannot run (its error is sent)."""
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
        return Call(conn, msg_id, spec, fn, args, kwargs, fn_name, f"task {fn_name} (pid {w.pid})",
                    True, not spec.streaming and inspect.iscoroutinefunction(fn))
