"""Remote classes: ``ActorClass`` (what ``@ddlf.remote`` makes of a class), ``ActorHandle``."""

from __future__ import annotations

import inspect
import uuid
from typing import Any

from ddlf_actors.runtime import context
from ddlf_actors.runtime.client.core import ActorSpec
from ddlf_actors.runtime.errors import ActorExit
from ddlf_actors.runtime.states import ActorState
from ddlf_actors.runtime.wire.serialization import dumps

from . import autoinit
from .errors import ActorNameTakenError
from .options import ACTOR_OPTIONS, BACKPRESSURE, METHOD_OPTIONS, validate
from .util import scheduling_strategies

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "exit_actor", "method"]

# A name can be freed between our failed reservation and our lookup (its holder died):
# try to create, then to look up, this many times before giving up.
_GET_IF_EXISTS_TRIES = 5


def method(*args, **kwargs):
    """Annotate an actor method, as ``@ray.method(...)`` does: ``@ddlf.method(num_returns=2)``
    makes each call return two refs (the method returns a tuple or list of 2 values).
    ``handle.m.options(num_returns=k)`` sets it per call. A generator method streams
    (``num_returns="streaming"``, the default for one) or returns one ref to all its refs
    (``"dynamic"``); ``_generator_backpressure_num_objects=n`` pauses it while ``n`` of
    its values wait unconsumed.
    """
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    if args:
        raise TypeError("use @ddlf.method(num_returns=k) on an actor method")
    unknown = set(kwargs) - METHOD_OPTIONS
    if unknown:
        raise NotImplementedError(
            f"@ddlf.method does not support {sorted(unknown)}: DDLF has no concurrency groups "
            f"or per-method retry options yet; {sorted(METHOD_OPTIONS)} are supported")
    validate(dict(kwargs), METHOD_OPTIONS, "@ddlf.method")
    n = kwargs.get("num_returns")

    def annotate(fn):
        if n is not None:
            fn.__ddlf_num_returns__ = n
        if kwargs.get(BACKPRESSURE) is not None:
            fn.__ddlf_backpressure__ = kwargs[BACKPRESSURE]
        return fn

    return annotate


def exit_actor():
    """End the current actor from inside one of its methods, on purpose (Ray's
    ``ray.actor.exit_actor``).

    The process exits once the replies already computed are sent; this call and any
    still queued fail with ``ActorDiedError`` at their callers, and the actor is not
    restarted whatever its ``max_restarts``. (``sys.exit(code)`` ends an actor too; a
    non-zero code counts as a crash and is restarted when ``max_restarts`` allows.)
    """
    ctx = context.current
    if ctx is None or not ctx.actor_id:
        raise TypeError("exit_actor() can only be called inside an actor method; to end an "
                        "actor from outside, use ddlf.kill(handle)")
    raise ActorExit()


class ActorClass:
    """A class decorated with ``@ddlf.remote``. Create actors with ``Cls.remote(...)``."""

    def __init__(self, cls: type, options: dict):
        self._cls = cls
        self._options = validate(dict(options), ACTOR_OPTIONS, f"actor class {cls.__name__}")
        self._spec: ActorSpec | None = None
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__doc__ = cls.__doc__

    def __call__(self, *args, **kwargs):
        raise TypeError(
            f"Actor class {self.__name__} cannot be instantiated directly. "
            f"Use {self.__name__}.remote(...) instead.")

    def _get_spec(self) -> ActorSpec:
        # The class is pickled once, on first use; every actor of it reuses the bytes.
        if self._spec is None:
            methods: dict[str, Any] = {}
            for name, fn in inspect.getmembers(self._cls, callable):
                if name.startswith("__") and name != "__call__":
                    continue
                methods[name] = inspect.iscoroutinefunction(fn)
                n = getattr(fn, "__ddlf_num_returns__", None)
                if n is None:   # a generator method streams unless told otherwise, as in Ray
                    n = "streaming" if (inspect.isgeneratorfunction(fn)
                                        or inspect.isasyncgenfunction(fn)) else 1
                bp = getattr(fn, "__ddlf_backpressure__", -1)
                if n != 1 or bp != -1:
                    # Opaque to the head; handles in any process read it from here.
                    methods[name] = {"is_async": methods[name], "num_returns": n,
                                     "backpressure": bp}
            segs = [bytes(s) for s in dumps(self._cls)]
            self._spec = ActorSpec(self._cls.__name__, segs, methods)
        return self._spec

    def options(self, **options) -> _BoundActorClass:
        merged = dict(self._options)
        merged.update(validate(options, ACTOR_OPTIONS, f"actor class {self.__name__}"))
        return _BoundActorClass(self, merged)

    def remote(self, *args, **kwargs) -> ActorHandle:
        return self._create(self._options, args, kwargs)

    def bind(self, *args, **kwargs):
        """A lazy actor for a DAG (``ddlf_actors.dag``): each ``execute()`` creates one."""
        from .dag.class_node import ClassNode

        return ClassNode(self, args, kwargs, self._options)

    def _create(self, options, args, kwargs) -> ActorHandle:
        if options.get("get_if_exists") and not options.get("name"):
            # Checked before autoinit.core(): a mistake must not start a cluster.
            raise ValueError("get_if_exists=True needs name=...: it returns the live actor of "
                             "that name, or creates one under it")
        core = autoinit.core()
        spec = self._get_spec()
        if options.get("get_if_exists"):
            return self._get_or_create(core, spec, options, args, kwargs)
        return self._create_new(core, spec, options, args, kwargs)

    def _create_new(self, core, spec, options, args, kwargs) -> ActorHandle:
        options = {k: v for k, v in options.items() if k != "get_if_exists"}
        options = scheduling_strategies.resolve(options)
        actor_id = uuid.uuid4().hex[:16]
        core.create_actor(actor_id, spec, args, kwargs, options)
        return ActorHandle(actor_id, spec.class_name, spec.methods)

    def _get_or_create(self, core, spec, options, args, kwargs) -> ActorHandle:
        """The live actor named ``options["name"]``, or a new one under that name.

        The head's name reservation is atomic, so of several racing creators one wins
        and the others get ``ActorNameTakenError``; they then look the winner up.
        """
        name = options["name"]
        for _ in range(_GET_IF_EXISTS_TRIES):
            view = core.head_call("get_actor", name)
            # A dead actor's name is free again (the head lets a new actor claim it).
            if view is not None and view.get("state") != ActorState.DEAD:
                return ActorHandle(view["actor_id"], view["class_name"], view["methods"] or {})
            try:
                return self._create_new(core, spec, options, args, kwargs)
            except ActorNameTakenError:
                continue
        raise ActorNameTakenError(
            f"get_if_exists: the name {name!r} kept changing hands (taken, then gone) "
            f"{_GET_IF_EXISTS_TRIES} times; retry, or use a name no short-lived actor holds")

    def __repr__(self):
        return f"ActorClass({self.__module__}.{self.__qualname__})"


