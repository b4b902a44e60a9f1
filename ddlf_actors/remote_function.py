"""Remote functions: what ``@ddlf.remote`` makes of a function. Call ``fn.remote(...)``."""

from __future__ import annotations

import inspect
import os

from ddlf_actors.runtime.wire.serialization import dumps

from . import autoinit
from .options import TASK_OPTIONS, validate
from .util import scheduling_strategies

__all__ = ["RemoteFunction"]


class RemoteFunction:
    def __init__(self, fn, options: dict):
        self._fn = fn
        self._options = validate(dict(options), TASK_OPTIONS, f"remote function {fn.__name__}")
        if "num_returns" not in self._options and (
                inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)):
            self._options["num_returns"] = "streaming"   # Ray's default for a generator (2.8+)
        self._fn_id = os.urandom(16)
        self._segments: list | None = None
        self.__name__ = fn.__name__
        self.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
        self.__module__ = fn.__module__
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        raise TypeError(
            f"Remote function {self.__name__} cannot be called directly. "
            f"Use {self.__name__}.remote(...) instead.")

    def _code(self) -> list:
        # Pickled once; shipped to each worker connection once ("methods are shipped once").
        if self._segments is None:
            self._segments = [bytes(s) for s in dumps(self._fn)]
        return self._segments

    def options(self, **options) -> _BoundRemoteFunction:
        merged = dict(self._options)
        merged.update(validate(options, TASK_OPTIONS, f"remote function {self.__name__}"))
        return _BoundRemoteFunction(self, merged)

    def remote(self, *args, **kwargs):
        return self._submit(self._options, args, kwargs)

    def bind(self, *args, **kwargs):
        """A lazy call for a DAG (``ddlf_actors.dag``): nothing runs until ``execute()``."""
        from .dag.function_node import FunctionNode

        return FunctionNode(self, args, kwargs, self._options)

    def _submit(self, options, args, kwargs):
        core = autoinit.core()
        return core.submit_task(self._fn_id, self._code(), self.__name__, args, kwargs,
                                scheduling_strategies.resolve(options))

    def __repr__(self):
        return f"RemoteFunction({self.__module__}.{self.__qualname__})"


class _BoundRemoteFunction:
    def __init__(self, fn: RemoteFunction, options: dict):
        self._fn = fn
        self._options = options

    def remote(self, *args, **kwargs):
        return self._fn._submit(self._options, args, kwargs)

    def bind(self, *args, **kwargs):
        from .dag.function_node import FunctionNode

        return FunctionNode(self._fn, args, kwargs, self._options)