class _BoundActorClass:
    def __init__(self, actor_class: ActorClass, options: dict):
        self._actor_class = actor_class
        self._options = options

    def remote(self, *args, **kwargs) -> ActorHandle:
        return self._actor_class._create(self._options, args, kwargs)

    def bind(self, *args, **kwargs):
        from .dag.class_node import ClassNode

        return ClassNode(self._actor_class, args, kwargs, self._options)


class ActorMethod:
    __slots__ = ("_handle", "_name", "_num_returns", "_backpressure")

    def __init__(self, handle: ActorHandle, name: str, num_returns: int | str | None = None,
                 backpressure: int | None = None):
        self._handle = handle
        self._name = name
        info = handle._methods.get(name)
        info = info if isinstance(info, dict) else {}
        self._num_returns = info.get("num_returns", 1) if num_returns is None else num_returns
        self._backpressure = info.get("backpressure", -1) if backpressure is None else backpressure

    def remote(self, *args, **kwargs):
        h = self._handle
        return autoinit.core().submit_actor_call(h._actor_id, h._class_name, self._name, args,
                                                 kwargs, self._num_returns, self._backpressure)

    def bind(self, *args, **kwargs):
        """A lazy call of this method for a DAG (``ddlf_actors.dag``), on this actor."""
        from .dag.class_node import ClassMethodNode

        h = self._handle
        info = h._methods.get(self._name)
        default = info.get("num_returns", 1) if isinstance(info, dict) else 1
        options = {} if self._num_returns == default else {"num_returns": self._num_returns}
        return ClassMethodNode(h, self._name, args, kwargs, options)

    def options(self, **options) -> ActorMethod:
        """This method with per-call options (``num_returns``,
        ``_generator_backpressure_num_objects``), as in Ray."""
        validate(options, METHOD_OPTIONS, f"method {self._handle._class_name}.{self._name}")
        return ActorMethod(self._handle, self._name,
                           options.get("num_returns", self._num_returns),
                           options.get(BACKPRESSURE, self._backpressure))

    def __call__(self, *args, **kwargs):
        raise TypeError(
            f"Actor methods cannot be called directly. Use "
            f"{self._handle._class_name}.{self._name}.remote(...) instead "
            f"(e.g. handle.{self._name}.remote()).")


class ActorHandle:
    """A reference to a live actor; pass it to other actors and tasks freely."""

    def __init__(self, actor_id: str, class_name: str, methods: dict):
        self._actor_id = actor_id
        self._class_name = class_name
        self._methods = methods
        self._method_cache: dict = {}

    def __getattr__(self, name: str) -> ActorMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._methods:
            raise AttributeError(f"actor class {self._class_name} has no method {name!r}")
        m = self._method_cache.get(name)
        if m is None:
            m = self._method_cache[name] = ActorMethod(self, name)
        return m

    def __reduce__(self):
        return (ActorHandle, (self._actor_id, self._class_name, self._methods))

    def __eq__(self, other):
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __hash__(self):
        return hash(self._actor_id)

    def __repr__(self):
        return f"ActorHandle({self._class_name}, {self._actor_id})"
